"""The settle phase of a batch: what its job left undone (its residues) becomes per-record
entries in Redis, and everything else of the batch is complete.

Every stage kind ends its execute phase with one :class:`Residues` value -- failed rows
with their first error, rows whose writes were not confirmed, the replays that ran --
however it collected them (task summaries, or Spark observations), and one
:class:`Settlement` writes it:

* a segment of the batch (fresh rows stored per task, or the failed rows of a source
  kept by reference, stored as a segment now) is settled by one script call per shard
  (lua/segment_settle.lua): its residues become replays (or dead letters past their
  budget) or pending entries with a live timeout, the rest of its rows complete, and the
  segment is deleted -- the segment itself is the idempotency token of that work;
* replays that ran are completed, failed ones failed, under a token owned by this batch
  run (``<salt>:replays``); a replay kept by reference whose row the job did not read is
  dead-lettered with an error naming its location;
* each failed row's outcome (replayed, dead-lettered) is counted in the stage it failed
  in, as Redis decided it.

Invariant: nothing is completed that is not known complete. With ``fold_ok`` False (a
task's output lost or counted twice) every row of the batch's segments is kept pending
and the replays stay pending: they all replay (at least once).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ftlayer.acker import ShardBatch
from ftlayer.ids import is_local, shard_of, shards_of, split_local
from ftlayer.limits import DEAD_NOW
from ftlayer.lineage import LINEAGE_META
from ftlayer.segments import frames_of_rows, unit_source_id
from ftlayer.spark.plan import SOURCE_STAGE
from ftlayer.spark.references import not_found
from ftlayer.spark.results import BatchResult, StageCounts
from ftlayer.spark.vector_plan import LOC_COL, POS_COL, VectorPlan
from ftlayer.spark.vector_tasks import segment_bytes
from ftlayer.stage_rows import StageRow, encode_stage_row
from ftlayer.tally import Tally
from ftlayer.wire import BatchSummary

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer

__all__ = ["Failure", "Residues", "Settlement", "kept_payloads"]

log = logging.getLogger(__name__)


class Failure(NamedTuple):
    """A failed residue: its first error, the attempts it used in its batch, the label
    of the stage it failed in (its outcome is counted there) and what was kept of it."""

    error: str
    attempts: int
    stage: str = SOURCE_STAGE
    kept: StageRow | None = None
    """The row kept as the input of the segment it failed in (ftlayer.stage_rows;
    its reference filled in from its segment when it has none yet; None: it is stored as
    its source row)."""


@dataclass
class Residues:
    """What a batch's job left undone, by source id (a fresh row's batch-local id, or a
    replay's persisted one): ``failed`` rows (first error wins), ``unconfirmed`` ones
    (never also failed), and ``by_reference``: fresh rows of a source kept by reference
    that failed, by (location, position) -- they were never stored, and are stored now."""

    failed: dict[int, Failure] = field(default_factory=dict)
    unconfirmed: set[int] = field(default_factory=set)
    by_reference: dict[tuple[int, int], Failure] = field(default_factory=dict)


class Settlement:
    """The settle phase of one batch run (``plan``), its Redis calls counted in
    ``calls`` and what Redis did in ``settled``."""

    def __init__(self, plan: VectorPlan, layer: FTLayer, result: BatchResult, started: float,
                 reads: Any = None, spark: Any = None) -> None:  # fmt: skip
        self.plan, self.layer, self.result, self.started = plan, layer, result, started
        self.reads, self.spark = reads, spark
        self.calls = 0
        self.tables: dict[str, pa.Table | None] = {}
        self.sent: dict[str, dict[int, str]] = {}
        """Failed rows sent to Redis: segment member ('' for replays) -> the id the
        record is failed under (a fresh row's new one) -> the label of its stage."""
        self.settled = Tally()
        self.hold_until = 0.0
        """When the batch's held rows (0 attempts: a stage's breaker held them) may be
        claimed again (epoch seconds; ftlayer.spark.breakers)."""

    def elapsed_ms(self) -> int:
        return max(1, int((time.monotonic() - self.started) * 1000))

    def segment(self, partition: int, member: str) -> pa.Table | None:
        """A segment's rows, read from Redis and decoded once per run (None: gone)."""
        if member not in self.tables:
            blob = self.layer.segments.get(partition, member)
            self.calls += 1
            self.tables[member] = None if blob is None else pa.ipc.open_stream(blob).read_all()
        return self.tables[member]

    # -- segments ---------------------------------------------------------------------
    def segments(self, summaries: list[BatchSummary], res: Residues) -> None:
        """Settle the segments the counted task summaries name (and delete the summaries
        of shuffles); ``res``'s batch-local ids name their rows."""
        store, plan = self.layer.segments, self.plan
        by_partition = _by_partition(res)
        per_shard: dict[int, list[Any]] = {}
        tokens: dict[int, list[int]] = {}
        for s in summaries:
            if s.stage < len(plan.segments) - 1:
                tokens.setdefault(store.token_shard(s.token), []).append(s.token)
            if not s.segment:
                continue
            entry = self._segment_entry(s, res, *by_partition.get(s.partition, ([], [])))
            if entry is not None:
                per_shard.setdefault(store.shard_of_partition(s.partition), []).append(entry)
        _count_later_replays(per_shard, summaries)
        jobs = {k: (per_shard.get(k, []), tokens.get(k, []))
                for k in per_shard.keys() | tokens.keys()}  # fmt: skip
        self._settle_jobs(jobs)

    def _segment_entry(self, s: BatchSummary, res: Residues, fails: list[tuple[int, int]],
                       pends: list[tuple[int, int]]) -> Any:  # fmt: skip
        """One segment's settlement: its failed and pending rows' records (None: the
        segment timed out already, and every row of it replays)."""
        cfg, member, partition = self.layer.config, s.segment or "", s.partition
        keep_all = not self.result.fold_ok
        fail_frames: list[tuple[bytes, str, int]] = []
        pend_frames: list[tuple[bytes, bytes]] = []
        if fails or pends or keep_all:
            table = self.segment(partition, member)
            if table is None:
                return None
            self._remember(table, [r for r, _ in fails + pends], keep_all)
            make: Callable[..., list[bytes]] = partial(
                frames_of_rows, table, shard=self.layer.segments.shard_of_partition(partition),
                source=self.plan.source, partition=partition, max_replays=cfg.max_replays,
                max_payload=cfg.max_record_bytes)  # fmt: skip
            if keep_all:  # pending with a live timeout: any non-zero ack value
                pend_frames = [(f, os.urandom(8)) for f in make(np.arange(s.segment_rows))]
            else:
                if fails:
                    why = [res.failed[src] for _, src in fails]
                    rows = np.array([r for r, _ in fails])
                    frames = make(rows, kept=kept_payloads(why, cfg.max_record_bytes, table, rows))
                    fail_frames = [(f, w.error, w.attempts)
                                   for f, w in zip(frames, why, strict=True)]  # fmt: skip
                    self.sent[member] = {unit_source_id(f): w.stage
                                         for f, w in zip(frames, why, strict=True)}
                if pends:
                    frames = make(np.array([r for r, _ in pends]))
                    pend_frames = [(f, os.urandom(8)) for f in frames]
        return (member, s.segment_rows, fail_frames, pend_frames, s.immediate_replays)

    def _settle_jobs(self, jobs: dict[int, tuple[list[Any], list[int]]]) -> None:
        store, plan = self.layer.segments, self.plan
        batch = store.batch_prefix(plan.source, plan.batch_key)
        replies = store.settle_shards(jobs, salt=plan.salt, batch=batch,
                                      hold_until=self.hold_until,
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

    def copies(self, res: Residues) -> None:
        """Settle the segments a copy pass stored (ftlayer.spark.frame_tasks.CopySource:
        one attempt's per partition, the others dropped)."""
        import msgpack

        plan = self.plan
        raws = self.layer.segments.batch_summaries(plan.source, plan.batch_key)
        self.calls += 2 * len(self.layer.keyspace)
        one: dict[int, dict[str, Any]] = {}
        for raw in raws:
            d = msgpack.unpackb(raw, raw=False)
            one.setdefault(d["partition"], d)
        last = len(plan.segments) - 1  # no summary tokens of shuffles to delete
        self.segments([BatchSummary(stage=last, partition=p, segment=d["segment"],
                                    segment_rows=d["rows"]) for p, d in sorted(one.items())],
                      res)  # fmt: skip

    def by_reference(self, fresh: dict[tuple[int, int], Failure], rows: int) -> None:
        """Fresh rows of a source kept by reference that failed, stored as records kept by
        reference and queued for replay with their errors: a segment of them per shard,
        stored then settled at once (one segment on shard 0 when none failed: it counts
        the batch's ``rows`` and marks the batch settled)."""
        store, cfg, plan = self.layer.segments, self.layer.config, self.plan
        n = len(self.layer.keyspace)
        refs = list(fresh.items())
        if self.reads is not None and refs:
            self.reads.remember(self.spark, sorted({loc for (loc, _), _ in refs}))
        batch = store.batch_prefix(plan.source, plan.batch_key)
        jobs: dict[int, tuple[list[Any], list[int]]] = {}
        puts: list[tuple[int, str, bytes | memoryview]] = []
        elsewhere = len(refs) - len(refs[0::n])
        for shard in range(n):
            mine = refs[shard::n]
            if not mine and shard:
                continue
            table = pa.RecordBatch.from_pydict({
                LOC_COL: pa.array([loc for (loc, _), _ in mine], pa.int64()),
                POS_COL: pa.array([pos for (_, pos), _ in mine], pa.int64())},
                metadata={LINEAGE_META: b"ref"})  # fmt: skip
            member = store.member(plan.source, plan.batch_key, shard, store.new_token(shard))
            puts.append((shard, member, segment_bytes([table], cfg.segment_codec)))
            frames = frames_of_rows(table, np.arange(len(mine)), shard=shard,
                                    source=plan.source, partition=shard,
                                    max_replays=cfg.max_replays,
                                    max_payload=cfg.max_record_bytes,
                                    kept=kept_payloads([why for _, why in mine],
                                                      cfg.max_record_bytes))  # fmt: skip
            fails = [(f, why.error, why.attempts)
                     for f, (_, why) in zip(frames, mine, strict=True)]  # fmt: skip
            # shard 0's segment also counts the rows that completed (persisted, completed)
            seg_rows = max(rows - elsewhere, len(mine)) if shard == 0 else len(mine)
            jobs[shard] = ([(member, seg_rows, fails, [], 0)], [])
            self.sent[member] = {unit_source_id(f): why.stage
                                 for f, (_, why) in zip(frames, mine, strict=True)}  # fmt: skip
        self.calls += store.put_many(puts, plan.salt, batch)  # all stored, then settled
        self._settle_jobs(jobs)

    # -- replays ----------------------------------------------------------------------
    def replays(self, ran: dict[int, int], references: dict[int, tuple[int, int, int]],
                res: Residues) -> None:  # fmt: skip
        """Complete the replays that ran (``ran``: source id -> current id) and finished,
        fail those that failed; a replay kept by reference (``references``) that did not
        run had its row not found: dead-lettered, named."""
        ran = dict(ran)
        self._not_found(ran, references, res)
        if not ran or not self.result.fold_ok:
            return  # kept pending: their timeouts replay them
        shards = self.layer.config.shards
        batches: dict[int, ShardBatch] = {}
        n = len(ran)
        srcs = np.fromiter(ran.keys(), np.uint64, n)
        curs = np.fromiter(ran.values(), np.uint64, n)
        # (arrays: 20-30 times cheaper a replay than a loop over them, and a batch may
        # run hundreds of thousands)
        failed = np.fromiter((s in res.failed for s in ran), bool, n)
        undone = failed | np.fromiter((s in res.unconfirmed for s in ran), bool, n) \
            if res.unconfirmed else failed
        for src in srcs[failed].tolist():
            why = res.failed[src]
            reason = ("dead_letter" if why.attempts & DEAD_NOW else
                      "held" if why.attempts == 0 else "explicit")  # fmt: skip
            batches.setdefault(shard_of(src, shards), ShardBatch()).fails.append(
                (src, reason, why.error, self._kept_again(src, why, references)))
            self.sent.setdefault("", {})[src] = why.stage
        done_srcs, done_curs = srcs[~undone], curs[~undone]
        where = shards_of(done_srcs, shards)
        for k in np.unique(where).tolist():
            b = batches.setdefault(k, ShardBatch())
            mine = where == k
            b.xor_srcs, b.xor_deltas = done_srcs[mine], done_curs[mine]
        if batches:
            tally = self.layer.acker.apply(batches, token=f"{self.plan.salt:x}:replays",
                                           hold_until=self.hold_until)  # fmt: skip
            if tally.duplicates:  # applied by an earlier call: its outcomes are not known
                self.sent.pop("", None)
            self.settled.merge(tally)
            self.calls += len(batches)

    def _kept_again(self, src: int, why: Failure,
                    references: dict[int, tuple[int, int, int]]) -> bytes | None:  # fmt: skip
        """The payload a replay read back from its source (``references``) that failed
        again is stored with from now on: the row kept as the input of the stage it
        failed in, naming its source record (None: none kept, or over
        ``max_record_bytes``: it stays a reference)."""
        ref = references.get(src)
        if why.kept is None or ref is None:
            return None
        payload = encode_stage_row(why.kept._replace(location=ref[1], position=ref[2]))
        if len(payload) > self.layer.config.max_record_bytes:
            return None
        self.result.kept_again += 1
        return payload

    def _not_found(self, ran: dict[int, int], references: dict[int, tuple[int, int, int]],
                   res: Residues) -> None:  # fmt: skip
        """Replays kept by reference that the job did not run: their rows were not read
        back (the file gone or rewritten). Dead-lettered with the replays, named (after
        the read-back: its listing names the files that still exist)."""
        for src, (cur, loc, pos) in references.items():
            if src in ran:
                continue
            text = not_found(self.reads, loc, pos)
            ran[src] = cur
            res.failed[src] = Failure(text, 1 | DEAD_NOW)
            self.result.undecodable += 1
            self.result.note(self.result.errors, text)
            log.error("replay rejected batch_id=%s %s", self.result.batch_id, text)

    # -- outcomes ---------------------------------------------------------------------
    def count_outcomes(self) -> None:
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


def _by_partition(res: Residues) -> dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]]:
    """The fresh residues (batch-local ids) by source partition: (failed, unconfirmed),
    each as (row, source id) pairs."""
    out: dict[int, tuple[list[tuple[int, int]], list[tuple[int, int]]]] = {}
    for src_set, slot in ((res.failed.keys(), 0), (res.unconfirmed, 1)):
        srcs = np.fromiter(src_set, np.uint64, len(src_set))
        fresh = srcs[is_local(srcs)]
        parts, rows = split_local(fresh)
        for p, row, src in zip(parts.tolist(), rows.tolist(), fresh.tolist(), strict=True):
            out.setdefault(p, ([], []))[slot].append((row, src))
    return out


def _count_later_replays(per_shard: dict[int, list[Any]], summaries: list[BatchSummary]) -> None:
    """The failed attempts that tasks past a shuffle replayed at once (they hold no
    segment) counted with the batch's first segment, so the layer's counters see every
    attempt (a batch whose segments all timed out replays every row anyway)."""
    later = sum(s.immediate_replays for s in summaries if not s.segment)
    if not later or not per_shard:
        return
    entries = per_shard[min(per_shard)]
    member, rows, fails, pends, immediate = entries[0]
    entries[0] = (member, rows, fails, pends, immediate + later)


def kept_payloads(why: list[Failure], max_bytes: int, table: pa.Table | None = None,
                  rows: np.ndarray | None = None) -> list[bytes | None]:  # fmt: skip
    """The stored payloads of the failed rows kept as a segment's input, aligned with
    ``why`` (None: stored as its source row -- none kept, or over ``max_bytes``; empty:
    none kept at all). A kept row without its reference gets it from its segment
    (``table``'s ``rows``, when the segment holds references)."""
    if all(w.kept is None for w in why):
        return []
    refs = None
    if table is not None and rows is not None and LOC_COL in table.schema.names:
        refs = (table.column(LOC_COL).take(pa.array(rows)).to_pylist(),
                table.column(POS_COL).take(pa.array(rows)).to_pylist())
    out: list[bytes | None] = []
    for i, w in enumerate(why):
        row = w.kept
        if row is not None and row.location is None and refs is not None:
            row = row._replace(location=refs[0][i], position=refs[1][i])
        payload = None if row is None else encode_stage_row(row)
        out.append(None if payload is None or len(payload) > max_bytes else payload)
    return out
