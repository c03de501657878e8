"""Executor side of the vectorized path: ``mapInArrow`` tasks with ids as columns.

Every row crossing a shuffle carries two int64 columns, ``__ft_src`` and ``__ft_cur``
(its RecordId). A task runs its segment's batch stages chained, and folds with numpy the
XOR of every id it acks and every id it emits into ONE 64-bit value for the whole task
(ids born and acked inside the task cancel, so only its edges count)
(batch scope: Storm folds per source id; we fold further, because a record that ends in
this batch must return to 0 across the batch's tasks anyway). Rows that fail, and sink
rows whose writes were not confirmed, are acked in the fold and reported by source id as
*residues*: only those ever become per-record Redis entries.

A task's summary (fold, residues, counts) must count exactly when its output does
(invariant 11: one attempt counts). A task whose output goes through a shuffle stores its
summary in Redis under a random token and emits one *marker row* (``__ft_src = 0``,
``__ft_cur = token``) with its data; the task that consumes the marker passes the token
on, and the last stage's tasks return their summaries as their output rows, which the
driver collects. So the driver reads the summaries of exactly the attempts whose rows were
consumed. A source task stores its fresh rows as one segment (Arrow IPC) in the same
Redis call as its summary (see ftlayer.segments).

Ids of fresh rows are a function of (run salt, partition, row index), children's of
(parent id, position, stage): every attempt of a task emits the same ids for the same
input, so Spark's retries and speculative copies agree.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from ftlayer.config import FTConfig
from ftlayer.ids import batch_source_ids, child_ids, mix64, xor_fold
from ftlayer.spark.outcome import run_stage
from ftlayer.spark.plan import MAX_MESSAGES, Segment, stage_name
from ftlayer.spark.worker import task_context, worker_layer

__all__ = ["CUR_COL", "SRC_COL", "SUMMARY_COL", "VectorPlan", "run_vector_task", "stage_label"]

log = logging.getLogger(__name__)

SRC_COL = "__ft_src"
CUR_COL = "__ft_cur"
SUMMARY_COL = "__ft_summary"
ID_FIELDS = [pa.field(SRC_COL, pa.int64()), pa.field(CUR_COL, pa.int64())]
_U8 = np.dtype(">u8")


@dataclass(frozen=True)
class VectorPlan:
    """What every task of one vectorized batch run needs (picklable, no live client)."""

    config: FTConfig
    source: int
    batch_key: str
    salt: int
    segments: tuple[Segment, ...]
    on_error: str
    inputs: tuple[pa.Schema, ...]
    """User columns entering each segment."""
    outputs: tuple[tuple[pa.Schema, ...], ...]
    """Output schema of each batch stage of each segment."""

    def stage_salt(self, segment: int, op: int) -> int:
        return int(mix64(np.array([self.salt ^ (segment << 20) ^ (op + 1)], np.uint64))[0])


def stage_label(segment: int, op: int, fn: Any, sink: bool = False) -> str:
    return f"{'sink' if sink else 'map_batches'}[{segment}.{op}] {stage_name(fn)}"


@dataclass
class _Task:
    """What one task attempt did: its fold, residues and counts (its summary)."""

    stage: int
    partition: int
    attempt: int
    fold: int = 0
    fresh: int = 0
    replayed: int = 0
    written: int = 0
    failed_src: list[np.ndarray] = field(default_factory=list)
    failed_err: list[str] = field(default_factory=list)
    unc_src: list[np.ndarray] = field(default_factory=list)
    unc_cur: list[np.ndarray] = field(default_factory=list)
    upstream: list[int] = field(default_factory=list)
    counts: dict[str, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def count(self, label: str, rows_in: int, rows_out: int, failed: int, unc: int, extra: int):
        c = self.counts.setdefault(label, [0, 0, 0, 0, 0])
        for i, v in enumerate((rows_in, rows_out, failed, unc, extra)):
            c[i] += v

    def pack(self, token: int, segment: str | None, segment_rows: int) -> bytes:
        texts: dict[str, int] = {}
        idx = np.array([texts.setdefault(e, len(texts)) for e in self.failed_err], np.uint32)

        def ids(parts: list[np.ndarray]) -> bytes:
            return np.concatenate(parts).astype(_U8).tobytes() if parts else b""

        return msgpack.packb(
            {
                "stage": self.stage, "partition": self.partition, "attempt": self.attempt,
                "token": token, "fold": self.fold, "fresh": self.fresh,
                "replayed": self.replayed, "written": self.written, "segment": segment,
                "segment_rows": segment_rows, "failed_src": ids(self.failed_src),
                "failed_err": idx.astype(">u4").tobytes(), "texts": list(texts),
                "unc_src": ids(self.unc_src), "unc_cur": ids(self.unc_cur),
                "upstream": self.upstream, "counts": self.counts, "errors": self.errors,
            },
            use_bin_type=True,
        )  # fmt: skip


def _u64(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False)).view(np.uint64)


def _with_ids(batch: pa.RecordBatch, src: np.ndarray, cur: np.ndarray) -> pa.RecordBatch:
    arrays = [*batch.columns, pa.array(src.view(np.int64)), pa.array(cur.view(np.int64))]
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema([*batch.schema, *ID_FIELDS]))


def _run_chain(
    plan: VectorPlan,
    stage: int,
    task: _Task,
    batch: pa.RecordBatch,
    src: np.ndarray | None,
    cur: np.ndarray | None,
) -> pa.RecordBatch | None:
    """Run one segment's stages over one input batch; the batch to shuffle, or None.

    XOR events only at the task's edges: ids born and acked inside the task cancel in
    its fold, so chained stages generate none. Each input is acked when it enters (the
    caller folds its id in), each row leaving through the shuffle is emitted with a new
    id derived from its input's (folded in here). ``origin`` maps rows to their input."""
    seg = plan.segments[stage]
    bisect = plan.on_error != "fail_batch"
    ft = src is not None and cur is not None
    origin = np.arange(batch.num_rows, dtype=np.int64)
    for j, (_, op) in enumerate(seg.ops):
        label = stage_label(stage, j, op.fn)
        res = run_stage(op.fn, batch, label, schema=plan.outputs[stage][j], pandas=op.pandas,
                        bisect=bisect)  # fmt: skip
        n_out = 0 if res.output is None else res.output.num_rows
        task.count(label, batch.num_rows, n_out, len(res.failed), 0, res.extra_calls)
        _note_failures(task, res.errors)
        if ft and len(res.failed):
            task.failed_src.append(src[origin[res.failed]])  # type: ignore[index]
            task.failed_err.extend(res.errors)
        if res.output is None or n_out == 0:
            return None
        origin = origin[res.parents]
        batch = res.output
    if seg.sink is None:
        if src is None or cur is None:
            return batch
        out_cur = child_ids(cur[origin], plan.stage_salt(stage, 0))
        task.fold ^= xor_fold(out_cur)
        return _with_ids(batch, src[origin], out_cur)
    label = stage_label(stage, len(seg.ops), seg.sink, sink=True)
    res = run_stage(seg.sink, batch, label, schema=None, pandas=seg.sink_pandas,
                    is_sink=True, bisect=bisect)  # fmt: skip
    task.count(label, batch.num_rows, 0, len(res.failed), len(res.unconfirmed), res.extra_calls)
    _note_failures(task, res.errors)
    task.written += batch.num_rows - len(res.failed) - len(res.unconfirmed)
    if src is not None and cur is not None:
        if len(res.failed):
            task.failed_src.append(src[origin[res.failed]])
            task.failed_err.extend(res.errors)
        if len(res.unconfirmed):
            task.unc_src.append(src[origin[res.unconfirmed]])
            task.unc_cur.append(cur[origin[res.unconfirmed]] | np.uint64(1))
    return None


def _note_failures(task: _Task, errors: list[str]) -> None:
    for text in errors[: MAX_MESSAGES - len(task.errors)]:
        task.errors.append(text)
        log.info("record failed stage=%d partition=%d %s", task.stage, task.partition, text)


def run_vector_task(
    plan: VectorPlan, stage: int, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of segment ``stage`` (see the module docstring)."""
    partition, attempt = task_context()
    ft = plan.config.enabled
    task = _Task(stage, partition, attempt)
    names = plan.inputs[stage].names
    final = stage == len(plan.segments) - 1
    fresh: list[pa.RecordBatch] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        if not ft:
            out = _run_chain(plan, stage, task, batch.select(names), None, None)
            if out is not None:
                yield out
            continue
        has_ids = SRC_COL in batch.schema.names
        src = _u64(batch.column(SRC_COL)) if has_ids else np.zeros(batch.num_rows, np.uint64)
        cur = _u64(batch.column(CUR_COL)) if has_ids else src
        user = batch.select(names)
        if stage == 0:
            is_fresh = src == 0
            n_fresh = int(is_fresh.sum())
            if n_fresh:
                part = user if n_fresh == batch.num_rows else user.filter(pa.array(is_fresh))
                ids = batch_source_ids(partition, task.fresh, n_fresh)
                task.fresh += n_fresh
                fresh.append(part)
                # a fresh record's init and its ack by the first stage cancel: no root id
                out = _run_chain(plan, stage, task, part, ids, ids ^ np.uint64(plan.salt))
                if out is not None:
                    yield out
            if n_fresh < batch.num_rows:  # replays: inited in Redis when claimed
                keep = ~is_fresh
                task.replayed += int(keep.sum())
                task.fold ^= xor_fold(cur[keep])  # their ack
                out = _run_chain(plan, stage, task, user.filter(pa.array(keep)), src[keep],
                                 cur[keep])  # fmt: skip
                if out is not None:
                    yield out
            continue
        markers = src == 0
        if markers.any():
            task.upstream.extend(int(t) for t in cur[markers])
            keep = ~markers
            user, src, cur = user.filter(pa.array(keep)), src[keep], cur[keep]
            if user.num_rows == 0:
                continue
        task.fold ^= xor_fold(cur)  # every input is acked as it enters
        out = _run_chain(plan, stage, task, user, src, cur)
        if out is not None:
            yield out
    yield from _finish(plan, stage, task, fresh, final)


def _finish(
    plan: VectorPlan, stage: int, task: _Task, fresh: list[pa.RecordBatch], final: bool
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
        blob = b""
        rows = sum(b.num_rows for b in fresh)
        if rows:
            member = store.member(plan.source, plan.batch_key, task.partition, token)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, fresh[0].schema) as writer:
                for b in fresh:
                    writer.write_batch(b)
            blob = sink.getvalue().to_pybytes()
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
        store.put_summary(token, summary)
    schema = pa.schema([*plan.inputs[stage + 1], *ID_FIELDS])
    arrays = [pa.nulls(1, f.type) for f in plan.inputs[stage + 1]]
    arrays += [pa.array([0], pa.int64()), pa.array([token], pa.int64())]
    yield pa.RecordBatch.from_arrays(arrays, schema=schema)


def _summary_batch(summary: bytes) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([summary], pa.binary())], names=[SUMMARY_COL])
