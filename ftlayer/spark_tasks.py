"""Executor side of :mod:`ftlayer.spark`: what runs inside the PySpark tasks of a batch.

One task = one pipeline *segment*: the source segment (fresh rows + this partition's
replays, then the per-record stages) or a segment after a ``partition_by`` shuffle. Each
task attempt builds its own handler and ends with ONE ``flush()`` after its last record
(invariant 1 per task): a task that raises before that sends nothing, and the retry
redoes it. The handler's Redis connection comes from a per-process cache keyed by
(redis_url, namespace); no live client is ever pickled, only the plain ``TaskPlan``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.connection import connect
from ftlayer.errors import FailRecord
from ftlayer.handler import AbstractFTHandler, NonFTHandler
from ftlayer.ids import RecordId
from ftlayer.layer import FTLayer
from partitioners import HashPartitioner
from serialization import decode_payload, encode_payload

__all__ = [
    "HASH_COL",
    "UNCONFIRMED",
    "Unconfirmed",
    "Op",
    "Segment",
    "TaskPlan",
    "decode_record",
    "encode_record",
    "field_codecs",
    "run_shuffled_task",
    "run_source_task",
    "worker_layer",
]

log = logging.getLogger(__name__)

HASH_COL = "__ft_hash"
"""The extra column holding Spark's ``hash(key cols)`` (int32), computed in the JVM."""
MAX_MESSAGES = 20
"""Error texts and rejected-record descriptions a task reports back (counts are exact)."""
_ERROR_CHARS = 2000

Op = tuple[str, Callable[[Any], Any]]
"""A per-record stage: ("map" | "flat_map" | "filter", function)."""

# -- worker connections -------------------------------------------------------------------
_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}
_layers: dict[tuple[int, FTConfig], FTLayer] = {}


def worker_layer(config: FTConfig) -> FTLayer:
    """The FTLayer of ``config`` in this worker process: one Redis client per
    (process, redis_url), one FTLayer per (process, config). Rebuilt after a fork."""
    if not config.redis_url:
        raise ValueError("a task needs config.redis_url (FaultTolerance fills it in)")
    pid = os.getpid()
    with _lock:
        layer = _layers.get((pid, config))
        if layer is None:
            client = _clients.get((pid, config.redis_url))
            if client is None:
                client = _clients[(pid, config.redis_url)] = connect(config.redis_url)
            layer = _layers[(pid, config)] = FTLayer(client, config)
        return layer


def task_handler(config: FTConfig, partition: int) -> AbstractFTHandler:
    if not config.enabled:
        return NonFTHandler()
    return worker_layer(config).handler(partition)


# -- payloads: the row as a msgpack map ---------------------------------------------------
def _ts_out(v: Any) -> Any:  # TimestampType: naive local time (PySpark's convention)
    return v.astimezone(dt.timezone.utc) if isinstance(v, dt.datetime) else v


def _ts_in(v: Any) -> Any:
    return v.astimezone().replace(tzinfo=None) if isinstance(v, dt.datetime) else v


def _ntz_out(v: Any) -> Any:
    if isinstance(v, dt.datetime) and v.tzinfo is None:
        return v.replace(tzinfo=dt.timezone.utc)
    return v


def _ntz_in(v: Any) -> Any:
    return v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v


def _date_out(v: Any) -> Any:
    return v.isoformat() if isinstance(v, dt.date) else v


def _date_in(v: Any) -> Any:
    return dt.date.fromisoformat(v) if isinstance(v, str) else v


def _dec_out(v: Any) -> Any:
    return str(v) if isinstance(v, Decimal) else v


def _dec_in(v: Any) -> Any:
    return Decimal(v) if isinstance(v, str) else v


def _bin_in(v: Any) -> Any:
    return bytes(v) if isinstance(v, bytearray) else v


_CODECS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "timestamp": (_ts_out, _ts_in),
    "timestamp_ntz": (_ntz_out, _ntz_in),
    "date": (_date_out, _date_in),
    "binary": (_bin_in, _bin_in),
}


def field_codecs(schema: Any) -> tuple[tuple[str, str], ...]:
    """(column, codec name) for the top-level columns msgpack cannot carry as they come
    from Spark (dates, timestamps, decimals, binary). Everything else passes unchanged."""
    out = []
    for f in schema.fields:
        name = f.dataType.simpleString()
        if name.startswith("decimal"):
            out.append((f.name, "decimal"))
        elif name in _CODECS:
            out.append((f.name, name))
    return tuple(out)


def _codec(name: str) -> tuple[Callable[[Any], Any], Callable[[Any], Any]]:
    return (_dec_out, _dec_in) if name == "decimal" else _CODECS[name]


def encode_record(record: dict[str, Any], codecs: tuple[tuple[str, str], ...]) -> bytes:
    """The record's msgpack payload (PayloadEncodeError if a value cannot be encoded)."""
    if codecs:
        record = dict(record)
        for col, name in codecs:
            if col in record:
                record[col] = _codec(name)[0](record[col])
    return encode_payload(record)


def normalize_row(record: dict[str, Any], codecs: tuple[tuple[str, str], ...]) -> None:
    """Make a fresh row look like its decoded replay (binary -> bytes), in place."""
    for col, name in codecs:
        if name == "binary" and col in record:
            record[col] = _bin_in(record[col])


def decode_record(payload: bytes, codecs: tuple[tuple[str, str], ...], desc: str) -> Any:
    """The record of a replay payload, as the fresh row looked (PayloadDecodeError)."""
    record = decode_payload(payload, record=desc)
    if codecs and isinstance(record, dict):
        for col, name in codecs:
            if col in record:
                record[col] = _codec(name)[1](record[col])
    return record


# -- the plan a task runs -----------------------------------------------------------------
@dataclass(frozen=True)
class Segment:
    """Per-record stages, then an exit: a ``partition_by`` shuffle or the sink."""

    ops: tuple[Op, ...]
    shuffle_cols: tuple[str, ...] = ()
    shuffle_n: int = 0
    shuffle_types: tuple[str, ...] | None = None
    sink: Callable[[Any], Any] | None = None
    sink_per: str = "record"


@dataclass(frozen=True)
class TaskPlan:
    """Everything a task needs, picklable: config (with the Redis URL), stages, policy."""

    config: FTConfig
    source: int
    segments: tuple[Segment, ...]
    on_error: str
    codecs: tuple[tuple[str, str], ...]
    key: tuple[str, ...]


class Unconfirmed:
    """A sink's answer that some writes were not confirmed (an async sink that never
    acknowledged them). Their records stay pending -- neither acked nor failed -- so they
    time out and are replayed, like records lost in flight. A per-record sink returns
    ``UNCONFIRMED``; a per-partition sink returns ``Unconfirmed(positions)`` with the
    positions, in the list it was given, of the records it could not confirm."""

    __slots__ = ("positions",)

    def __init__(self, positions: Iterable[int] = ()) -> None:
        self.positions = frozenset(positions)

    def __repr__(self) -> str:
        return f"Unconfirmed({sorted(self.positions)})"


UNCONFIRMED = Unconfirmed()


@dataclass
class TaskSummary:
    """What one task reports to the driver (exact counts, the first messages)."""

    stage: int
    partition: int
    attempt: int
    fresh: int = 0
    replayed: int = 0
    inputs: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0
    written: int = 0
    unconfirmed: int = 0
    errors: list[str] = field(default_factory=list)
    rejects: list[str] = field(default_factory=list)

    def note(self, bucket: list[str], text: str) -> None:
        if len(bucket) < MAX_MESSAGES:
            bucket.append(text)


def _error_text(where: str, e: BaseException) -> str:
    if isinstance(e, FailRecord):
        return f"{where}: FailRecord: {e}"
    tb = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" (at {tb[0].filename}:{tb[0].lineno})" if tb else ""
    return f"{where}: {type(e).__name__}: {e}{at}"[:_ERROR_CHARS]


def _name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _apply(ops: tuple[Op, ...], record: Any) -> list[Any]:
    """Run the chained stages on one record: its outputs, or the stage's exception with
    the stage's label attached as ``e.ft_where``."""
    items = [record]
    for i, (kind, fn) in enumerate(ops):
        try:
            if kind == "map":
                items = [fn(x) for x in items]
            elif kind == "filter":
                items = [x for x in items if fn(x)]
            else:
                items = [y for x in items for y in fn(x)]
        except Exception as e:
            with contextlib.suppress(AttributeError, TypeError):
                e.ft_where = f"{kind}[{i}] {_name(fn)}"  # type: ignore[attr-defined]
            raise
    return items


def _context() -> tuple[int, int]:
    from pyspark import TaskContext

    tc = TaskContext.get()
    return (tc.partitionId(), tc.attemptNumber()) if tc else (-1, 0)


def _describe(plan: TaskPlan, partition: int, row_no: int, record: dict[str, Any]) -> str:
    if plan.key:
        what = "key=" + repr({c: record.get(c) for c in plan.key})
    else:
        what = "row=" + repr(record)[:200]
    return f"source={plan.source} partition={partition} row={row_no} {what}"


def run_source_task(plan: TaskPlan, replays: Any, index: int, rows: Iterable[Any]) -> Iterator[Any]:
    """The source segment of one partition: persist each fresh row (payload = the row
    as a msgpack map, hash code = the JVM's ``hash(key)``), then this partition's
    claimed replays (already inited with their new ids), all through segment 0."""
    partition, attempt = _context()
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
    partition, attempt = _context()
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
    seg = plan.segments[stage]
    raise_all = plan.on_error == "fail_batch"
    partitioner = HashPartitioner(seg.shuffle_n, seg.shuffle_types) if seg.shuffle_n else None
    held: list[RecordId] = []  # sink per partition: inputs whose outputs are buffered
    buffer: list[Any] = []
    owners: list[RecordId] = []  # owners[i]: the input whose output is buffer[i]

    def fail(rid: RecordId, where: str, e: BaseException) -> None:
        if raise_all and not isinstance(e, FailRecord):
            raise e
        text = _error_text(where, e)
        h.fail(rid, text)
        summary.failed += 1
        summary.note(summary.errors, text)
        log.info("record failed stage=%d partition=%d %s", stage, summary.partition, text)

    for rid, record in inputs:
        summary.inputs += 1
        try:
            outs = _apply(seg.ops, record)
        except Exception as e:
            fail(rid, getattr(e, "ft_where", "stage"), e)
            continue
        if partitioner is not None:
            try:
                cols = seg.shuffle_cols
                targets = [partitioner.partition(tuple(o[c] for c in cols)) for o in outs]
            except Exception as e:
                fail(rid, f"partition_by{list(seg.shuffle_cols)}", e)
                continue
            for target, out in zip(targets, outs, strict=True):
                child = h.emit(rid)
                yield target, (child[0], child[1], out)
            h.ack(rid)
            summary.acked += 1
        elif seg.sink_per == "partition":
            held.append(rid)
            buffer.extend(outs)
            owners.extend([rid] * len(outs))
        else:
            assert seg.sink is not None
            confirmed = True
            try:
                for out in outs:
                    if isinstance(seg.sink(out), Unconfirmed):
                        confirmed = False
            except Exception as e:
                fail(rid, f"sink {_name(seg.sink)}", e)
                continue
            summary.written += len(outs)
            if confirmed:
                h.ack(rid)
                summary.acked += 1
            else:
                summary.unconfirmed += 1  # left pending: it times out and is replayed
    if held:
        assert seg.sink is not None
        try:
            answer = seg.sink(buffer)
        except Exception as e:
            for rid in dict.fromkeys(held):
                fail(rid, f"sink {_name(seg.sink)}", e)
        else:
            summary.written += len(buffer)
            unconfirmed = set()
            if isinstance(answer, Unconfirmed):
                unconfirmed = {owners[i] for i in answer.positions if 0 <= i < len(owners)}
            for rid in held:
                if rid in unconfirmed:
                    continue  # left pending: it times out and is replayed
                h.ack(rid)
                summary.acked += 1
            summary.unconfirmed += len(unconfirmed)
    h.flush()  # the task's one flush: after it, every record is complete or persisted
    reports = [*(upstream or ()), summary]
    if partitioner is not None:  # summaries travel through the shuffle with the records
        for r in reports:
            yield r.partition % seg.shuffle_n, (None, r)
    else:
        yield from reports
