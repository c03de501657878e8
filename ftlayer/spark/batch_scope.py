"""Driver side of the vectorized path: plan a batch as DataFrame operations, run it, and
settle it with batch-scope acking.

The plan is only DataFrame API calls: ``mapInArrow`` per segment and Spark's own
``repartition(n, *cols)`` for every keyed shuffle, so replays land where Spark places
their key, no record is pickled, and the same code runs under Spark Connect.

Settling (after every task of the batch finished, before the batch function returns, so
Spark commits the batch's offsets only then -- invariant 1):

* the summaries of the attempts whose rows were consumed are gathered (the last stage's
  come back as its output rows; earlier stages' through their tokens, from Redis);
* their folds must sum to 0 (mod 2**64: every row sent through a shuffle was received
  once, see ftlayer.spark.vector_tasks). Then every record of the batch is complete
  except the residues the tasks reported;
* residues become per-record entries, each segment is deleted (one script call per shard
  that holds segments), completed replays are completed and failed ones failed (one
  flush per shard, under a token owned by this batch run);
* if the fold is not 0 (a task's output lost or counted twice), nothing is assumed
  complete: every row of every segment is kept pending with a live timeout and the
  replays stay pending, so they all replay (at-least-once), and the batch says so.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from ftlayer.acker import ShardBatch
from ftlayer.connection import is_cluster
from ftlayer.errors import ConfigError
from ftlayer.ids import RecordId, batch_source_ids, is_local, new_ids, shard_of, split_local
from ftlayer.limits import DEAD_NOW
from ftlayer.lineage import copy_seed
from ftlayer.persistence import ClaimedRecord
from ftlayer.segments import frames_of_rows, unit_source_id
from ftlayer.spark.plan import MAX_MESSAGES, SOURCE_STAGE, Segment
from ftlayer.spark.policy import DEFAULT_POLICY, ErrorPolicy
from ftlayer.spark.references import references, resolve
from ftlayer.spark.replay_rows import replay_table, stored_schema
from ftlayer.spark.results import BatchResult, StageCounts
from ftlayer.spark.vector_plan import (
    ATT_COL,
    CUR_COL,
    LIN_COL,
    LOC_COL,
    REF_COLS,
    REPLAY_COLS,
    SRC_COL,
    SUMMARY_COL,
    VectorPlan,
)
from ftlayer.spark.vector_tasks import run_vector_task
from ftlayer.tally import Tally
from ftlayer.wire import BatchSummary

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.layer import FTLayer

__all__ = ["Failure", "VectorRun", "arrow_schema", "new_salt", "plan_batch", "spark_schema",
           "with_replay_columns", "without_replay_columns"]

log = logging.getLogger(__name__)


def spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def with_replay_columns(df: DataFrame) -> DataFrame:
    """``df`` (fresh rows) with the columns a replay carries, null."""
    from pyspark.sql import functions as F  # noqa: N812

    return df.select("*", F.lit(None).cast("long").alias(SRC_COL),
                     F.lit(None).cast("int").alias(ATT_COL),
                     F.lit(None).cast("long").alias(CUR_COL),
                     F.lit(None).cast("long").alias(LIN_COL))  # fmt: skip


def without_replay_columns(schema: Any) -> Any:
    """A StructType without ftlayer's replay and reference columns: the source's own."""
    from pyspark.sql.types import StructType

    ours = (*REPLAY_COLS, *REF_COLS)
    return StructType([f for f in schema.fields if f.name not in ours])


_DDL: dict[str, Any] = {}


def arrow_schema(schema: Any, spark: Any) -> pa.Schema:
    """An Arrow schema from a StructType or a DDL string, all fields nullable (marker
    rows carry nulls in every user column). DDL is parsed by the session (the JVM, or the
    Spark Connect server: there is no local JVM there), once per string."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if isinstance(schema, str):
        if schema not in _DDL:
            _DDL[schema] = spark._parse_ddl(schema)
        schema = _DDL[schema]
    out = to_arrow_schema(schema, timezone="UTC")
    return pa.schema([f.with_nullable(True) for f in out])


def plan_batch(
    segments: tuple[Segment, ...],
    input_schema: Any,
    spark: Any,
    *,
    config: Any,
    source: int,
    batch_key: str,
    on_error: str,
    immediate_replays: int | None = None,
    errors: ErrorPolicy = DEFAULT_POLICY,
    record_key: str | None = None,
    lineage_seed: int = 0,
    run_again: bool = True,
) -> VectorPlan:
    """The plan of one run of a vectorized batch (a fresh salt per run)."""
    inputs = [arrow_schema(input_schema, spark)]
    outputs = []
    for i, seg in enumerate(segments):
        schemas = tuple(arrow_schema(op.schema, spark) for kind, op in seg.ops)
        if any(kind != "batches" for kind, _ in seg.ops):
            raise ConfigError("a vectorized pipeline takes batch stages only (map_batches)")
        outputs.append(schemas)
        exit_schema = schemas[-1] if schemas else inputs[-1]
        if seg.shuffle_n:
            missing = [c for c in seg.shuffle_cols if c not in exit_schema.names]
            if missing:
                raise ConfigError(
                    f"partition_by columns {missing} are not in segment {i}'s output "
                    f"{exit_schema.names}"
                )
            inputs.append(exit_schema)
    if record_key is not None:
        for schema in [*inputs, *(s for seg in outputs for s in seg)]:
            i = schema.get_field_index(record_key)
            if i < 0 or schema.field(i).type != pa.int64():
                raise ConfigError(
                    f"record_key {record_key!r} must be an int64 (long) column of the input "
                    f"and of every stage's output; not in {schema}"
                )
    salt = new_salt()
    budget = config.max_replays if immediate_replays is None else immediate_replays
    return VectorPlan(config, source, batch_key, salt, segments, on_error,
                      min(budget, config.max_replays), tuple(inputs), tuple(outputs),
                      errors, record_key, lineage_seed, run_again)  # fmt: skip


def lineage_seed(df: DataFrame, source: int, batch_id: Any) -> int:
    """The seed of a batch's copied rows' lineage ids (ftlayer.lineage.copy_seed): from
    the streaming query's id (Spark keeps it in the checkpoint, so a batch re-run after a
    crash gets the same seed) when ``df`` is a micro-batch of a classic session's query;
    random otherwise (a pipeline called on a DataFrame, a Spark Connect session)."""
    try:
        query = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # Spark Connect: no SparkContext behind the session
        query = None
    return copy_seed(query, source, batch_id)


def new_salt() -> int:
    """A batch run's random salt (63 bits): its summaries, edges and settle token."""
    return int(new_ids(1)[0] & np.uint64(0x7FFF_FFFF_FFFF_FFFF))


class Failure(NamedTuple):
    """A failed residue: its first error, the attempts it used in its batch and the label
    of the stage it failed in (its outcome is counted there)."""

    error: str
    attempts: int
    stage: str = SOURCE_STAGE


@dataclass
class VectorRun:
    """One run of one vectorized batch, from its DataFrame plan to its settlement."""

    plan: VectorPlan
    layer: FTLayer | None
    result: BatchResult
    injected: dict[int, int] = field(default_factory=dict)  # replay src -> its current id
    replay_keys: dict[int, list[int]] = field(default_factory=dict)  # record key -> srcs
    tables: dict[str, pa.Table | None] = field(default_factory=dict)  # segments read
    streamed: bool = False  # replays ride in from the replay stream, not read here
    reads: Any = None  # the pipeline's ReplayableSource (None: copies)
    spark: Any = None
    references: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Replays kept by reference in the plan: source id -> (current id, location id)."""
    replay_lineage: pa.Table | None = None
    """The replays this run runs: (source id, lineage id) each."""
    calls: int = 0
    sent: dict[str, dict[int, str]] = field(default_factory=dict)
    """Failed rows sent to settlement: segment member ('' for claimed replays) -> the id
    the record is failed under (a fresh row's new one) -> the label of the stage it failed
    in."""
    settled: Tally = field(default_factory=Tally)
    """What settlement did (its dead-lettered ids, the segments it skipped)."""
    started: float = field(default_factory=time.monotonic)
    """When the batch began on the driver: its elapsed time at settlement is the
    completion latency observed for the rows its segments complete."""

    def elapsed_ms(self) -> int:
        return max(1, int((time.monotonic() - self.started) * 1000))

    # -- building the DataFrame ------------------------------------------------------------
    def dataframe(self, df: DataFrame, key: tuple[str, ...], partitions: int | None,
                  replay_limit: int, reads: Any = None) -> DataFrame:  # fmt: skip
        """The batch's plan: fresh rows of ``df`` (with their references, if it carries
        them) and its replays (riding in ``df`` from the replay stream, or claimed now),
        those kept by reference read back from ``reads``."""
        from pyspark.sql import functions as F  # noqa: N812

        plan = self.plan
        names = plan.inputs[0].names
        ft = plan.config.enabled
        self.reads, self.spark = reads, df.sparkSession
        streamed = SRC_COL in df.columns  # the replay stream's rows ride in df
        refs = REF_COLS if ft and LOC_COL in df.columns else ()
        source_df = df if df.columns == names else df.select(*names, *refs)
        if self.layer is not None:
            self.calls += 1 if not is_cluster(self.layer.client) else len(self.layer.keyspace)
            self.layer.segments.drop_batch(plan.source, plan.batch_key)
            self.streamed = streamed  # kept alive by their claims' tokens
            if streamed and reads is None:
                source_df = df.select(*names, *refs, *REPLAY_COLS)
            else:
                if streamed:  # by reference: the replays of the batch's open claims, read
                    # back in the plan. Not from df: every action on a micro-batch's
                    # DataFrame computes it again, its files scanned; one, the job, is all.
                    source_df = df.filter(F.col(SRC_COL).isNull()).select(*names, *refs)
                    replays = self._stream_replays(df.sparkSession, reads)
                else:
                    replays = self._replays(df, replay_limit, reads)
                if replays is not None:
                    source_df = with_replay_columns(source_df).unionByName(
                        replays, allowMissingColumns=True)  # fmt: skip
        if key and partitions:
            source_df = source_df.repartition(partitions, *key)
        out = source_df
        for i in range(len(plan.segments)):
            if i:
                prev = plan.segments[i - 1]
                out = out.repartition(prev.shuffle_n, *prev.shuffle_cols)
            out = out.mapInArrow(partial(run_vector_task, plan, i), self._out_schema(i))
        return out

    def _out_schema(self, i: int) -> Any:
        plan = self.plan
        if i == len(plan.segments) - 1:
            return spark_schema(pa.schema([pa.field(SUMMARY_COL, pa.binary())]))
        if plan.config.enabled:
            return spark_schema(plan.id_schemas[i])
        return spark_schema(plan.inputs[i + 1])

    def _replays(self, df: DataFrame, limit: int, reads: Any) -> DataFrame | None:
        """Claim this source's replays and make them a DataFrame with their ids."""
        assert self.layer is not None
        claimed = self.layer.claim_replays(self.plan.source, limit)
        self.calls += 1 + len({shard_of(c.record_id[0], self.layer.config.shards)
                               for c in claimed})  # fmt: skip
        if not claimed:
            return None
        log.info("replays claimed batch_id=%s source=%d claimed=%d",
                 self.result.batch_id, self.plan.source, len(claimed))  # fmt: skip
        return self._replay_rows(df.sparkSession, claimed, reads)

    def _stream_replays(self, spark: Any, reads: Any) -> DataFrame | None:
        """The replays the replay stream claimed for this batch (its open claims), a full
        timeout from now (claimed a while ago: the batch begins)."""
        assert self.layer is not None
        claimed = self.layer.persistence.read_open_streams(self.plan.source)
        self.calls += 1 + len(self.layer.keyspace.shards)
        if claimed:
            self.layer.reset_timeout([c.record_id[0] for c in claimed])
            self.calls += len(self.layer.keyspace.shards)
        return self._replay_rows(spark, claimed, reads)

    def _replay_rows(
        self, spark: Any, claimed: list[ClaimedRecord], reads: Any
    ) -> DataFrame | None:
        """Claimed replays as a DataFrame of the source's columns and the replay columns
        (kept alive while the batch runs), those kept by reference read back from
        ``reads`` in the plan (one whose row is not found is dead-lettered when the batch
        settles, named); those that do not decode dead-lettered now."""
        names = self.plan.inputs[0].names
        table, bad = replay_table(claimed, stored_schema(self.plan.inputs[0], reads is not None))
        self._keep_alive(table)  # reading back may take a while
        self._reject(bad)
        if not table.num_rows:
            return None
        if reads is None:
            return spark.createDataFrame(table.select([*names, *REPLAY_COLS]))
        self.references = references(table)
        return resolve(spark, reads, table, names)

    def _keep_alive(self, replays: pa.Table) -> None:
        """The replays this run will run (their ids): kept alive while its job runs."""
        src = replays.column(SRC_COL).to_numpy().view(np.uint64).tolist()
        cur = replays.column(CUR_COL).to_numpy().view(np.uint64).tolist()
        self.injected = dict(zip(src, cur, strict=True))
        self.replay_lineage = replays.select([SRC_COL, LIN_COL])

    def _reject(self, bad: list[tuple[RecordId, str]]) -> None:
        """Dead-letter replays that no replay can fix, each with its own error."""
        assert self.layer is not None
        for rid, text in bad:  # rare: one call each
            self.result.undecodable += 1
            if len(self.result.errors) < MAX_MESSAGES:
                self.result.errors.append(text)
            log.error("replay rejected batch_id=%s %s", self.result.batch_id, text)
            self.layer.fail([rid], error=text, max_replays=0)
            self.calls += 1

    @contextmanager
    def keepalive(self) -> Iterator[None]:
        """While the block runs (the batch's plan and Spark job), a thread pushes the
        deadlines of this run's segments and replays a full timeout ahead every half rotation
        interval, so a batch longer than ``timeout_s`` is not timed out under a live
        driver. A driver that dies stops, and they time out. Errors are logged, never
        raised: a missed beat only risks a replay, never a loss."""
        layer = self.layer
        if layer is None:
            yield
            return
        stop = threading.Event()
        plan = self.plan

        def beat() -> None:
            while not stop.wait(layer.config.rotation_interval_s / 2):
                try:
                    layer.segments.touch_batch(plan.source, plan.batch_key)
                    replays = list(self.injected)  # known once the plan is built
                    if self.streamed:  # the replay stream's open claims of this source
                        replays += layer.persistence.stream_claimed(plan.source)
                    if replays:
                        layer.reset_timeout(replays)
                except redis.RedisError as e:
                    log.warning("batch keepalive failed batch=%s error=%s", plan.batch_key, e)

        thread = threading.Thread(target=beat, name="ftlayer-batch-keepalive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)

    # -- settling --------------------------------------------------------------------------
    def settle(self, finals: list[bytes]) -> BatchResult:
        """The batch's job ended: read its task summaries and settle them in Redis."""
        log.info("batch settling batch_id=%s source=%d", self.result.batch_id,
                 self.plan.source)  # fmt: skip
        summaries = [BatchSummary.decode(f) for f in finals]
        ok = self._gather(summaries)
        self._ran_replays(summaries)
        self._count(summaries)
        if self.layer is None:
            return self.result
        fold = sum(s.fold for s in summaries) % (1 << 64)
        if fold != 0 or not ok:
            self.result.fold_ok = False
            log.error(
                "batch fold is not 0 batch_id=%s fold=%016x consistent=%s: keeping every "
                "record of the batch pending (they replay)", self.result.batch_id, fold, ok,
            )  # fmt: skip
        keyed = bool(self.plan.record_key)
        failed, unconfirmed = self._residues([s for s in summaries if not keyed or s.stage == 0])
        if keyed:  # past a shuffle, residues are record keys
            by_key = self._residues([s for s in summaries if s.stage > 0])
            if not self._keys_to_ids(summaries, *by_key, failed, unconfirmed):
                self.result.fold_ok = False  # a key naming no row: keep every record pending
        if self.result.fold_ok:  # source records this batch completed
            done = self.result.fresh + self.result.replayed - len(failed) - len(unconfirmed)
            self.result.acked = max(done, 0)
        self._settle_segments(summaries, failed, unconfirmed)
        self._not_found(failed)
        self._settle_replays(failed, unconfirmed)
        self._count_outcomes()
        self.result.redis_calls = self.calls + sum(
            1 for s in summaries if s.stage < len(self.plan.segments) - 1 or s.segment
        )  # fmt: skip
        return self.result

    def _gather(self, summaries: list[BatchSummary]) -> bool:
        """Fetch upstream summaries by token, stage by stage. False when one is missing
        or two attempts of one task both counted."""
        ok = True
        frontier = [t for s in summaries for t in s.upstream]
        while frontier and self.layer is not None:
            got = self.layer.segments.summaries(frontier)
            self.calls += len({self.layer.segments.token_shard(t) for t in frontier})
            frontier = []
            for token, raw in got.items():
                if raw is None:
                    log.error("task summary missing token=%x", token)
                    ok = False
                    continue
                s = BatchSummary.decode(raw)
                summaries.append(s)
                frontier.extend(s.upstream)
        keys = [s.key for s in summaries]
        if len(set(keys)) != len(keys):
            log.error("two attempts of one task counted in batch_id=%s", self.result.batch_id)
            ok = False
        return ok

    def _ran_replays(self, summaries: list[BatchSummary]) -> None:
        """The replays this batch ran, as the source tasks that counted report them
        (claimed by this run, or read from the replay stream): settled below."""
        self.injected, self.replay_keys = {}, {}
        for s in summaries:
            if s.stage or not len(s.rep_src):
                continue
            srcs = s.rep_src.tolist()
            self.injected.update(zip(srcs, s.rep_cur.tolist(), strict=True))
            if self.plan.record_key:
                for k, src in zip(s.rep_key.tolist(), srcs, strict=True):
                    if k < 1 << 63:  # a null or negative key was dead-lettered at the source
                        self.replay_keys.setdefault(k, []).append(src)

    def _count(self, summaries: list[BatchSummary]) -> None:
        r = self.result
        for s in summaries:
            r.tasks += 1
            r.fresh += s.fresh
            r.replayed += s.replayed
            r.written += s.written
            r.failed += len(s.failed_src)
            r.immediate_replays += s.immediate_replays
            r.unconfirmed += len(s.unc_src)
            for label, (rin, rout, failed, unc, extra, micros, now) in s.counts.items():
                r.stages.setdefault(label, StageCounts()).add(
                    StageCounts(rin, rout, failed, unc, extra, micros / 1e6, replayed=now)
                )
            for text in s.errors:
                if len(r.errors) < MAX_MESSAGES:
                    r.errors.append(text)

    def _keys_to_ids(
        self,
        summaries: list[BatchSummary],
        keys_failed: dict[int, Failure],
        keys_unc: set[int],
        failed: dict[int, Failure],
        unconfirmed: set[int],
    ) -> bool:
        """Add to ``failed`` / ``unconfirmed`` the source ids of the rows carrying each
        failed / unconfirmed record key: claimed replays, and fresh rows of this run's
        segments (read once, kept for the settlement). False when a key names no row (the
        stage contract was broken: nothing may be assumed complete)."""
        if not keys_failed and not keys_unc:
            return True
        wanted = np.fromiter(keys_failed.keys() | keys_unc, np.uint64)
        found: dict[int, list[int]] = {k: list(self.replay_keys[k]) for k in wanted.tolist()
                                       if k in self.replay_keys}  # fmt: skip
        assert self.plan.record_key
        for s in summaries:
            member = s.segment
            table = self._segment(s.partition, member) if member else None
            if table is None:  # none, or timed out by the sidecar: its rows replay anyway
                continue
            col = table.column(self.plan.record_key)
            keys = np.asarray(col.fill_null(-1).to_numpy()).view(np.uint64)
            rows = np.flatnonzero(np.isin(keys, wanted))
            ids = batch_source_ids(s.partition, 0, s.segment_rows)[rows]
            for k, src in zip(keys[rows].tolist(), ids.tolist(), strict=True):
                found.setdefault(k, []).append(src)
        missing = [k for k in wanted.tolist() if k not in found]
        if missing:
            log.error("record keys name no row batch_id=%s keys=%s: keeping the batch's "
                      "records pending", self.result.batch_id, missing[:5])  # fmt: skip
            return False
        for k, srcs in found.items():
            for src in srcs:
                if k in keys_failed:
                    failed.setdefault(src, keys_failed[k])
                else:
                    unconfirmed.add(src)
        unconfirmed -= failed.keys()
        return True

    def _segment(self, partition: int, member: str) -> pa.Table | None:
        """A segment's rows, read from Redis and decoded once per run (None: gone)."""
        if member not in self.tables:
            assert self.layer is not None
            blob = self.layer.segments.get(partition, member)
            self.calls += 1
            self.tables[member] = None if blob is None else pa.ipc.open_stream(blob).read_all()
        return self.tables[member]

    def _residues(self, summaries: list[BatchSummary]) -> tuple[dict[int, Failure], set[int]]:
        """Failed source ids with their first error and attempts used; unconfirmed ones
        (failed wins)."""
        failed: dict[int, Failure] = {}
        unconfirmed: set[int] = set()
        for s in summaries:
            for src, err, att, stage in zip(s.failed_src.tolist(), s.failed_err,
                                            s.failed_att.tolist(), s.failed_stage, strict=True):
                failed.setdefault(src, Failure(err, att, stage))
            unconfirmed.update(s.unc_src.tolist())
        return failed, unconfirmed - failed.keys()

    def _settle_segments(
        self, summaries: list[BatchSummary], failed: dict[int, Failure], unconfirmed: set[int]
    ) -> None:
        assert self.layer is not None
        store, cfg, plan = self.layer.segments, self.layer.config, self.plan
        keep_all = not self.result.fold_ok
        by_partition: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
        for src_set, slot in ((failed.keys(), 0), (unconfirmed, 1)):
            srcs = np.fromiter(src_set, np.uint64, len(src_set))
            fresh = srcs[is_local(srcs)]
            parts, rows = split_local(fresh)
            for p, row, src in zip(parts.tolist(), rows.tolist(), fresh.tolist(), strict=True):
                by_partition.setdefault(p, ([], []))[slot].append((row, src))
        per_shard: dict[int, list[Any]] = {}
        tokens: dict[int, list[int]] = {}
        for s in summaries:
            if s.stage < len(plan.segments) - 1:
                tokens.setdefault(store.token_shard(s.token), []).append(s.token)
            member = s.segment
            if not member:
                continue
            partition, n_rows = s.partition, s.segment_rows
            shard = store.shard_of_partition(partition)
            fails, pends = by_partition.get(partition, ([], []))
            fail_frames: list[tuple[bytes, str, int]] = []
            pend_frames: list[tuple[bytes, bytes]] = []
            if fails or pends or keep_all:
                table = self._segment(partition, member)
                if table is None:  # the sidecar timed it out: all of its rows replay
                    continue
                self._remember(table, [r for r, _ in fails + pends], keep_all)
                make: Callable[..., list[bytes]] = partial(
                    frames_of_rows, table, shard=shard, source=plan.source,
                    partition=partition, max_replays=cfg.max_replays,
                    max_payload=cfg.max_record_bytes,
                )  # fmt: skip
                if keep_all:
                    pend_frames = [(f, os.urandom(8)) for f in make(np.arange(n_rows))]
                else:
                    if fails:
                        frames = make(np.array([r for r, _ in fails]))
                        why = [failed[src] for _, src in fails]
                        fail_frames = [(f, w.error, w.attempts)
                                       for f, w in zip(frames, why, strict=True)]  # fmt: skip
                        self.sent[member] = {unit_source_id(f): w.stage
                                             for f, w in zip(frames, why, strict=True)}
                    if pends:  # pending with a live timeout: any non-zero ack value
                        frames = make(np.array([r for r, _ in pends]))
                        pend_frames = [(f, os.urandom(8)) for f in frames]
            per_shard.setdefault(shard, []).append(
                (member, n_rows, fail_frames, pend_frames, s.immediate_replays)
            )
        jobs = {
            k: (per_shard.get(k, []), tokens.get(k, [])) for k in per_shard.keys() | tokens.keys()
        }
        batch = store.batch_prefix(plan.source, plan.batch_key)
        replies = store.settle_shards(jobs, salt=plan.salt, batch=batch,
                                      elapsed_ms=self.elapsed_ms())  # fmt: skip
        self.calls += len(replies)
        for shard, tally in sorted(replies.items()):
            self.settled.merge(tally)
            if tally.skipped:
                log.warning("segments settled already batch_id=%s shard=%d skipped=%d",
                            self.result.batch_id, shard, tally.skipped)  # fmt: skip

    def _remember(self, table: pa.Table, rows: list[int], every: bool) -> None:
        """Let the source name the locations of the rows its batch persists as references
        (a file's path, while the file surely exists): a replay that finds it gone names
        it."""
        if self.reads is None or LOC_COL not in table.schema.names:
            return
        locs = table.column(LOC_COL) if every else table.column(LOC_COL).take(pa.array(rows))
        self.reads.remember(self.spark, pc.unique(locs).to_pylist())

    def _not_found(self, failed: dict[int, Failure]) -> None:
        """Replays kept by reference that the job did not run: their rows were not read
        back (the file gone or rewritten). Dead-lettered with the replays, named (after
        the read-back: its listing names the files that still exist)."""
        for src, (cur, loc) in self.references.items():
            if src in self.injected:
                continue
            text = (f"replay source row not found: {self.reads.location_name(loc)} no "
                    "longer exists or no longer holds the row (deleted or rewritten)")
            self.injected[src] = cur
            failed[src] = Failure(text, 1 | DEAD_NOW)
            self.result.undecodable += 1
            if len(self.result.errors) < MAX_MESSAGES:
                self.result.errors.append(text)
            log.error("replay rejected batch_id=%s %s", self.result.batch_id, text)

    def _settle_replays(self, failed: dict[int, Failure], unconfirmed: set[int]) -> None:
        """Complete the replays that finished in this batch, fail those that failed."""
        if not self.injected or not self.result.fold_ok:
            return  # kept pending: their timeouts replay them
        assert self.layer is not None
        shards = self.layer.config.shards
        batches: dict[int, ShardBatch] = {}
        done: dict[int, list[tuple[int, int]]] = {}
        for src, cur in self.injected.items():
            k = shard_of(src, shards)
            if src in failed:
                why = failed[src]
                reason = "dead_letter" if why.attempts & DEAD_NOW else "explicit"
                batches.setdefault(k, ShardBatch()).fails.append((src, reason, why.error))
                self.sent.setdefault("", {})[src] = why.stage
            elif src not in unconfirmed:
                done.setdefault(k, []).append((src, cur))
        for k, pairs in done.items():
            b = batches.setdefault(k, ShardBatch())
            b.xor_srcs = np.array([s for s, _ in pairs], np.uint64)
            b.xor_deltas = np.array([c for _, c in pairs], np.uint64)
        if batches:
            tally = self.layer.acker.apply(batches, token=f"{self.plan.salt:x}:replays")
            if tally.duplicates:  # applied by an earlier call: its outcomes are not known
                self.sent.pop("", None)
            self.settled.merge(tally)
            self.calls += len(batches)

    def _count_outcomes(self) -> None:
        """Count each failed row this run settled as replayed or dead-lettered (as Redis
        decided it) in the stage it failed in; rows of segments an earlier run settled
        are not counted again."""
        dead = set(self.settled.dead_ids)
        skipped = set(self.settled.skipped_members)
        stages = self.result.stages
        for member, sent in self.sent.items():
            if member in skipped:
                continue
            for src, label in sent.items():
                counts = stages.setdefault(label, StageCounts())
                if src in dead:
                    counts.dead_lettered += 1
                else:
                    counts.replayed += 1
