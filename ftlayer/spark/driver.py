"""The driver side of ftlayer.spark: :class:`FaultTolerance` claims replays, applies
backpressure, runs batches and drains. Every pipeline runs on the vectorized machinery
(row stages compiled by ftlayer.spark.row_stages) except ``ack_scope="task"`` ones, which
run row by row over ``df.rdd`` (ftlayer.spark.row_tasks).

::

    ft = FaultTolerance(FTConfig(namespace="orders", redis_url=url))
    pipeline = ft.pipeline(key=["customer"]).map(price).partition_by(["customer"], 8).sink(write)
    query = stream.writeStream.foreachBatch(pipeline).start()
    ...
    report = ft.drain(timeout_s=60, query=query)

Invariants:

* A batch function returns only after every task of its Spark job finished and the batch
  settled (``ack_scope="task"``: every task flushed), so Spark commits the batch's offsets
  only when each of its records is complete or persisted with a live timeout (invariant
  1). A task that raises before its summary (flush) counts sent nothing; Spark's retry of
  the task redoes it.
* Every source record is acked only after its stages returned and the sink's write
  returned. A failing record (``FailRecord``, or any exception with
  ``on_error="fail_record"``) is failed with its error text in its failure history, and
  replayed under a new id (at once in its source task, or in a later batch), or
  dead-lettered after ``max_replays``.
* Replays enter the source stage of a later batch at the partition where Spark places
  their key (see :class:`Pipeline`); a record is never acked to make a problem go away.
* Only msgpack and Arrow IPC segments reach Redis. Executors reach Redis directly at
  ``config.redis_url`` through a per-worker-process cache; no live client is pickled.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from ftlayer.layer import FTLayer
from ftlayer.persistence import DeadLetter
from ftlayer.sources import claim_source, source_identity
from ftlayer.spark.batch_plan import arrow_schema, with_replay_columns, without_replay_columns
from ftlayer.spark.engine import BatchEngine
from ftlayer.spark.pipeline import AckScope, OnError, Pipeline, ReplayFrom, new_pipeline
from ftlayer.spark.policy import DEFAULT_POLICY, ErrorPolicy
from ftlayer.spark.preflight import preflight
from ftlayer.spark.progress import BatchProgress, ProgressListener
from ftlayer.spark.results import BatchResult, DrainResult
from ftlayer.spark.vector_plan import SRC_COL
from ftlayer.unreplayed import Unreplayed

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["FaultTolerance"]

log = logging.getLogger(__name__)


def _rebuild(config: FTConfig, replay_limit: int, backpressure_timeout_s: float) -> Any:
    return FaultTolerance(
        config, replay_limit=replay_limit, backpressure_timeout_s=backpressure_timeout_s
    )


def _check_key(key: tuple[str, ...], schema: Any) -> None:
    names = schema.fieldNames()
    missing = [c for c in key if c not in names]
    if missing:
        raise ConfigError(f"key columns {missing} are not in the input {names}")
    for c in key:
        kind = schema[c].dataType.simpleString()
        if "map<" in kind:
            raise ConfigError(f"key column {c!r} has type {kind}: Spark cannot hash maps")


class FaultTolerance:
    """The driver side: claims replays, applies backpressure, runs batches, drains.

    ``FaultTolerance(config)`` opens the FT layer (``config.redis_url``, or an embedded
    Redis whose URL is handed to the executors). ``rotate=True`` runs the timeout rotation
    in this process (when no ``ftlayer serve`` sidecar does). With ``status="off"`` no Redis
    is used and the same pipelines run on the no-op handler.

    ``config``: the FTConfig of the driver and, pickled into every task, of the executors;
    ``layer``: an open FTLayer to use instead of opening one (``close()`` leaves it open);
    ``replay_limit``: the most replays a batch (or a trigger of the replay stream) claims,
    the rest waiting for later batches; ``backpressure_timeout_s``: seconds a batch waits
    for room under ``config.max_pending`` before it runs anyway (logged).
    """

    def __init__(
        self,
        config: FTConfig,
        *,
        layer: FTLayer | None = None,
        rotate: bool = False,
        replay_limit: int = 10_000,
        backpressure_timeout_s: float = 30.0,
    ) -> None:
        self.config = config
        self.replay_limit = replay_limit
        self.backpressure_timeout_s = backpressure_timeout_s
        self.layer: FTLayer | None = None
        self.results: list[BatchResult] = []
        self._listener: ProgressListener | None = None
        self._last: tuple[Pipeline, SparkSession, Any] | None = None
        self._rotator: Any = None
        self._owns_layer = layer is None
        self._owned: set[tuple[int, str]] = set()  # (source, identity) checked in Redis
        self._unreplayed = Unreplayed()  # streaming queries without the replay stream
        self.task_config = config
        if config.enabled:
            self.layer = (layer or FTLayer.open(config)).be_patient(config.driver_wait_s)
            url = config.redis_url or (self.layer.embedded.url if self.layer.embedded else None)
            if not url:
                raise ConfigError("executors need config.redis_url to reach Redis")
            self.task_config = replace(config, redis_url=url)
            if rotate:
                self._rotator = self.layer.start_rotator()
        self.engine = BatchEngine(self.layer, self.task_config, replay_limit,
                                  backpressure_timeout_s)  # fmt: skip
        log.info("fault tolerance ready %s", config.summary())

    # -- progress where Spark users look (ftlayer.spark.progress) ----------------------------
    def install_progress_listener(self, spark: SparkSession, keep: int = 100) -> None:
        """Join Spark's streaming progress with this object's batch results (classic
        Spark): ``recent_progress`` / ``last_progress`` then hold both, per micro-batch."""
        if self._listener is None:
            self._listener = ProgressListener(self.results, keep).install(spark)

    @property
    def recent_progress(self) -> list[BatchProgress]:
        return [] if self._listener is None else list(self._listener.recent)

    @property
    def last_progress(self) -> BatchProgress | None:
        recent = self.recent_progress
        return recent[-1] if recent else None

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled, a FaultTolerance travels as its config and rebuilds itself where it
        lands, with its own Redis client (Spark Connect runs a ``foreachBatch`` function
        in a Python process of the server). The copy reports its batches there; it never
        rotates (the original, or a sidecar, does)."""
        return (_rebuild, (self.task_config, self.replay_limit, self.backpressure_timeout_s))

    def pipeline(
        self,
        source: int = 0,
        key: Sequence[str] | str = (),
        partitions: int | None = None,
        on_error: OnError = "fail_record",
        immediate_replays: int | None = None,
        ack_scope: AckScope = "batch",
        errors: ErrorPolicy | None = None,
        on_dead_letter: Callable[[DeadLetter], None] | None = None,
        record_key: str | None = None,
        name: str | None = None,
        reads: Any = None,
        replay_from: ReplayFrom = "stage",
    ) -> Pipeline:
        """A new pipeline reading source ``source``; see :class:`Pipeline` (``errors``:
        ftlayer.spark.policy.ErrorPolicy for its stages; ``on_dead_letter``: called on
        the driver with each record of this source that is dead-lettered; ``record_key``:
        an int64 id column the stages keep, carried instead of ftlayer's own id column).

        ``source``: the source's index (0..65534), which its records, replays and dead
        letters are filed under: one pipeline per source and namespace; ``key``: columns
        that place the source stage's records, fresh and replayed alike: with
        ``partitions`` it runs on ``df.repartition(partitions, *key)``, so every record of a
        key meets in one partition (without, only ``ack_scope="task"`` uses them: replays
        go where their hash code says); ``partitions``: that repartition's partition count
        (needs ``key``); ``on_error``: ``"fail_record"`` fails only the records whose stage
        raised (replayed, then dead-lettered), ``"fail_batch"`` lets the exception fail the
        task (Spark retries it, then the batch fails), the records neither acked nor failed;
        ``replay_from``: ``"stage"`` (a failed row's replay starts where it failed) or
        ``"source"`` (Storm's rule: from its source record, every stage again)."""
        if ack_scope == "task":
            from ftlayer.spark.task_scope import DEPRECATION

            warnings.warn(DEPRECATION, FutureWarning, stacklevel=2)
        return new_pipeline(self, source, key, partitions, on_error, immediate_replays,
                            ack_scope, errors or DEFAULT_POLICY, on_dead_letter, record_key,
                            reads, name, replay_from)  # fmt: skip

    # -- replays as a stream (ftlayer.spark.replay_stream) ----------------------------------
    def with_replays(
        self, pipeline: Pipeline, stream: DataFrame | None, spark: SparkSession
    ) -> DataFrame:
        """``stream`` (None: the stream of ``pipeline.reads``, its rows with their
        references) unioned with the replay stream of ``pipeline``'s source (see
        :meth:`Pipeline.with_replays`). With FT off, the stream itself."""
        from ftlayer.spark.references import with_references
        from ftlayer.spark.replay_stream import replay_stream

        if stream is None:
            stream = pipeline.reads.stream(spark)
            schema = stream.schema
            if self.layer is not None:
                stream = with_references(pipeline.reads, stream, scanned=True)
        else:
            schema = stream.schema
        if not stream.isStreaming:
            raise ConfigError("with_replays takes a streaming DataFrame (spark.readStream...)")
        if pipeline.ack_scope != "batch":
            raise ConfigError("with_replays needs the default ack_scope='batch'")
        if self.layer is None:
            return stream
        self._own(pipeline, schema, spark)
        by_ref = pipeline.reads is not None
        replays = replay_stream(spark, self.task_config, pipeline.source, schema,
                                self.replay_limit, by_reference=by_ref,
                                carries_rows=not (by_ref or pipeline.frames))  # fmt: skip
        return with_replay_columns(stream).unionByName(replays)

    def dead_letter_rows(self, pipeline: Pipeline, spark: SparkSession) -> Any:
        """The dead letters of ``pipeline``'s source as a pyarrow Table of the source's
        columns (those kept by reference read back from ``pipeline.reads``; a reference
        that no longer resolves leaves its columns null) with ``__ft_src`` (the dead
        letter's id, as ``ftlayer dlq show`` takes it), ``attempts`` and ``error`` (the
        last one). For operators and reports, on the driver: dead letters are few."""
        from ftlayer.spark.intake import dead_letter_table

        if self.layer is None:
            return None
        reads = pipeline.reads
        user = reads.stream(spark).schema if reads is not None else self._spark_schema()[1]
        return dead_letter_table(self.layer, pipeline.source, arrow_schema(user, spark),
                                 reads, spark)  # fmt: skip

    def _own(self, pipeline: Pipeline, schema: Any, spark: SparkSession) -> None:
        """Refuse to run a source another pipeline owns (ftlayer.sources), once the
        application passed its preflight (ftlayer.spark.preflight)."""
        preflight(spark, self.layer)
        if self.layer is None:
            return
        app = "" if pipeline.name is not None else spark.conf.get("spark.app.name", "")
        identity = source_identity(pipeline.identity(app or ""), schema, pipeline.reads)
        if (pipeline.source, identity) not in self._owned:
            claim_source(self.layer.client, self.config.namespace, pipeline.source, identity)
            self._owned.add((pipeline.source, identity))

    # -- one batch ----------------------------------------------------------------------
    def run_batch(self, pipeline: Pipeline, df: DataFrame, batch_id: Any) -> BatchResult:
        """Run one micro-batch (fresh rows of ``df`` + its replays) to the end: through
        the batch engine's phases (ftlayer.spark.engine), ``ack_scope="task"`` through
        ftlayer.spark.task_scope.

        Returns after the batch settled. Raises if the Spark job fails (the replays then
        time out and come back; Spark re-runs the batch's fresh rows)."""
        if not pipeline.sunk:
            raise ConfigError("the pipeline has no sink: end it with .sink(fn)")
        _check_key(pipeline.key, df.schema)
        schema = without_replay_columns(df.schema)  # the source's own columns
        self._own(pipeline, schema, df.sparkSession)
        self._unreplayed.seen(self.layer, pipeline.source,
                              pipeline.name or f"source {pipeline.source}",
                              SRC_COL in df.columns, lambda: streaming_query(df))  # fmt: skip
        if pipeline.ack_scope == "task":
            from ftlayer.spark.task_scope import run_task_scope

            self._last = (pipeline, df.sparkSession, df.schema)
            result = run_task_scope(self.engine, pipeline, df, batch_id)
        else:
            self._last = (pipeline, df.sparkSession, schema)
            result = self.engine.run(pipeline, df, batch_id)
        self.results.append(result)
        return result

    # -- the end ------------------------------------------------------------------------
    def drain(
        self,
        timeout_s: float = 60.0,
        query: StreamingQuery | None = None,
        pipeline: Pipeline | None = None,
    ) -> DrainResult:
        """Wait until nothing is pending, running replays through ``pipeline`` (default:
        the last one run) in extra batches; expire timeouts as it waits. Stops ``query``
        first if given. What is still pending at the deadline is reported, not dropped."""
        from ftlayer.spark.drain import drain

        if query is not None:
            query.stop()
        def last() -> tuple[Pipeline, SparkSession, Any] | None:
            return self._last if pipeline is None else (pipeline, *self._spark_schema())

        return drain(self.layer, self.engine, self.run_batch, last, timeout_s)

    def _spark_schema(self) -> tuple[SparkSession, Any]:
        if self._last is None:
            raise ConfigError("drain(pipeline=...) needs a batch run first (for its schema)")
        return self._last[1], self._last[2]

    def close(self) -> None:
        """Stop the rotator and the progress listener and, if this object opened it, the
        FT layer."""
        if self._listener is not None:
            self._listener.uninstall()
            self._listener = None
        if self._rotator is not None:
            self._rotator.stop()
            self._rotator = None
        if self.layer is not None and self._owns_layer:
            self.layer.close()

    def __enter__(self) -> FaultTolerance:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def streaming_query(df: DataFrame) -> str | None:
    """The id of the streaming query whose ``foreachBatch`` runs this batch: Spark sets it
    as a local property of the query's thread (None: not in one, or not known -- Spark
    Connect has no SparkContext here)."""
    try:
        return df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # noqa: BLE001 -- Connect: no SparkContext; saying nothing is safe
        return None
