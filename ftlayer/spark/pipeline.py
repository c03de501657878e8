"""The :class:`Pipeline` builder: stages, keyed shuffles and a sink, as plain data.

It never imports the driver (ftlayer.spark.driver): a pipeline holds whatever runs its
batches (:class:`BatchRunner`), so builder and driver have no import circle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from ftlayer.errors import ConfigError
from ftlayer.limits import MAX_REPLAYS
from ftlayer.spark.plan import BatchStage, FrameStage, Op, RowFn, Segment
from ftlayer.spark.policy import DEFAULT_POLICY, ErrorPolicy
from ftlayer.spark.stopping import stop_told
from partitioners import HashPartitioner

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["AckScope", "BatchRunner", "OnError", "Pipeline", "ReplayFrom", "new_pipeline"]

OnError = Literal["fail_record", "fail_batch"]
AckScope = Literal["batch", "task"]
ReplayFrom = Literal["stage", "source"]


class BatchRunner(Protocol):
    """What runs a pipeline's batches (``FaultTolerance``)."""

    def run_batch(self, pipeline: Pipeline, df: DataFrame, batch_id: Any) -> Any: ...

    def with_replays(
        self, pipeline: Pipeline, stream: DataFrame | None, spark: Any
    ) -> DataFrame: ...

    def dead_letter_rows(self, pipeline: Pipeline, spark: Any) -> Any: ...


@dataclass(frozen=True)
class Pipeline:
    """A pipeline for ``foreachBatch``: source stage, stages, optional keyed shuffles,
    sink. Immutable: each builder method returns a new Pipeline. Call it as
    ``pipeline(df, batch_id)`` (it *is* a foreachBatch function).

    Three kinds of stages: *DataFrame stages* (``transform``, ``sink_dataframe``) are
    Spark code run as the batch's own plan (ftlayer.spark.frame_run); *batch stages*
    (``map_batches``, ``map_pandas``, ``sink_batches``) take an Arrow batch, and mix with
    DataFrame stages; *row stages* (``map``, ``flat_map``, ``filter``, ``sink``) take one
    record (a dict) at a time, in a pipeline of their own. Batch and row stages run in
    ``mapInArrow`` tasks with Spark's own shuffle and batch-scope acking (row stages are
    compiled to batch stages by ftlayer.spark.row_stages); all run under Spark Connect.
    ``ack_scope="task"`` (deprecated) runs row stages the older way: over ``df.rdd``.

    Vectorized placement: ``partition_by(cols, n)`` is ``repartition(n, *cols)`` in the
    JVM, and replays enter the source stage as rows like any other, so every record of a
    key, fresh or replayed, meets in the partition Spark assigns that key.

    ``ack_scope="task"`` (deprecated) places records its own way: ftlayer.spark.task_scope.
    """

    ft: BatchRunner
    source: int = 0
    key: tuple[str, ...] = ()
    partitions: int | None = None
    on_error: OnError = "fail_record"
    immediate_replays: int | None = None
    """How many times a fresh row failing in a Python stage is replayed at once in the task
    that holds it, at its stage, before or after a shuffle (None: up to ``max_replays``; 0:
    every failure waits in the replay queue for a later batch, which spreads attempts out
    in time)."""
    ack_scope: AckScope = "batch"
    """``"batch"``: a batch's records are settled together when it ends (Redis touched
    O(tasks) times on the success path). ``"task"`` (deprecated; row stages only): every
    task emits and acks its records in Redis as it runs, O(records) Redis work."""
    errors: ErrorPolicy = DEFAULT_POLICY
    """Retries with backoff, and exception types that go straight to the dead letters,
    for every stage without its own ``errors=`` (see ftlayer.spark.policy)."""
    on_dead_letter: Callable[[Any], None] | None = None
    """Called on the driver with each :class:`~ftlayer.persistence.DeadLetter` of this
    pipeline's source, after the batch that dead-lettered it (or, for one dead-lettered
    by the sidecar's timeouts, after the next batch): at least once, in order."""
    record_key: str | None = None
    """Batch stages: an int64 column that identifies each source record (an event id),
    non-negative, that every stage passes through unchanged. ftlayer then folds and
    reports failures by it instead of adding its own id column to every row crossing a
    shuffle (one int64 column costs 5-9 % of a shuffle-bound pipeline, see
    docs/vectorized.md). A row whose key is null or negative is dead-lettered at the
    source with an error naming it; a stage whose output changes a row's key fails its
    task. Keys need not be unique: rows sharing a key share the fate of any of them
    failing after a shuffle (all replay: at least once, never lost)."""
    reads: Any = None
    """A source Spark can read again (ftlayer.spark.references.ReplayableSource, e.g. a
    FileSource): its rows are kept by reference, not copied into Redis, and replays are
    read back from it. Start its stream with :meth:`stream`."""
    replay_from: ReplayFrom = "stage"
    """Where a failed row's replay starts. ``"stage"``: where it failed -- retried at once
    in the task that holds it, then, kept as the input of the segment it failed in, it
    enters there (the source not read again, the stages before that segment not run
    again; with ``record_key``, failures past a shuffle go back to the source).
    ``"source"``: Storm's rule, from its source record through every stage (for stages
    before the failing one that must run again); past a shuffle nothing is retried at
    once."""
    name: str | None = None
    """The pipeline's name, stored with its source the first time it runs: another
    pipeline (another name, or another source schema) on the same namespace and source is
    refused, so two jobs never take each other's replays (ftlayer.sources). None: named
    after the Spark application (``spark.app.name``)."""
    segments: tuple[Segment, ...] = (Segment(()),)
    sunk: bool = False

    def identity(self, app_name: str) -> str:
        """Its name, or the Spark application's: kept by a redeployed job, not shared."""
        return self.name if self.name is not None else f"app:{app_name}"

    def stream(self, spark: Any) -> DataFrame:
        """The stream of the pipeline's ``reads=`` source, its rows kept by reference,
        with the pipeline's replays: ``pipeline.stream(spark).writeStream.foreachBatch(
        pipeline)``."""
        if self.reads is None:
            raise ConfigError("stream() needs ft.pipeline(reads=<a FileSource or another "
                              "ReplayableSource>); for any other stream use with_replays()")
        return self.ft.with_replays(self, None, spark)

    def dead_letters(self, spark: Any) -> Any:
        """The dead letters of this pipeline's source, with the source's columns (read
        back where kept by reference), their attempts and last error: a pyarrow Table."""
        return self.ft.dead_letter_rows(self, spark)

    def with_replays(self, stream: DataFrame) -> DataFrame:
        """``stream`` (the source's streaming DataFrame) with this pipeline's replays: Spark
        then runs a micro-batch whenever replays are queued, new input or not, and a
        re-run batch reads the same replays (offsets in the checkpoint). Run it with this
        pipeline: ``pipeline.with_replays(stream).writeStream.foreachBatch(pipeline)``
        (ftlayer.spark.replay_stream)."""
        return self.ft.with_replays(self, stream, stream.sparkSession)

    @property
    def vectorized(self) -> bool:  # it has batch stages
        return any(seg.vectorized for seg in self.segments)

    @property
    def frames(self) -> bool:
        """It has DataFrame stages: its batches run as one Spark plan (frame_run)."""
        return any(seg.frames for seg in self.segments)

    def map_batches(
        self, fn: Callable[..., Any], schema: Any, errors: ErrorPolicy | None = None
    ) -> Pipeline:
        """A vectorized stage: ``fn(batch: pyarrow.RecordBatch)`` returns the output
        batch with ``schema`` (DDL string or StructType), or an ``Outcome`` naming failed
        rows, fan-out parents and (sinks) unconfirmed rows. A row that makes ``fn`` raise
        is isolated by bisection and fails alone (see ftlayer.spark.outcome). ``fn(batch,
        ctx)`` receives a :class:`~ftlayer.spark.policy.BatchContext`; ``errors``: this
        stage's error policy (default: the pipeline's)."""
        return _with_op(self, ("batches", BatchStage(fn, schema, errors=errors)))

    def map_pandas(
        self, fn: Callable[..., Any], schema: Any, errors: ErrorPolicy | None = None
    ) -> Pipeline:
        """``map_batches`` with pandas: ``fn(pandas.DataFrame)`` returns a DataFrame
        (or an ``Outcome`` whose ``output`` is one). ``schema``: the output's (DDL string or
        StructType); ``errors``: this stage's error policy (default: the pipeline's)."""
        return _with_op(self, ("batches", BatchStage(fn, schema, pandas=True, errors=errors)))

    def sink_batches(
        self,
        fn: Callable[..., Any],
        pandas: bool = False,
        errors: ErrorPolicy | None = None,
        lineage: str | None = None,
    ) -> Pipeline:
        """The last stage, vectorized: ``fn(batch)`` writes a batch (a pandas DataFrame
        with ``pandas=True``). Its rows are acked when ``fn`` returns; it may return an
        ``Outcome(failed=..., unconfirmed=...)`` for rows whose writes failed or were not
        confirmed (those stay pending, time out and replay). ``lineage``: a column name;
        each row is given its record's lineage id (int64) in it -- the same in every
        replay, for a sink that keeps one row per record (ftlayer.sinks). Default: the
        sink's own ``ft_lineage`` attribute (the sinks ftlayer ships have one). ``errors``:
        this stage's error policy (default: the pipeline's)."""
        _open(self)
        if self.ack_scope == "task":
            raise ConfigError("ack_scope='task' runs row stages only: end it with sink()")
        if self.segments[-1].ops and not self.vectorized and not self.frames:
            raise ConfigError("sink_batches ends a pipeline of batch stages; use sink()")
        return _ending(self, sink=fn, sink_per="batch", sink_pandas=pandas, sink_errors=errors,
                            sink_lineage=_lineage_of(fn, lineage))  # fmt: skip

    def transform(
        self, fn: Callable[[DataFrame], DataFrame], failed: Any = None, errors: Any = None
    ) -> Pipeline:
        """A DataFrame stage: ``fn(df) -> DataFrame`` is ordinary Spark (expressions, SQL,
        joins with static tables), run in the JVM. ``fn`` must keep ftlayer's identity
        columns (``__ft_loc``, ``__ft_pos``) as they are -- ``withColumn``, ``select("*",
        ...)``, filters, joins and ``repartition`` do; a stage that drops, recomputes or
        aggregates them is refused, named.

        ``failed``: a boolean Column of fn's output marking the rows that fail (a
        ``try_cast`` that gave null, a lookup that found nothing): a Column, an SQL
        expression string, or a function of fn's output giving one. Failed rows leave the
        batch and are replayed later, or dead-lettered past ``max_replays``, with their
        error: ``errors``, a Column of fn's output or one text (default: the stage's
        name). Rows ``fn`` filters out are complete. The batch runs as one Spark plan
        (ftlayer.spark.frame_run): a source kept by reference (``reads=``) adds no Python;
        one that cannot be read again is copied by one Python pass. Python batch stages
        mix in; see docs/dataframe-stages.md."""
        _check_transform(fn, failed, errors)
        return _with_op(self, ("frame", FrameStage(fn, failed, errors)))

    def sink_dataframe(
        self,
        fn: Callable[[DataFrame, Any], Any],
        with_ids: bool = False,
        lineage: str | None = None,
    ) -> Pipeline:
        """The last stage, a DataFrame writer: ``fn(df, batch_id)`` writes ``df`` (the
        rows that reached the sink, the pipeline's columns only; ftlayer's identity
        columns too with ``with_ids=True``) with any action: ``df.write...save()``,
        ``saveAsTable``, JDBC, a ``MERGE``. The rows are acked when ``fn`` returns; if it
        raises, every record of the batch fails and replays (Spark retried the write's
        failed tasks first: ``spark.task.maxFailures``). A batch run again after a crash
        writes its rows again, and a replayed record comes back in a later batch: give
        the rows their lineage ids (``lineage="lineage_id"``: a long column, the same in
        every replay of a record) and write them idempotently, keeping one row per
        lineage id (a ``MERGE ... ON t.lineage_id = s.lineage_id WHEN NOT MATCHED THEN
        INSERT``: docs/effectively-once.md), or accept duplicates (at least once)."""
        _open(self)
        _check_frame_sink(self, fn)
        return _ending(self, sink=fn, sink_per="dataframe", sink_ids=with_ids,
                            sink_lineage=_lineage_of(fn, lineage))  # fmt: skip

    def map(self, fn: Callable[..., Any], errors: ErrorPolicy | None = None) -> Pipeline:
        """One output per record (acked when ``fn`` returns, via its outputs' fate).
        ``fn(record, ctx)`` receives a :class:`~ftlayer.spark.policy.RecordContext`;
        ``errors``: this stage's error policy (default: the pipeline's)."""
        return _with_op(self, ("map", RowFn.of(fn, errors)))

    def flat_map(
        self, fn: Callable[..., Iterable[Any]], errors: ErrorPolicy | None = None
    ) -> Pipeline:
        """Zero or more outputs per record: ``fn(record)`` returns an iterable; a record
        with none is complete. ``errors``: this stage's error policy (default: the
        pipeline's)."""
        return _with_op(self, ("flat_map", RowFn.of(fn, errors)))

    def filter(self, fn: Callable[..., Any], errors: ErrorPolicy | None = None) -> Pipeline:
        """Keep records where ``fn`` is true; dropped records are acked (complete).
        ``errors``: this stage's error policy (default: the pipeline's)."""
        return _with_op(self, ("filter", RowFn.of(fn, errors)))

    def partition_by(
        self, cols: Sequence[str] | str, n: int, types: Sequence[str] | None = None
    ) -> Pipeline:
        """Shuffle to ``n`` partitions by ``cols`` exactly as ``df.repartition(n, *cols)``
        would place them. ``types``: the key columns' Spark SQL types (``"bigint"``,
        ``"string"``), needed after row stages for a key column that is not an input column
        (Spark's placement of a key depends on its type; with ``ack_scope="task"`` it is
        inferred from the values); default: the input schema's. A record whose key cannot be
        hashed fails."""
        _open(self)
        cols = (cols,) if isinstance(cols, str) else tuple(cols)
        _check_partition_by(cols, n, types)
        last = replace(self.segments[-1], shuffle_cols=cols, shuffle_n=n,
                       shuffle_types=None if types is None else tuple(types))  # fmt: skip
        return replace(self, segments=(*self.segments[:-1], last, Segment(())))

    def sink(
        self,
        fn: Callable[..., Any],
        per: Literal["record", "partition"] = "record",
        errors: ErrorPolicy | None = None,
        lineage: str | None = None,
    ) -> Pipeline:
        """The last stage. ``per="record"``: ``fn(record)``; ``per="partition"``:
        ``fn(list_of_records)`` once per Arrow batch of a task (up to
        ``spark.sql.execution.arrow.maxRecordsPerBatch`` records, 10,000 by default; once
        per task with ``ack_scope="task"``). Records are acked after ``fn`` returns; if it
        raises, the records it was given fail (and are replayed); if it returns an
        :class:`Unconfirmed`, those records stay pending until they time out.
        ``lineage``: a key each record is given its lineage id under (see
        ``sink_batches``; not with ``ack_scope="task"``). ``errors``: this stage's error
        policy (default: the pipeline's)."""
        _open(self)
        name = _check_row_sink(self, fn, per, lineage)
        return _ending(self, sink=fn, sink_per=per, sink_errors=errors, sink_lineage=name)

    def __call__(self, df: DataFrame, batch_id: Any) -> None:
        """One micro-batch: the ``foreachBatch`` function (see ftlayer.spark.stopping)."""
        with stop_told(batch_id):
            self.ft.run_batch(self, df, batch_id)


_KINDS = {"batches": "batch", "frame": "DataFrame"}


def _lineage_of(fn: Any, lineage: str | None) -> str | None:
    """The lineage column a sink asks for: ``lineage=``, else its ``ft_lineage``."""
    name = lineage if lineage is not None else getattr(fn, "ft_lineage", None)
    if name is not None and (not isinstance(name, str) or not name or name.startswith("__ft_")):
        raise ConfigError(f"lineage= takes a column name (not one of ftlayer's __ft_ "
                          f"columns), not {name!r}")  # fmt: skip
    return name


def _is_column(x: Any) -> bool:
    return type(x).__name__ == "Column" and type(x).__module__.startswith("pyspark.sql")


def new_pipeline(ft: BatchRunner, source: int, key: Sequence[str] | str, partitions: int | None,
                 on_error: OnError, immediate_replays: int | None, ack_scope: AckScope,
                 errors: ErrorPolicy, on_dead_letter: Callable[[Any], None] | None,
                 record_key: str | None, reads: Any, name: str | None,
                 replay_from: ReplayFrom = "stage") -> Pipeline:  # fmt: skip
    """A new, empty pipeline of ``ft``, its arguments checked (see
    ``FaultTolerance.pipeline``): a wrong one is refused here, named, before any batch."""
    if on_error not in ("fail_record", "fail_batch"):
        raise ConfigError(f"on_error must be 'fail_record' or 'fail_batch', not {on_error!r}")
    if ack_scope not in ("batch", "task"):
        raise ConfigError(f"ack_scope must be 'batch' or 'task', not {ack_scope!r}")
    if immediate_replays is not None and not 0 <= immediate_replays <= MAX_REPLAYS:
        raise ConfigError(f"immediate_replays must be in 0..{MAX_REPLAYS}, not {immediate_replays}")
    if replay_from not in ("stage", "source"):
        raise ConfigError(f"replay_from must be 'stage' or 'source', not {replay_from!r}")
    key = (key,) if isinstance(key, str) else tuple(key)
    if partitions is not None and (not key or partitions < 1):
        raise ConfigError("partitions= needs key columns and must be >= 1")
    if on_dead_letter is not None and not callable(on_dead_letter):
        raise ConfigError("on_dead_letter takes a function of one DeadLetter")
    if record_key is not None and (ack_scope != "batch" or not isinstance(record_key, str)):
        raise ConfigError("record_key names one column, on the default ack_scope='batch'")
    if name is not None and (not isinstance(name, str) or not name):
        raise ConfigError(f"name must be a non-empty string, not {name!r}")
    if reads is not None:
        from ftlayer.spark.references import ReplayableSource

        if not isinstance(reads, ReplayableSource):
            raise ConfigError("reads= takes a FileSource or another ReplayableSource "
                              f"(stream, reference, read_back), not {reads!r}")  # fmt: skip
        if ack_scope != "batch":
            raise ConfigError("reads= needs the default ack_scope='batch'")
    return Pipeline(ft, source, key, partitions, on_error, immediate_replays, ack_scope, errors,
                    on_dead_letter, record_key, reads, replay_from, name)  # fmt: skip


def _check_mix(pipeline: Pipeline, kind: str) -> None:
    """Row stages take a pipeline of their own; ``ack_scope="task"`` takes row stages only."""
    if kind not in ("map", "flat_map", "filter") and pipeline.ack_scope == "task":
        raise ConfigError("ack_scope='task' runs row stages only (map, flat_map, filter)")
    kinds = {_KINDS.get(k, "row") for seg in pipeline.segments for k, _ in seg.ops}
    mixed = kinds | {_KINDS.get(kind, "row")}
    if "row" in mixed and len(mixed) > 1:
        raise ConfigError(
            "row stages (map, flat_map, filter) take a pipeline of their own: they do "
            "not mix with batch stages (map_batches, map_pandas) or DataFrame stages "
            "(transform), which mix with each other"
        )


def _check_transform(fn: Any, failed: Any, errors: Any) -> None:
    if not callable(fn):
        raise ConfigError(f"transform takes a function of a DataFrame, not {fn!r}")
    if isinstance(failed, bool) or (failed is not None and not (
            isinstance(failed, str) or callable(failed) or _is_column(failed))):  # fmt: skip
        raise ConfigError(f"failed= takes a boolean Column, an SQL expression or a "
                          f"function of the stage's output, not {failed!r}")  # fmt: skip
    if errors is not None and not (isinstance(errors, str) or _is_column(errors)):
        raise ConfigError(f"errors= takes a Column or a text, not {errors!r}")


def _check_row_sink(pipeline: Pipeline, fn: Any, per: str, lineage: str | None) -> str | None:
    """A row sink's checks; its lineage column."""
    if pipeline.frames:
        raise ConfigError("a pipeline of DataFrame stages ends with sink_dataframe() "
                          "or sink_batches()")
    name = _lineage_of(fn, lineage)
    if name is not None and pipeline.ack_scope == "task":
        raise ConfigError("lineage= takes the default ack_scope='batch'")
    if pipeline.vectorized:
        raise ConfigError("a pipeline of batch stages ends with sink_batches()")
    if per not in ("record", "partition"):
        raise ConfigError(f"per must be 'record' or 'partition', not {per!r}")
    return name


def _check_frame_sink(pipeline: Pipeline, fn: Any) -> None:
    if not callable(fn):
        raise ConfigError(f"sink_dataframe takes a function (df, batch_id), not {fn!r}")
    if any(_KINDS.get(kind, "row") == "row" for seg in pipeline.segments for kind, _ in seg.ops):
        raise ConfigError("sink_dataframe ends a pipeline of DataFrame or batch stages, "
                          "not of row stages (map, flat_map, filter): end it with sink()")
    if pipeline.ack_scope != "batch":
        raise ConfigError("sink_dataframe needs the default ack_scope='batch'")


def _check_partition_by(cols: tuple[str, ...], n: int, types: Sequence[str] | None) -> None:
    if not cols or n < 1:
        raise ConfigError("partition_by needs at least one column and n >= 1")
    if types is not None:
        HashPartitioner(n, list(types))  # validate now, on the driver


def _open(pipeline: Pipeline) -> None:
    if pipeline.sunk:
        raise ConfigError("the pipeline already ends in a sink")


def _with_op(pipeline: Pipeline, op: Op) -> Pipeline:
    """``pipeline`` with the stage ``op`` added to its last segment."""
    _open(pipeline)
    _check_mix(pipeline, op[0])
    last = pipeline.segments[-1]
    return replace(pipeline, segments=(*pipeline.segments[:-1],
                                       replace(last, ops=(*last.ops, op))))  # fmt: skip


def _ending(pipeline: Pipeline, **sink: Any) -> Pipeline:
    """``pipeline`` ending in the sink ``sink`` describes (Segment's sink fields)."""
    last = replace(pipeline.segments[-1], **sink)
    return replace(pipeline, segments=(*pipeline.segments[:-1], last), sunk=True)
