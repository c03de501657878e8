"""Executor side of the row path of :mod:`ftlayer.spark`: per-record stages over ``df.rdd``.

One task = one pipeline *segment*: the source segment (fresh rows + this partition's
replays, then the per-record stages) or a segment after a ``partition_by`` shuffle. Each
task attempt builds its own handler and ends with ONE ``flush()`` after its last record
(invariant 1 per task): a task that raises before that sends nothing, and the retry
redoes it. The handler's Redis connection comes from a per-process cache keyed by
(redis_url, namespace); no live client is ever pickled, only the plain ``TaskPlan``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord
from ftlayer.handler import AbstractFTHandler
from ftlayer.ids import RecordId
from ftlayer.payloads import Codecs, encode_record, normalize_row
from ftlayer.spark.plan import (
    RowFn,
    Segment,
    Unconfirmed,
    apply_ops,
    error_text,
)
from ftlayer.spark.policy import DEFAULT_POLICY, ErrorPolicy, RecordContext, is_dead
from ftlayer.spark.results import RecordCounts
from ftlayer.spark.worker import task_context, task_handler
from partitioners import HashPartitioner
from serialization import encode_payload

__all__ = ["HASH_COL", "TaskPlan", "TaskSummary", "run_shuffled_task", "run_source_task"]

log = logging.getLogger(__name__)

HASH_COL = "__ft_hash"
"""The extra column holding Spark's ``hash(key cols)`` (int32), computed in the JVM."""


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs, picklable: config (with the Redis URL), stages, policy."""

    config: FTConfig
    source: int
    segments: tuple[Segment, ...]
    on_error: str
    codecs: Codecs
    key: tuple[str, ...]
    errors: ErrorPolicy = DEFAULT_POLICY


@dataclass
class TaskSummary(RecordCounts):
    """What one task reports to the driver (see RecordCounts; ``acked`` counts its inputs)."""

    stage: int
    partition: int
    attempt: int
    inputs: int = 0


def _describe(plan: TaskPlan, partition: int, row_no: int, record: dict[str, Any]) -> str:
    if plan.key:
        what = "key=" + repr({c: record.get(c) for c in plan.key})
    else:
        what = "row=" + repr(record)[:200]
    return f"source={plan.source} partition={partition} row={row_no} {what}"


def _repr_payload(record: dict[str, Any]) -> bytes:
    """What a dead letter keeps of a record msgpack cannot carry: its repr, as msgpack."""
    return encode_payload(repr(record))


def run_source_task(plan: TaskPlan, replays: Any, index: int, rows: Iterable[Any]) -> Iterator[Any]:
    """The source segment of one partition: persist each fresh row (payload = the row
    as a msgpack map, hash code = the JVM's ``hash(key)``), then this partition's
    claimed replays (already inited with their new ids), all through segment 0. A row
    that cannot be persisted (it does not encode, or it is too large) is dead-lettered
    with its bytes (or repr) and the error, never dropped (``on_error="fail_batch"``:
    the task raises instead)."""
    partition, attempt = task_context()
    partition = index if partition < 0 else partition
    h = task_handler(plan.config, partition)
    summary = TaskSummary(0, partition, attempt)
    encode = plan.config.enabled

    def inputs() -> Iterator[tuple[RecordId, Any]]:
        for row_no, row in enumerate(rows):
            record = row.asDict(recursive=True)
            hash_code = record.pop(HASH_COL, 0) or 0
            normalize_row(record, plan.codecs)
            summary.fresh += 1
            if encode:
                payload = None
                try:
                    payload = encode_record(record, plan.codecs)
                    rid = h.persist(payload, hash_code, plan.source, partition)
                except ValueError as e:  # PayloadEncodeError, RecordError
                    summary.rejected += 1
                    desc = f"{_describe(plan, partition, row_no, record)}: {e}"
                    summary.note(summary.rejects, desc)
                    log.error("record rejected batch_stage=0 %s", desc)
                    if plan.on_error == "fail_batch":
                        raise
                    raw = payload if payload is not None else _repr_payload(record)
                    h.reject(raw, f"rejected: {desc}", hash_code, plan.source, partition)
                    continue
            else:
                rid = h.persist(b"", hash_code, plan.source, partition)
            yield rid, record
        mine = replays.value.get(partition, ()) if replays is not None else ()
        for src, cur, record in mine:
            summary.replayed += 1
            yield RecordId(src, cur), record

    yield from _run_segment(plan, 0, h, inputs(), summary)


def run_shuffled_task(
    plan: TaskPlan, stage: int, index: int, pairs: Iterable[tuple[int, Any]]
) -> Iterator[Any]:
    """A segment after a ``partition_by`` shuffle: its inputs are (child RecordId,
    record) pairs emitted upstream; upstream summaries pass through."""
    partition, attempt = task_context()
    partition = index if partition < 0 else partition
    h = task_handler(plan.config, partition)
    summary = TaskSummary(stage, partition, attempt)
    upstream: list[TaskSummary] = []

    def inputs() -> Iterator[tuple[RecordId, Any]]:
        for _target, value in pairs:
            if value[0] is None:
                upstream.append(value[1])
            else:
                yield RecordId(value[0], value[1]), value[2]

    yield from _run_segment(plan, stage, h, inputs(), summary, upstream)


def _run_segment(
    plan: TaskPlan,
    stage: int,
    h: AbstractFTHandler,
    inputs: Iterator[tuple[RecordId, Any]],
    summary: TaskSummary,
    upstream: list[TaskSummary] | None = None,
) -> Iterator[Any]:
    """Segment ``stage`` over its input records: each record through the ops, then into
    the shuffle (a child emitted per output), the sink (acked once its writes are
    confirmed) or the partition's held sink write; then the task's one flush, and the
    summaries (upstream's and its own), sent on through the shuffle or returned."""
    run = _SegmentRun(plan, stage, h, summary)
    for rid, record in inputs:
        summary.inputs += 1
        outs = run.apply(rid, record)
        if outs is None:
            continue
        if run.partitioner is not None:
            yield from run.shuffle(rid, outs)
        elif run.seg.sink_per == "partition":
            run.hold(rid, outs)
        else:
            run.sink_each(rid, outs)
    run.sink_held()
    h.flush()  # the task's one flush: after it, every record is complete or persisted
    reports = [*(upstream or ()), summary]
    if run.partitioner is not None:  # summaries travel through the shuffle with the records
        for r in reports:
            yield r.partition % run.seg.shuffle_n, (None, r)
    else:
        yield from reports


class _SegmentRun:
    """One task's pass of a row segment (:func:`_run_segment`). Invariant: each input
    record is acked, failed, or left pending (an unconfirmed write) exactly once."""

    def __init__(self, plan: TaskPlan, stage: int, h: AbstractFTHandler,
                 summary: TaskSummary) -> None:  # fmt: skip
        self.plan, self.stage, self.h, self.summary = plan, stage, h, summary
        self.seg = seg = plan.segments[stage]
        self.raise_all = plan.on_error == "fail_batch"
        self.partitioner = (HashPartitioner(seg.shuffle_n, seg.shuffle_types)
                            if seg.shuffle_n else None)  # fmt: skip
        self.sink = None if seg.sink is None else RowFn.of(seg.sink, seg.sink_errors)
        self.wants = (self.sink is not None and self.sink.ctx) or any(
            fn.ctx for _, fn in seg.ops)
        self.held: list[RecordId] = []  # sink per partition: inputs whose outputs are held
        self.buffer: list[Any] = []
        self.owners: list[RecordId] = []  # owners[i]: the input whose output is buffer[i]

    def ctx_of(self, rid: RecordId) -> RecordContext | None:  # attempts: not known here
        if not self.wants:
            return None
        return RecordContext(rid[0], None, self.summary.partition, task_context()[1],
                             self.stage, partial(self.h.reset_timeout, rid))  # fmt: skip

    def fail(self, rid: RecordId, where: str, e: BaseException) -> None:
        if self.raise_all and not isinstance(e, FailRecord):
            raise e
        text = error_text(where, e)
        self.h.fail(rid, text, "dead_letter" if is_dead(e) else "explicit")
        self.summary.failed += 1
        self.summary.note(self.summary.errors, text)
        log.info("record failed stage=%d partition=%d %s", self.stage, self.summary.partition,
                 text)  # fmt: skip

    def ack(self, rid: RecordId) -> None:
        self.h.ack(rid)
        self.summary.acked += 1

    def apply(self, rid: RecordId, record: Any) -> list[Any] | None:
        """The ops' outputs of one record (None: it failed)."""
        try:
            return apply_ops(self.seg.ops, record, self.plan.errors, self.ctx_of(rid))
        except Exception as e:
            self.fail(rid, getattr(e, "ft_where", "stage"), e)
            return None

    def shuffle(self, rid: RecordId, outs: list[Any]) -> Iterator[Any]:
        """Each output as a child of ``rid``, to the partition Spark's hash puts it in."""
        assert self.partitioner is not None
        cols = self.seg.shuffle_cols
        try:
            targets = [self.partitioner.partition(tuple(o[c] for c in cols)) for o in outs]
        except Exception as e:
            self.fail(rid, f"partition_by{list(cols)}", e)
            return
        for target, out in zip(targets, outs, strict=True):
            child = self.h.emit(rid)
            yield target, (child[0], child[1], out)
        self.ack(rid)

    def sink_each(self, rid: RecordId, outs: list[Any]) -> None:
        """The sink per record: acked when every write is confirmed, else left pending
        (it times out and is replayed)."""
        sink = self.sink
        assert sink is not None
        confirmed = True
        try:
            for out in outs:
                if isinstance(sink(out, self.ctx_of(rid), self.plan.errors), Unconfirmed):
                    confirmed = False
        except Exception as e:
            self.fail(rid, f"sink {sink.__name__}", e)
            return
        self.summary.written += len(outs)
        if confirmed:
            self.ack(rid)
        else:
            self.summary.unconfirmed += 1

    def hold(self, rid: RecordId, outs: list[Any]) -> None:
        """The sink per partition: outputs held for one write at the end."""
        self.held.append(rid)
        self.buffer.extend(outs)
        self.owners.extend([rid] * len(outs))

    def sink_held(self) -> None:
        """The partition's one sink write: its inputs acked, failed together, or left
        pending where the sink named their outputs unconfirmed."""
        if not self.held:
            return
        sink = self.sink
        assert sink is not None
        try:
            answer = sink(self.buffer, None, self.plan.errors)
        except Exception as e:
            for rid in dict.fromkeys(self.held):
                self.fail(rid, f"sink {sink.__name__}", e)
            return
        self.summary.written += len(self.buffer)
        unconfirmed = set()
        if isinstance(answer, Unconfirmed):
            owners = self.owners
            unconfirmed = {owners[i] for i in answer.positions if 0 <= i < len(owners)}
        for rid in self.held:
            if rid not in unconfirmed:  # else left pending: it times out and is replayed
                self.ack(rid)
        self.summary.unconfirmed += len(unconfirmed)
