"""One executor task's run of a segment's stages over its input batches (the vectorized
path, ftlayer.spark.vector_tasks): the stages chained, their failures noted as input rows,
the sink's unconfirmed writes reported, and what the task did summed as its summary
(wire.BatchSummary) while it runs.

Invariant: a failure is noted against the input row it derives from (``origin``), once per
failed output row, with its error and the label of the stage it failed in; nothing a stage
rejects is dropped without a note.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ftlayer.ids import edge_hashes, fold_sum, new_ids
from ftlayer.spark.outcome import StageContractError, run_stage
from ftlayer.spark.plan import MAX_MESSAGES
from ftlayer.spark.policy import BatchContext, wants_context
from ftlayer.spark.vector_plan import VectorPlan, stage_label
from ftlayer.wire import BatchSummary

__all__ = ["HELD", "Chain", "TaskRun", "input_rows", "note_failures", "run_chain", "u64_ids"]

log = logging.getLogger("ftlayer.spark.vector_tasks")


@dataclass
class TaskRun(BatchSummary):
    """What one task attempt did, summed while it runs: its summary (wire.BatchSummary)
    whose id arrays grow in parts (:meth:`add`), joined by :meth:`pack`."""

    parts: dict[str, list[np.ndarray]] = field(default_factory=dict)

    def add(self, **arrays: np.ndarray) -> None:
        """Append to the summary's array fields (``failed_src=...``, ``rep_cur=...``)."""
        for name, values in arrays.items():
            self.parts.setdefault(name, []).append(values)

    def count(self, label: str, rows_in: int, rows_out: int, failed: int, unc: int, extra: int,
              micros: int) -> None:
        """Sum one call of a stage: rows in, out, failed, unconfirmed, extra calls
        (bisection), and the microseconds the stage took (its function, bisection
        included): StageCounts' fields, in this order. A seventh counts the stage's
        failed rows this task replayed at once (:meth:`replayed_now`), an eighth those
        its breaker held back (:meth:`held_back`)."""
        c = self.counts.setdefault(label, [0] * 8)
        for i, v in enumerate((rows_in, rows_out, failed, unc, extra, micros)):
            c[i] += v

    def replayed_now(self, stages: list[str]) -> None:
        """Rows replayed at once in this task, one per label of the stage they failed in."""
        self.immediate_replays += len(stages)
        for label in stages:
            self.counts.setdefault(label, [0] * 8)[6] += 1

    def held_back(self, stages: list[str]) -> None:
        """Failed rows a stage's open breaker kept from a replay at once, one per label."""
        for label in stages:
            self.counts.setdefault(label, [0] * 8)[7] += 1

    def pack(self, token: int, segment: str | None, segment_rows: int) -> bytes:
        """This attempt's summary, encoded."""
        self.token, self.segment, self.segment_rows = token, segment, segment_rows
        for name, parts in self.parts.items():
            setattr(self, name, np.concatenate([getattr(self, name), *parts]))
        self.parts.clear()
        return self.encode()


def u64_ids(col: pa.Array) -> np.ndarray:
    """The ids of a column as uint64 (nulls, the fresh rows of a source batch, as 0)."""
    if col.null_count:
        col = col.fill_null(0)
    return np.asarray(col.to_numpy(zero_copy_only=False)).view(np.uint64)


@dataclass
class Chain:
    """What one pass of a segment's stages over one input batch gave: the batch to send
    on (None: nothing to send), and its failures as input row indices (one entry per
    failed output row, so a fanned-out row may repeat) with their error texts."""

    out: pa.RecordBatch | None
    failed: np.ndarray
    texts: list[str]
    dead: np.ndarray  # bool, aligned with failed: dead-letter it now (no replay fixes it)
    stages: list[str]  # aligned with failed: the label of the stage it failed in

    def only(self, mask: np.ndarray) -> Chain:
        """The failures where ``mask`` holds (and the same output)."""
        return Chain(self.out, self.failed[mask], _pick(self.texts, mask), self.dead[mask],
                      _pick(self.stages, mask))  # fmt: skip


_NO_ROWS = np.zeros(0, np.int64)
HELD = "held: its breaker is open (most of its rows failed), so it was not called"
_NO_DEAD = np.zeros(0, bool)


def run_chain(
    plan: VectorPlan,
    stage: int,
    task: TaskRun,
    batch: pa.RecordBatch,
    src: np.ndarray | None,
    ctx: BatchContext | None = None,
    lin: np.ndarray | None = None,
) -> Chain:
    """Run one segment's stages over one input batch: its ops, then either its sink or
    the ids its rows are sent on with. ``src``: the input rows' source ids (None: FT off);
    ``ctx``: their context, for stages that declare one; ``lin``: their lineage ids (int64;
    None: not known here), sent on with them and given to the sink when it asks."""
    run = _ChainRun(plan, stage, task, batch, ctx)
    out = run.ops()
    if out is None:
        return run.done(None)
    if plan.segments[stage].sink is not None:
        run.sink(out, src, lin)
        return run.done(None)
    return run.done(run.send(out, src, lin))


class _ChainRun:
    """One pass of a segment's stages over one input batch (:func:`run_chain`).
    ``origin`` maps each current row to the input row it derives from (None: row i is
    input row i), for its source id, its lineage and replays at the source; failures are
    noted as input rows, with their errors, whether they go to the dead letters now, and
    the label of the stage they failed in."""

    def __init__(self, plan: VectorPlan, stage: int, task: TaskRun, given: pa.RecordBatch,
                 ctx: BatchContext | None) -> None:  # fmt: skip
        self.plan, self.stage, self.task, self.given, self.ctx = plan, stage, task, given, ctx
        self.bisect = plan.on_error != "fail_batch"
        self.origin: np.ndarray | None = None
        self.failed: list[np.ndarray] = []
        self.dead: list[np.ndarray] = []
        self.texts: list[str] = []
        self.stages: list[str] = []

    def ops(self) -> pa.RecordBatch | None:
        """The segment's ops in order; their output (None: no row left)."""
        plan, stage, batch = self.plan, self.stage, self.given
        for j, (_, op) in enumerate(plan.segments[stage].ops):
            label = stage_label(stage, j, op.fn)
            if label in plan.open_stages:
                self.hold(label, batch.num_rows)
                return None
            t0 = time.perf_counter()
            res = run_stage(op.fn, batch, label, schema=plan.outputs[stage][j],
                            pandas=op.pandas, bisect=self.bisect,
                            policy=op.errors or plan.errors,
                            ctx=self.context(op.fn, batch))  # fmt: skip
            n_out = 0 if res.output is None else res.output.num_rows
            self.task.count(label, batch.num_rows, n_out, len(res.failed), 0, res.extra_calls,
                            _micros(t0))  # fmt: skip
            self.note(label, res.failed, res.errors, res.dead)
            if res.output is None or n_out == 0:
                return None
            if not res.identity:
                self.origin = input_rows(self.origin, res.parents)
            batch = res.output
        return batch

    def send(self, batch: pa.RecordBatch, src: np.ndarray | None,
             lin: np.ndarray | None) -> pa.RecordBatch:  # fmt: skip
        """The rows as they cross the shuffle: with their source ids (and lineage ids)
        as columns, or, with ``record_key``, their key checked unchanged; what they send
        is added to the task's fold."""
        plan, stage, origin = self.plan, self.stage, self.origin
        if src is None:
            return batch
        if plan.record_key:  # the key column is the rows' identity past the shuffle
            keys = u64_ids(batch.column(plan.record_key))
            expect = u64_ids(self.given.column(plan.record_key))
            expect = expect if origin is None else expect[origin]
            if not np.array_equal(keys, expect):
                row = int(np.flatnonzero(keys != expect)[0])
                raise StageContractError(
                    f"segment {stage} changed record_key {plan.record_key!r} of a row: "
                    f"{expect[row].view(np.int64)} became {keys[row].view(np.int64)} "
                    "(record_key stages must pass the key through unchanged)"
                )
            self.task.fold += fold_sum(edge_hashes(keys, plan.edge_salts[stage]))  # sent
            return batch
        out = src if origin is None else src[origin]
        self.task.fold += fold_sum(edge_hashes(out, plan.edge_salts[stage]))  # sent
        ids = [pa.array(out.view(np.int64))]
        if plan.lineage is not None:
            assert lin is not None
            ids.append(pa.array(lin if origin is None else lin[origin]))
        return pa.RecordBatch.from_arrays([*batch.columns, *ids], schema=plan.id_schemas[stage])

    def sink(self, batch: pa.RecordBatch, src: np.ndarray | None,
             lin: np.ndarray | None) -> None:  # fmt: skip
        """The segment's sink over the rows: its writes counted, the rows whose write was
        not confirmed reported (they stay pending, to time out and replay)."""
        plan, stage, task, origin = self.plan, self.stage, self.task, self.origin
        seg = plan.segments[stage]
        assert seg.sink is not None
        label = stage_label(stage, len(seg.ops), seg.sink, sink=True)
        if label in plan.open_stages:
            self.hold(label, batch.num_rows)
            return
        if seg.sink_lineage is not None:
            if lin is None:  # FT off: ids unique to this call, for sinks that need the column
                lin = new_ids(self.given.num_rows).view(np.int64)
            batch = batch.append_column(seg.sink_lineage, pa.array(lin if origin is None else
                                                                   lin[origin]))  # fmt: skip
        t0 = time.perf_counter()
        res = run_stage(seg.sink, batch, label, schema=None, pandas=seg.sink_pandas,
                        is_sink=True, bisect=self.bisect, policy=seg.sink_errors or plan.errors,
                        ctx=self.context(seg.sink, batch))  # fmt: skip
        task.count(label, batch.num_rows, 0, len(res.failed), len(res.unconfirmed),
                   res.extra_calls, _micros(t0))  # fmt: skip
        self.note(label, res.failed, res.errors, res.dead)
        task.written += batch.num_rows - len(res.failed) - len(res.unconfirmed)
        if src is not None and len(res.unconfirmed):
            task.add(unc_src=src[input_rows(origin, res.unconfirmed)])

    def context(self, fn: Any, batch: pa.RecordBatch) -> BatchContext | None:
        """The context of ``batch``'s rows, for a stage that declares one."""
        if not wants_context(fn):
            return None
        if self.ctx is None:  # FT off: no ids, no timeouts
            return BatchContext(np.zeros(batch.num_rows, np.uint64), None, self.task.partition,
                                self.task.attempt, self.stage)  # fmt: skip
        return self.ctx if self.origin is None else self.ctx.take(self.origin)

    def hold(self, label: str, n: int) -> None:
        """The stage ``label`` is open (its breaker): it is not called, and its ``n`` rows
        fail as held (ftlayer.spark.breakers), counted as such."""
        self.task.count(label, n, 0, n, 0, 0, 0)
        self.task.held_back([label] * n)
        self.note(label, np.arange(n), [f"{label}: {HELD}"] * n, _NO_ROWS)

    def note(self, label: str, rows: np.ndarray, errors: list[str], fatal: np.ndarray) -> None:
        """Rows of the current batch that failed in stage ``label`` (``fatal``: those to
        dead-letter now)."""
        if len(rows):
            self.failed.append(input_rows(self.origin, rows))
            self.dead.append(np.isin(rows, fatal) if len(fatal) else np.zeros(len(rows), bool))
            self.texts.extend(errors)
            self.stages.extend([label] * len(rows))
        note_failures(self.task, errors)

    def done(self, out: pa.RecordBatch | None) -> Chain:
        if not self.failed:
            return Chain(out, _NO_ROWS, self.texts, _NO_DEAD, self.stages)
        return Chain(out, np.concatenate(self.failed), self.texts, np.concatenate(self.dead),
                      self.stages)  # fmt: skip


def _pick(texts: list[str], mask: np.ndarray) -> list[str]:
    return [t for t, keep in zip(texts, mask, strict=True) if keep]


def _micros(t0: float) -> int:
    return int((time.perf_counter() - t0) * 1e6)


def input_rows(origin: np.ndarray | None, rows: np.ndarray) -> np.ndarray:
    """The input rows of ``rows`` (``origin`` None: the identity)."""
    return rows if origin is None else origin[rows]


def note_failures(task: TaskRun, errors: list[str]) -> None:
    for text in errors[: MAX_MESSAGES - len(task.errors)]:
        task.errors.append(text)
        log.info("record failed stage=%d partition=%d %s", task.stage, task.partition, text)
