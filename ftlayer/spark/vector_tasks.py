"""Executor side of the vectorized path: ``mapInArrow`` tasks with ids as a column.

Every row crossing a shuffle carries one int64 column, ``__ft_src``: the id of its source
record (batch-local for fresh rows: partition and row index of its segment; the persisted
id for replays). A task runs its segment's batch stages chained and folds, with numpy,
what crossed its edges into ONE 64-bit value for the whole task: each row it sends into a
shuffle adds ``h_e(src)``, each row it receives subtracts it (ftlayer.ids.edge_hashes), so
the batch's folds sum to 0 mod 2**64 exactly when every row sent was received once. This
is Storm's XOR ledger at batch scope: a record's current ids inside a task cancel and are
never made; at an edge the current id is implicit in (source id, edge), and a sum instead
of an XOR keeps siblings with one source id from cancelling each other. Rows that fail,
and sink rows whose writes were not confirmed, are reported by source id as *residues*:
only those ever become per-record Redis entries.

A task's summary (fold, residues, counts) must count exactly when its output does
(invariant 11: one attempt counts). A task whose output goes through a shuffle stores its
summary in Redis under a random token and emits one *marker row* with its data (null
user columns, the token inside a batch-local ``__ft_src``, see ftlayer.ids.marker_id);
the task that consumes the marker passes the token on, and the last stage's tasks return
their summaries as their output rows, which the driver collects. So the driver reads the
summaries of exactly the attempts whose rows were consumed. A source task stores its
fresh rows as one segment (Arrow IPC) in the same Redis round trip as its summary (see
ftlayer.segments).

Ids of fresh rows are a function of (partition, row index): every attempt of a task that
reads its input in the same order emits the same ids, and the summary that counts names
the segment written by the same attempt, so residues always point at the right rows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa

from ftlayer.ids import (
    batch_source_ids,
    edge_hashes,
    fold_sum,
    is_local,
    marker_id,
    split_local,
)
from ftlayer.limits import DEAD_NOW
from ftlayer.lineage import LINEAGE_META, copy_lineage, reference_lineage
from ftlayer.payloads import arrow_codecs, encode_record
from ftlayer.spark.chain import Chain, TaskRun, note_failures, run_chain, u64_ids
from ftlayer.spark.plan import SOURCE_STAGE
from ftlayer.spark.policy import BatchContext, breaker_open
from ftlayer.spark.vector_plan import (
    ATT_COL,
    CUR_COL,
    LIN_COL,
    LOC_COL,
    REF_COLS,
    SRC_COL,
    SUMMARY_COL,
    VectorPlan,
)
from ftlayer.spark.worker import task_context, worker_layer

__all__ = ["GATHERED_BYTES", "GATHERED_ROWS", "Gathered", "run_vector_task", "segment_bytes"]

log = logging.getLogger(__name__)

_MARKER_HIGH = np.uint64(int(marker_id(0)) >> 40)
GATHERED_ROWS, GATHERED_BYTES = 8192, 8 << 20
"""A task replays the failed rows it gathered when this many rows (or bytes) wait, and at
its end (:class:`Gathered`)."""
TASK_KEPT_BYTES = 16 << 20
"""The bytes of kept rows a task's summary carries at most, without ``max_kept_bytes``."""


def _markers(src: np.ndarray) -> np.ndarray:
    return (src >> np.uint64(40)) == _MARKER_HIGH


def _may_hold_markers(user: pa.RecordBatch, key: str | None) -> bool:
    """False when a user column other than the record key (which carries the marker's id)
    has no nulls (a marker row is null in every one): the per-row test is then skipped
    (Arrow knows a column's null count)."""
    for i, name in enumerate(user.schema.names):
        if name != key:
            return user.column(i).null_count > 0
    return True


def _valid_keys(
    plan: VectorPlan,
    task: TaskRun,
    batch: pa.RecordBatch,
    src: np.ndarray,
    before: np.ndarray | None,
) -> tuple[pa.RecordBatch, np.ndarray, np.ndarray | None]:
    """With a record key: the rows whose key is null or negative are dead-lettered now
    (a negative key would read as a marker past the shuffle), each with an error naming
    it; the rest go on. Without one: everything goes on."""
    if not plan.record_key:
        return batch, src, before
    col = batch.column(plan.record_key)
    bad = np.asarray(col.fill_null(-1).to_numpy(zero_copy_only=False)) < 0
    if not bad.any():
        return batch, src, before
    rows = np.flatnonzero(bad)
    texts = [f"record_key {plan.record_key!r} is {col[int(i)].as_py()}: a record key must be "
             "a non-negative integer" for i in rows]  # fmt: skip
    note_failures(task, texts[:1])
    _residue(task, src[rows], texts, [SOURCE_STAGE] * len(rows), 1 | DEAD_NOW)
    good = ~bad
    return (batch.filter(pa.array(good)), src[good],
            None if before is None else before[good])  # fmt: skip


def _run_with_replays(
    plan: VectorPlan,
    task: TaskRun,
    batch: pa.RecordBatch,
    src: np.ndarray,
    budget: int,
    before: np.ndarray | None,
    lin: np.ndarray | None,
    stage: int,
    retryable: np.ndarray | None,
    retries: _Retries,
) -> Iterator[pa.RecordBatch]:
    """Run segment ``stage`` over ``batch``; its failed rows are replayed at once, in this
    task, up to the plan's ``immediate_replays`` times (``budget`` 0: none are), Storm's
    spout re-emitting a failed tuple, at the stage that holds the row (past a shuffle too,
    so the source is not read again): gathered in ``retries`` with the failures of the
    task's other input batches and replayed together (:class:`_Retries`). A replay takes
    the same path as its first attempt, so it lands where Spark places its key. Rows still
    failing become residues with the number of attempts they used; rows to dead-letter now
    are not replayed, nor rows ``retryable`` excludes (a claimed replay past a shuffle: its budget
    is in Redis), nor rows of a stage whose breaker tripped (ftlayer.spark.breakers);
    those of a stage open for this batch are held: residues with 0 attempts, none charged
    (the stage was not called).
    ``before``: attempts each row failed already (a claimed replay's), for stage contexts
    (None: fresh rows, 0). ``lin``: each row's lineage id (None: not wanted)."""
    prior = np.zeros(len(src), np.int32) if before is None else before
    ctx = None
    if plan.wants_context[stage]:  # past a shuffle a row's attempts are not known
        ctx = _context(plan, task, stage, src, None if stage else prior + 1, lin)
    chain = run_chain(plan, stage, task, batch, src, ctx, lin)
    if chain.out is not None:
        yield chain.out
    keep = _Keep(plan, stage, batch)
    chain = _not_replayed(plan, task, src, chain, 1, batch.num_rows, retryable, keep)
    if not len(chain.failed):
        return
    if budget < 1:
        _residue(task, src[chain.failed], chain.texts, chain.stages, 1,
                 keep(task, chain.failed, src))  # fmt: skip
        return
    rows, first = np.unique(chain.failed, return_index=True)
    task.replayed_now([chain.stages[i] for i in first.tolist()])
    part = batch.take(pa.array(rows))
    retries.add(_Pending(part, src[rows], prior[rows], None if lin is None else lin[rows]),
                part)  # fmt: skip


class _Pending(NamedTuple):
    """Rows a first pass failed, to replay at once: their input, source ids, the attempts
    they had failed before it, their lineage ids (or None)."""

    batch: pa.RecordBatch
    src: np.ndarray
    prior: np.ndarray
    lin: np.ndarray | None


T = TypeVar("T")


class Gathered(Generic[T]):
    """The failed rows a task replays at once, gathered across its input batches (Spark
    hands a ``mapInArrow`` task batches of about 10,000 rows): with a few percent failing,
    a replay per input batch calls each stage again on a few hundred rows, then a few,
    then one, and the calls' fixed costs outweigh the rows'. Gathered (``parts``, one an
    input batch), they are replayed when :data:`GATHERED_ROWS` rows or
    :data:`GATHERED_BYTES` bytes wait, and at the task's end. Replayed rows come out after
    the batches they came in with: a retried row keeps no order."""

    def __init__(self) -> None:
        self.parts: list[T] = []
        self.rows = self.bytes = 0

    def add(self, part: T, batch: pa.RecordBatch) -> None:
        """Gather ``part``, whose rows are ``batch``'s."""
        self.parts.append(part)
        self.rows += batch.num_rows
        self.bytes += batch.nbytes

    def due(self) -> bool:
        return self.rows >= GATHERED_ROWS or self.bytes >= GATHERED_BYTES

    def take(self) -> list[T]:
        """The parts gathered (none wait after)."""
        parts, self.parts, self.rows, self.bytes = self.parts, [], 0, 0
        return parts


class _Retries(Gathered[_Pending]):
    """A segment task's :class:`Gathered` rows, replayed at the task's end before its
    summary (a replay's outcome counts in the task that ran it)."""

    def __init__(self, plan: VectorPlan, task: TaskRun, stage: int) -> None:
        super().__init__()
        self.plan, self.task, self.stage = plan, task, stage

    def replay(self) -> Iterator[pa.RecordBatch]:
        """Replay the rows waiting (all of them, as one batch)."""
        parts = self.take()
        if not parts:
            return
        lins = [p.lin for p in parts]
        pending = _Pending(
            pa.concat_batches([p.batch for p in parts]),
            np.concatenate([p.src for p in parts]),
            np.concatenate([p.prior for p in parts]),
            None if lins[0] is None else np.concatenate(lins))  # type: ignore[arg-type]
        yield from _replay_now(self.plan, self.task, self.stage, pending,
                               self.plan.immediate_replays)  # fmt: skip


def _replay_now(plan: VectorPlan, task: TaskRun, stage: int, pending: _Pending,
                budget: int) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """Replay ``pending`` (each row failed once in this task) through segment ``stage``
    until it passes or has used ``budget`` replays; what still fails becomes residues with
    the attempts it used."""
    batch, src, prior, lin = pending
    keep = _Keep(plan, stage, batch)
    rows = np.arange(batch.num_rows)
    attempts = 1
    while True:
        sub = None
        sub_lin = None if lin is None else lin[rows]
        if plan.wants_context[stage]:
            sub = _context(plan, task, stage, src[rows], prior[rows] + attempts + 1, sub_lin)
        part = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows))
        retry = run_chain(plan, stage, task, part, src[rows], sub, sub_lin)
        chain = Chain(retry.out, rows[retry.failed], retry.texts, retry.dead, retry.stages)
        attempts += 1
        if chain.out is not None:
            yield chain.out
        chain = _not_replayed(plan, task, src, chain, attempts, 0, None, keep)
        if not len(chain.failed) or attempts > budget:
            break
        rows, first = np.unique(chain.failed, return_index=True)
        task.replayed_now([chain.stages[i] for i in first.tolist()])
    _residue(task, src[chain.failed], chain.texts, chain.stages, attempts,
             keep(task, chain.failed, src))  # fmt: skip


def _not_replayed(plan: VectorPlan, task: TaskRun, src: np.ndarray, chain: Chain,
                  attempts: int, rows: int, retryable: np.ndarray | None,
                  keep: _Keep) -> Chain:  # fmt: skip
    """Make residues of the failures no replay at once is for -- rows to dead-letter now;
    on a first pass (``rows``: its input rows; 0 after), rows the breakers hold or
    tripped on; rows ``retryable`` excludes -- after ``attempts`` (kept as their
    segment's input where ``keep`` says); the rest, to replay."""
    parts = [(chain.dead, attempts | DEAD_NOW)]
    if rows and len(chain.failed):
        held, tripped = _breakers(plan, task, chain, rows)
        parts += [(held & ~chain.dead, 0), (tripped & ~chain.dead, 1)]
    if retryable is not None:
        parts.append((~retryable[chain.failed], attempts))
    done = np.zeros(len(chain.failed), bool)
    for mask, charged in parts:
        mask = mask & ~done
        if mask.any():
            part = chain.only(mask)
            _residue(task, src[part.failed], part.texts, part.stages, charged,
                     keep(task, part.failed, src))  # fmt: skip
            done |= mask
    return chain.only(~done) if done.any() else chain


def _breakers(plan: VectorPlan, task: TaskRun, chain: Chain,
              rows: int) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Of a first pass's failures over ``rows`` input rows: those *held* by a stage open
    for this batch (not called, so no attempt is charged; counted as held already), and
    those of a stage whose breaker *tripped* here (most of its rows failed: they were
    called, so the attempt counts, but they are not replayed at once)."""
    stages = np.array(chain.stages, dtype=object)
    held = np.zeros(len(chain.failed), bool)
    tripped = np.zeros(len(chain.failed), bool)
    labels, counts = np.unique(stages, return_counts=True)
    for label, n in zip(labels.tolist(), counts.tolist(), strict=True):
        if label in plan.open_stages:
            held |= stages == label
        elif breaker_open(plan.policies.get(label, plan.errors), n, rows):
            tripped |= stages == label
    return held, tripped


def _note_replays(plan: VectorPlan, task: TaskRun, batch: pa.RecordBatch, keep: np.ndarray) -> None:
    """Report the replays this task ran: (source id, current id) each, and its record key
    (with ``record_key``: a replay failing past a shuffle is reported by it)."""
    task.add(rep_src=u64_ids(batch.column(SRC_COL))[keep],
             rep_cur=u64_ids(batch.column(CUR_COL))[keep])
    if plan.record_key:
        task.add(rep_key=u64_ids(batch.column(plan.record_key).fill_null(-1))[keep])


def _key_lineage(plan: VectorPlan, batch: pa.RecordBatch) -> np.ndarray:
    """With ``record_key``: the lineage id is the key."""
    assert plan.record_key is not None
    return u64_ids(batch.column(plan.record_key)).view(np.int64)


def _fresh_lineage(
    plan: VectorPlan, part: pa.RecordBatch, ids: np.ndarray, refs: pa.RecordBatch | None
) -> np.ndarray:
    """The lineage ids of fresh rows (ftlayer.lineage): their key, their reference's hash
    or their batch-local id's."""
    if plan.record_key:
        return _key_lineage(plan, part)
    if refs is not None:
        loc, pos = (u64_ids(refs.column(c)).view(np.int64) for c in REF_COLS)
        return reference_lineage(plan.source, loc, pos)
    return copy_lineage(plan.lineage_seed, ids)


def _first_of_each(src: np.ndarray, replays: np.ndarray) -> np.ndarray:
    """``replays`` (a row mask) keeping the first row of each source id: a replay kept by
    reference whose file holds identical rows (one reference) is read back once each."""
    rows = np.flatnonzero(replays)
    _, first = np.unique(src[rows], return_index=True)
    if len(first) == len(rows):
        return replays
    keep = np.zeros(len(src), bool)
    keep[rows[first]] = True
    return keep


def _context(
    plan: VectorPlan,
    task: TaskRun,
    stage: int,
    src: np.ndarray,
    attempts: np.ndarray | None,
    lin: np.ndarray | None = None,
) -> BatchContext:
    """The context of one input batch (cheap: no copies until a stage asks for one)."""

    def reset() -> None:  # the batch's segments, and the rows stored as records
        layer = worker_layer(plan.config)
        layer.segments.touch_batch(plan.source, plan.batch_key)
        stored = src[~is_local(src)]
        if len(stored):
            layer.reset_timeout([int(x) for x in stored])

    before = np.full(len(src), True) if plan.run_again else ~is_local(src)
    if plan.record_key and stage:  # past a shuffle the ids are keys: replays unknown
        before = np.full(len(src), True)
    if attempts is not None:  # a fresh row replayed at once in its task: attempt 2 on
        before |= attempts > 1
    batch_id = int(plan.batch_key) if plan.batch_key.isdigit() else None
    return BatchContext(src, attempts, task.partition, task.attempt, stage, reset, lin,
                        before, batch_id, plan.salt)  # fmt: skip


def _residue(task: TaskRun, src: np.ndarray, texts: list[str], stages: list[str],
             attempts: int, kept: tuple[np.ndarray, list[bytes]] | None = None,
             ) -> None:  # fmt: skip
    """Failed rows (by source id) with their errors and the labels of the stages they
    failed in, after ``attempts`` failed attempts each (with the ``DEAD_NOW`` bit:
    dead-lettered at settlement whatever their budget); ``kept``: the source ids and
    bodies of those kept as their segment's input (_Keep)."""
    if len(src):
        task.add(failed_src=src, failed_att=np.full(len(src), attempts, np.uint16))
        task.failed_err.extend(texts)
        task.failed_stage.extend(stages)
    if kept is not None and len(kept[0]):
        task.add(kept_src=kept[0])
        task.kept_body.extend(kept[1])


class _Keep:
    """Which failed rows of a task are kept as its segment's input (VectorPlan.keeps;
    ftlayer.stage_rows): past a shuffle, fresh ones (a replay keeps the row it was stored
    as); in a source task, replays (one read back from its source is then not read back
    again: the driver stores the row in its place; a fresh row goes back to its source,
    read back once). Each input row once, as msgpack maps of its input columns, up to
    ``max_kept_rows`` and ``max_kept_bytes`` (default :data:`TASK_KEPT_BYTES`) a task and
    ``max_record_bytes`` a row: they travel in its summary. Every failed input row of
    those is reported, the ones not kept with an empty body: the driver keeps a record
    only when one row of it failed (ftlayer.spark.vector_entries.kept_rows)."""

    def __init__(self, plan: VectorPlan, stage: int, batch: pa.RecordBatch) -> None:
        self.on, self.fresh = plan.keeps, stage > 0
        self.batch, self.most = batch, plan.config.max_kept_rows
        self.max_bytes = plan.config.max_record_bytes - 64
        self.budget = plan.config.max_kept_bytes or TASK_KEPT_BYTES

    def __call__(self, task: TaskRun, rows: np.ndarray,
                 src: np.ndarray) -> tuple[np.ndarray, list[bytes]] | None:  # fmt: skip
        if not self.on or not len(rows):
            return None
        rows = np.unique(rows)
        local = is_local(src[rows])
        rows = rows[local if self.fresh else ~local]
        if not len(rows):
            return None
        room = max(self.most - len(task.kept_body), 0)
        codecs = arrow_codecs(self.batch.schema)
        taken = self.batch.take(pa.array(rows[:room])).to_pylist()
        bodies = [encode_record(r, codecs) for r in taken] + [b""] * (len(rows) - len(taken))
        left = self.budget - sum(map(len, task.kept_body))  # the summary's bytes, bounded
        out = []
        for b in bodies:
            keep = 0 < len(b) <= min(self.max_bytes, left)
            left -= len(b) if keep else 0
            out.append(b if keep else b"")
        return src[rows], out


def run_vector_task(
    plan: VectorPlan, stage: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of segment ``stage`` (see the module docstring)."""
    plan = plan.in_task()
    partition, attempt = task_context()
    ft = plan.config.enabled
    task = TaskRun(stage, partition, attempt)
    names = plan.inputs[stage].names
    final = stage == len(plan.segments) - 1
    fresh: list[pa.RecordBatch] = []
    retries = _Retries(plan, task, stage)
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if not ft:
            out = run_chain(plan, stage, task, batch.select(names), None).out
            if out is not None:
                yield out
        elif stage == 0:
            yield from _source_batch(plan, task, batch, batch.select(names), fresh, retries)
        else:
            yield from _shuffled_batch(plan, stage, task, batch, batch.select(names), retries)
        if retries.due():
            yield from retries.replay()
    yield from retries.replay()
    yield from _finish(plan, stage, task, fresh, final)


def _source_batch(plan: VectorPlan, task: TaskRun, batch: pa.RecordBatch,
                  user: pa.RecordBatch, fresh: list[pa.RecordBatch],
                  retries: _Retries) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """One input batch of a source task: fresh rows (no id yet: given batch-local ids,
    kept for the task's segment; their failures replayed at once, gathered in
    ``retries``) and claimed replays (their persisted ids)."""
    has_ids = SRC_COL in batch.schema.names
    by_ref = LOC_COL in batch.schema.names
    if has_ids:
        src = u64_ids(batch.column(SRC_COL))
        is_fresh = src == 0
        n_fresh = int(is_fresh.sum())
    else:  # no replays were claimed: every row is fresh
        n_fresh = batch.num_rows
    if n_fresh:
        part = user if n_fresh == batch.num_rows else user.filter(pa.array(is_fresh))
        ids = batch_source_ids(task.partition, task.fresh, n_fresh)
        task.fresh += n_fresh
        if by_ref:  # the segment holds every fresh row's reference, bad keys too
            # (and its record key: failures past a shuffle are reported by key)
            key = (plan.record_key,) if plan.record_key else ()
            refs = batch.select([*REF_COLS, *key])
            fresh.append(refs if n_fresh == batch.num_rows else
                         refs.filter(pa.array(is_fresh)))  # fmt: skip
        else:  # the segment holds every fresh row, bad keys too
            fresh.append(part)
        refs_now = fresh[-1] if by_ref else None
        part, ids, _ = _valid_keys(plan, task, part, ids, None)
        lin = _fresh_lineage(plan, part, ids, refs_now) if plan.wants_lineage[0] else None
        yield from _run_with_replays(plan, task, part, ids, plan.immediate_replays,
                                     None, lin, 0, None, retries)  # fmt: skip
    if n_fresh < batch.num_rows:  # claimed replays: their budget is in Redis
        keep = _first_of_each(src, ~is_fresh)
        task.replayed += int(keep.sum())
        _note_replays(plan, task, batch, keep)
        before = None
        if ATT_COL in batch.schema.names:
            att = batch.column(ATT_COL).fill_null(0).to_numpy(zero_copy_only=False)
            before = np.asarray(att, np.int32)[keep]
        part, ids, before = _valid_keys(plan, task, user.filter(pa.array(keep)),
                                        src[keep], before)  # fmt: skip
        lin = None
        if plan.wants_lineage[0]:
            lin = (_key_lineage(plan, part) if plan.record_key else
                   u64_ids(batch.column(LIN_COL))[keep].view(np.int64))  # fmt: skip
        yield from _run_with_replays(plan, task, part, ids, 0, before, lin, 0, None, retries)


def _shuffled_batch(plan: VectorPlan, stage: int, task: TaskRun, batch: pa.RecordBatch,
                    user: pa.RecordBatch, retries: _Retries) -> Iterator[pa.RecordBatch]:
    """One input batch of a task past a shuffle: markers' tokens noted, what crossed the
    edge folded, the segment's stages run."""
    src = u64_ids(batch.column(plan.record_key or SRC_COL))
    lin = None
    if plan.wants_lineage[stage]:
        lin = (src.view(np.int64) if plan.record_key else
               u64_ids(batch.column(LIN_COL)).view(np.int64))  # fmt: skip
    if _may_hold_markers(user, plan.record_key) and (markers := _markers(src)).any():
        task.upstream.extend(split_local(src[markers])[1].tolist())
        keep = ~markers
        user, src = user.filter(pa.array(keep)), src[keep]
        lin = None if lin is None else lin[keep]
        if user.num_rows == 0:
            return
    task.fold -= fold_sum(edge_hashes(src, plan.edge_salts[stage - 1]))  # received
    if plan.keeps and (stored := ~is_local(src)).any():  # replays: entered here, or not
        task.add(rep_src=src[stored], rep_cur=np.zeros(int(stored.sum()), np.uint64))
    # a fresh row is replayed at once here, at the stage that holds it; a claimed replay
    # (or any row, when the ids past the shuffle are record keys) waits in the queue
    retryable = None if plan.record_key else is_local(src)
    budget = plan.immediate_replays if retryable is not None and retryable.any() else 0
    if plan.replay_from == "source":  # Storm's rule: back to the source, every stage again
        budget = 0
    yield from _run_with_replays(plan, task, user, src, budget, None, lin, stage, retryable,
                                 retries)  # fmt: skip


def _finish(
    plan: VectorPlan, stage: int, task: TaskRun, fresh: list[pa.RecordBatch], final: bool
) -> Iterator[pa.RecordBatch]:
    """Store or return the task's summary (and, in a source task, its segment)."""
    if not plan.config.enabled:
        if final:
            yield _summary_batch(task.pack(0, None, 0))
        return
    store = worker_layer(plan.config).segments
    shard = store.shard_of_partition(task.partition)
    token = store.new_token(shard)
    if stage == 0:
        member = None
        blob: bytes | memoryview = b""
        rows = sum(b.num_rows for b in fresh)
        if rows:
            member = store.member(plan.source, plan.batch_key, task.partition, token)
            blob = segment_bytes(fresh, plan.config.segment_codec, _lineage_meta(plan))
        summary = task.pack(token, member, rows)
        batch = store.batch_prefix(plan.source, plan.batch_key)
        # without a shuffle the summary travels as the task's result, else through Redis
        store.put(task.partition, member or "", blob, token, b"" if final else summary,
                  plan.salt, batch)  # fmt: skip
        if final:
            yield _summary_batch(summary)
            return
    else:
        summary = task.pack(token, None, 0)
        if final:
            yield _summary_batch(summary)
            return
        store.put_summary(token, summary, plan.salt,
                          store.batch_prefix(plan.source, plan.batch_key))  # fmt: skip
    marker = pa.array(np.array([marker_id(token)], np.uint64).view(np.int64))
    fields = plan.inputs[stage + 1]
    if plan.record_key:  # the marker's id in the key column, null elsewhere
        arrays = [marker if f.name == plan.record_key else pa.nulls(1, f.type) for f in fields]
    else:
        arrays = [*(pa.nulls(1, f.type) for f in fields), marker]
        if plan.lineage is not None:
            arrays.append(pa.nulls(1, pa.int64()))
    yield pa.RecordBatch.from_arrays(arrays, schema=plan.id_schemas[stage])


def _lineage_meta(plan: VectorPlan) -> bytes:
    """How the rows of this batch's segments got their lineage ids (LINEAGE_META)."""
    if plan.record_key:
        return f"key:{plan.record_key}".encode()
    return f"seed:{plan.lineage_seed}".encode()


def segment_bytes(batches: list[pa.RecordBatch], codec: str, lineage: bytes = b"ref") -> memoryview:
    """A segment: the fresh rows as one Arrow IPC stream (``pa.ipc.open_stream`` reads it
    back), compressed by ``codec`` (FTConfig.segment_codec), as a view that the connection
    sends without copying (ftlayer.connection.BufferPacker). Uncompressed, the stream is
    sized first (a mock stream counts bytes without copying any) and written once into a
    buffer of that size: no growing buffer's copies (half the CPU). Compression runs on
    this thread: the task's cores are busy with Spark's own work, so a handoff to Arrow's
    pool costs more than it saves.
    ``lineage``: how its rows' lineage ids are made (LINEAGE_META; a segment of
    references says ``ref`` whatever it is given, unless it names a key)."""
    options = pa.ipc.IpcWriteOptions(compression=None if codec == "none" else codec,
                                     use_threads=False)  # fmt: skip
    if batches[0].schema.names[:2] == list(REF_COLS):  # references: a location stored once
        refs = pa.Table.from_batches(batches).combine_chunks()
        loc = refs.column(0).dictionary_encode()
        encoded = refs.set_column(0, LOC_COL, loc)  # (no rows: no batches; one empty)
        batches = encoded.to_batches() or [pa.RecordBatch.from_pylist([], encoded.schema)]
        if not lineage.startswith(b"key:"):
            lineage = b"ref"
    meta = {LINEAGE_META: lineage}
    batches = [b.replace_schema_metadata(meta) for b in batches]

    def write(sink: Any) -> None:
        with pa.ipc.new_stream(sink, batches[0].schema, options=options) as writer:
            for b in batches:
                writer.write_batch(b)

    if codec != "none":
        out = pa.BufferOutputStream()
        write(out)
        return memoryview(out.getvalue())
    mock = pa.MockOutputStream()
    write(mock)
    buf = pa.allocate_buffer(mock.size())
    write(pa.FixedSizeBufferWriter(buf))
    return memoryview(buf)


def _summary_batch(summary: bytes) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([summary], pa.binary())], names=[SUMMARY_COL])

