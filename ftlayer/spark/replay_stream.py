"""Replays as a Spark streaming source: a quiet stream still replays.

``pipeline.with_replays(stream)`` unions the user's stream with this source (Spark's
Python data source API, format ``ftlayer-replays``, or ``ftlayer-replay-offsets`` when the
batch reads its claims itself), so Spark runs a micro-batch whenever
replays of the pipeline's source are queued, whether or not new input arrived -- the way
Storm's spout re-emits failed tuples on its own.

Offsets are positions in the source's replay queue, kept in Spark's checkpoint:
``{"run": <query run>, "seq": k, "shards": [...]}``. Asked for its latest offset, the
reader *claims* up to ``maxReplaysPerTrigger`` queued replays under the token of offset
``k + 1`` (lua/claim.lua, mode ``stream``): each claimed record gets the current id
``stream_ids(token, shard, i)`` and a fresh timeout, and Redis keeps what the token took.
A task of the batch reads them back by the token (mode ``read``: pops nothing), and
Spark's commit of the batch releases the token.

Invariants:

* Nothing lost: a claimed record stays pending with a live timeout until the batch that
  ran it settles it; a driver that dies first leaves it to time out and replay.
* A re-run batch (same offsets, after a driver crash) reads the same token again: the
  records it still holds come back under the ids their claim gave them; those its first
  run settled (completed, failed, dead-lettered) are gone and do not run again, so no
  record is taken twice into its replay budget. A latest offset asked again after a crash
  before Spark logged it claims under the same token and gets the same records.
* Tokens belong to one query run (``run``, fixed by the initial offset): two queries
  never read each other's claims.
* With ``trigger(availableNow=True)`` the reader keeps offering offsets while records of
  its source are pending (it expires due timeouts itself while it waits, bounded by one
  full timeout, or by the due time of replays a stage's breaker held for its probe): the
  query ends when nothing of the source is pending.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import redis
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadMaxRows, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from ftlayer.config import FTConfig
from ftlayer.spark.batch_plan import arrow_schema, spark_schema
from ftlayer.spark.replay_rows import replay_schema, stored_schema
from ftlayer.spark.source_launcher import keep_warm, register_source
from ftlayer.spark.worker import worker_layer

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import DataFrame, SparkSession

__all__ = ["FORMAT", "OFFSETS_FORMAT", "replay_stream"]

log = logging.getLogger(__name__)

FORMAT = "ftlayer-replays"
OFFSETS_FORMAT = "ftlayer-replay-offsets"


class ReplayPartition(InputPartition):
    def __init__(self, token: str, shard: int) -> None:
        self.token, self.shard = token, shard


class ReplayReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        self.config = FTConfig(**json.loads(options["config"]))
        self.source = int(options["source"])
        self.limit = int(options.get("maxreplayspertrigger", "10000"))
        self.user = StructType.fromJson(json.loads(options["schema"]))
        self.by_reference = options.get("byreference") == "1"
        self.rows = options.get("rows", "1") == "1"
        self.available_now = False
        self.expired_at = 0.0
        self.released = 0
        self.run = uuid.uuid4().hex[:12]
        self.others_forgotten = False

    def _layer(self) -> Any:
        return worker_layer(self.config)

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 (Spark's names)
        """A new query run (Spark may ask more than once: the same run each time)."""
        return {"run": self.run, "seq": 0, "shards": []}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.available_now = True

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:  # noqa: N802
        """The next offset: what the claim under its token took (``start``: none). A
        Redis that cannot be reached (a failover) claims nothing this trigger: the query
        goes on, and the next trigger asks again under the same token (a claim applied
        whose reply was lost is answered again, not repeated); with availableNow, where
        no offset ends the query, it is waited out first."""
        try:
            if self.available_now:  # returning start would end the query: wait it out
                return _through_failover(lambda: self._latest(start, limit), "replay stream")
            return self._latest(start, limit)
        except (redis.RedisError, ConnectionError) as e:
            log.warning("replay stream: Redis unreachable, no replays this trigger "
                        "source=%d error=%s", self.source, e)  # fmt: skip
            return start

    def _latest(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
        layer = self._layer()
        want = limit.max_rows if isinstance(limit, ReadMaxRows) else self.limit
        seq = int(start["seq"]) + 1
        token = f"rs:{start['run']}:{seq}"
        cfg = self.config  # availableNow waits at most T*B/(B-1) + 2 rotations for one
        deadline = time.monotonic() + cfg.timeout_s * cfg.buckets / (cfg.buckets - 1)
        deadline += 2 * cfg.rotation_interval_s
        while True:
            self._expire(layer)
            got = layer.persistence.claim_stream(self.source, token, max(1, want))
            if got:
                layer.persistence.open_stream(self.source, token)
                log.info("replay stream offset source=%d seq=%d replays=%d",
                         self.source, seq, sum(got.values()))  # fmt: skip
                return {"run": start["run"], "seq": seq, "shards": sorted(got)}
            if not self.available_now or not self._pending(layer):
                return start
            _, due = layer.persistence.delayed(self.source)  # held for a stage's probe
            if due is not None:  # wait for it too (time.time() is Redis' clock's kind)
                deadline = max(deadline, time.monotonic() + due - time.time()
                               + 2 * cfg.rotation_interval_s)  # fmt: skip
            if time.monotonic() > deadline:
                log.warning("replay stream: records of source %d still pending after a "
                            "full timeout with none queued; ending", self.source)  # fmt: skip
                return start
            time.sleep(min(0.2, self.config.rotation_interval_s / 4))

    def getDefaultReadLimit(self) -> Any:  # noqa: N802
        return ReadMaxRows(self.limit)

    def _expire(self, layer: Any) -> None:
        """Rotate the timeouts (at most twice per rotation interval), so a stream with
        no sidecar still fails what timed out; a sidecar doing it too is harmless."""
        now = time.monotonic()
        if now - self.expired_at >= self.config.rotation_interval_s / 2:
            self.expired_at = now
            layer.expire_due()

    def _pending(self, layer: Any) -> bool:
        st = layer.stats()
        mine = f"{self.source}:"
        return bool(st.pending_by_source.get(self.source, 0)) or any(
            m.startswith(mine) for _, m, _ in layer.segments.indexed())  # fmt: skip

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any]:
        """One partition per shard of the claim -- none when the batch reads its claims
        itself (kept by reference, DataFrame stages): a partition is a Python task that
        would read nothing, and such tasks cost a micro-batch about as much as its own
        job."""
        if int(end["seq"]) <= int(start["seq"]) or not self.rows:
            return []
        token = f"rs:{end['run']}:{end['seq']}"
        return [ReplayPartition(token, int(k)) for k in end["shards"]]

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
        """The records the partition's claim holds. Kept by reference, none: the batch
        reads its claims itself (VectorRun._stream_replays), to resolve them in its plan
        without computing the micro-batch twice."""
        if self.by_reference:
            return
        from ftlayer.spark.intake import Intake

        intake = Intake(self._layer(), self.source, arrow_schema(self.user, None),
                        self.by_reference)  # fmt: skip
        table = _through_failover(lambda: intake.stream_partition(partition.token,
                                                                  partition.shard),
                                  "replay stream read")  # fmt: skip
        yield from table.to_batches()

    def commit(self, end: dict[str, Any]) -> None:
        """Release the claims of the batches Spark committed (a release that fails is
        tried again at the next commit: an open claim's records are kept alive and read
        by the next batch). The first commit of a run also forgets the open claims of
        earlier runs: a batch re-run after a crash has read its own by then, and those of
        a query whose checkpoint is gone time out and replay."""
        seq = int(end["seq"])
        first = self.released + 1 if self.released else max(seq - 1, 1)
        tokens = [f"rs:{end['run']}:{k}" for k in range(first, seq + 1)]
        try:
            persistence = self._layer().persistence
            persistence.release_stream(self.source, tokens)
            self.released = seq
            if not self.others_forgotten:
                persistence.forget_stream(self.source, keep=f"rs:{end['run']}:")
                self.others_forgotten = True
        except (redis.RedisError, ConnectionError) as e:
            log.warning("replay stream: claims not released tokens=%s error=%s", tokens, e)


class ReplaySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> Any:
        opts = _options(self.options)
        user = StructType.fromJson(json.loads(opts["schema"]))
        stored = stored_schema(arrow_schema(user, None), opts.get("byreference") == "1")
        return spark_schema(replay_schema(stored))

    def streamReader(self, schema: Any) -> Any:  # noqa: N802
        return ReplayReader(_options(self.options))


class ReplayOffsets(ReplaySource):
    """The replay source whose micro-batches hold no rows (``rows`` "0"), only the
    offsets of the claims the batch reads itself: its reader starts quickly
    (ftlayer.spark.source_launcher), as no task of it runs on an executor."""

    @classmethod
    def name(cls) -> str:
        return OFFSETS_FORMAT


_registered: set[tuple[int, str]] = set()


FAILOVER_S = 60.0
"""How long a replay stream's task waits out an unreachable Redis (a cluster failover
takes 15-20 s) before it fails (and Spark retries it)."""


def _through_failover(call: Any, what: str) -> Any:
    """``call()``, retried with backoff while Redis is unreachable, up to FAILOVER_S."""
    deadline, pause = time.monotonic() + FAILOVER_S, 0.2
    while True:
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError, ConnectionError) as e:
            if time.monotonic() > deadline:
                raise
            log.warning("%s: Redis unreachable, retrying in %.1fs error=%s", what, pause, e)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)


def _options(options: Any) -> dict[str, str]:
    """The data source's options with lower-case keys (Spark hands them over
    case-insensitively; a plain dict of them keeps whatever case it got)."""
    return {k.lower(): v for k, v in options.items()}


def replay_stream(
    spark: SparkSession,
    config: FTConfig,
    source: int,
    schema: Any,
    limit: int,
    by_reference: bool = False,
    carries_rows: bool = True,
) -> DataFrame:
    """The replays of ``source`` as a streaming DataFrame of ``schema`` (the source's own
    StructType; ``by_reference``: and the reference columns) plus the replay columns.
    ``carries_rows`` False: its micro-batches hold no rows, only the offsets of the
    claims the batch reads itself (kept by reference, DataFrame stages). Registers the
    data source with the session once."""
    source_cls = ReplaySource if carries_rows else ReplayOffsets
    key = (id(spark), source_cls.name())
    if key not in _registered:
        register_source(spark, source_cls, quick_start=not carries_rows)
        _registered.add(key)
    elif not carries_rows:
        keep_warm()
    return (
        spark.readStream.format(source_cls.name())
        .option("config", json.dumps(asdict(config)))
        .option("source", str(source))
        .option("schema", schema.json())
        .option("maxReplaysPerTrigger", str(limit))
        .option("byReference", "1" if by_reference else "0")
        .option("rows", "1" if carries_rows else "0")
        .load()
    )
