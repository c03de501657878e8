"""Row stages on the vectorized machinery: ``map`` / ``flat_map`` / ``filter`` / ``sink``
compiled into batch stages, so a row pipeline gets Spark's own shuffle, batch-scope acking,
immediate replays, bisection-free per-record failures and Spark Connect.

A row segment becomes one batch stage (:class:`RowStage`) that turns each Arrow row into
a record (a dict, as ``Row.asDict()`` gives it: naive local timestamps), runs the chained
row functions on it and hands its outputs on as one binary column, ``__ft_rec``: each
output record in msgpack (with extension types for dates, timestamps and decimals, so the
next segment sees the values the previous one returned; tuples arrive as lists). When the
segment ends in ``partition_by(cols, n)`` the stage also writes the key columns, typed
(``types=`` or the input schema's), and Spark's ``repartition(n, *cols)`` places the rows.
The sink is a sink batch stage (:class:`RowSink`) over those records.

Invariants: every input row of a stage ends as the parent of its outputs (zero outputs:
complete), or failed with the text of the exception its stage raised (a key that does
not fit its column type, a record msgpack cannot carry: the ``partition_by`` fails it), or
unconfirmed (sinks). Records crossing a shuffle never touch Redis: only the source rows,
persisted as Arrow segments, and residues do.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from ftlayer.errors import ConfigError, FailRecord
from ftlayer.spark.outcome import Outcome
from ftlayer.spark.plan import (
    BatchStage,
    Op,
    RowFn,
    Segment,
    Unconfirmed,
    apply_ops,
    error_text,
)
from ftlayer.spark.policy import DEFAULT_POLICY, BatchContext, ErrorPolicy, is_dead

__all__ = ["REC_COL", "RowSink", "RowStage", "compile_rows", "decode_rec", "encode_rec"]

REC_COL = "__ft_rec"
"""The binary column carrying a row segment's output records (msgpack) to the next one."""

_DATE, _DECIMAL, _DATETIME = 1, 2, 3


def _default(obj: Any) -> Any:
    if isinstance(obj, dt.datetime):
        return msgpack.ExtType(_DATETIME, obj.isoformat().encode())
    if isinstance(obj, dt.date):
        return msgpack.ExtType(_DATE, obj.isoformat().encode())
    if isinstance(obj, Decimal):
        return msgpack.ExtType(_DECIMAL, str(obj).encode())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, bytearray | memoryview):
        return bytes(obj)
    raise TypeError(f"a value of type {type(obj).__name__} cannot cross a shuffle")


def _ext(code: int, data: bytes) -> Any:
    text = data.decode()
    if code == _DATETIME:
        return dt.datetime.fromisoformat(text)
    if code == _DATE:
        return dt.date.fromisoformat(text)
    if code == _DECIMAL:
        return Decimal(text)
    return msgpack.ExtType(code, data)


def encode_rec(record: Any) -> bytes:
    """A record as it crosses a shuffle (TypeError/ValueError when it cannot)."""
    return msgpack.packb(record, default=_default, use_bin_type=True, datetime=False)


def decode_rec(data: bytes) -> Any:
    return msgpack.unpackb(data, ext_hook=_ext, raw=False, strict_map_key=False)


def _local_naive(v: Any) -> Any:  # TimestampType as Row.asDict() gives it
    return v.astimezone().replace(tzinfo=None) if isinstance(v, dt.datetime) else v


def _records(batch: pa.RecordBatch) -> list[Any]:
    """The records of an input batch: decoded ``__ft_rec``, or the source's rows."""
    if REC_COL in batch.schema.names:
        return [decode_rec(b) for b in batch.column(REC_COL).to_pylist()]
    rows = batch.to_pylist()
    zoned = [f.name for f in batch.schema if pa.types.is_timestamp(f.type) and f.type.tz]
    for row in rows if zoned else ():
        for name in zoned:
            row[name] = _local_naive(row[name])
    return rows


class _Failures:
    """Failed input rows with their error texts (one each, the first wins)."""

    def __init__(self, raise_all: bool) -> None:
        self.raise_all = raise_all
        self.rows: dict[int, str] = {}
        self.dead: set[int] = set()

    def add(self, row: int, where: str, e: BaseException) -> None:
        if self.raise_all and not isinstance(e, FailRecord):
            raise e
        if row not in self.rows and is_dead(e):
            self.dead.add(row)
        self.rows.setdefault(row, error_text(where, e))

    def outcome(self, **kw: Any) -> Outcome:
        rows = sorted(self.rows)
        return Outcome(failed=rows, errors=[self.rows[r] for r in rows],
                       dead_letter=sorted(self.dead), **kw)  # fmt: skip


@dataclass(frozen=True)
class RowStage:
    """A row segment's stages as one batch function (see the module docstring).
    ``key_types``: the Arrow type of each ``key_cols`` column written for the shuffle."""

    ops: tuple[Op, ...]
    key_cols: tuple[str, ...]
    key_types: tuple[pa.DataType, ...]
    raise_all: bool
    errors: ErrorPolicy = DEFAULT_POLICY

    ft_kind = "rows"

    @property
    def wants_ctx(self) -> bool:
        return any(isinstance(fn, RowFn) and fn.ctx for _, fn in self.ops)

    @property
    def __name__(self) -> str:  # the stage's label in BatchResult.stages
        names = [f"{kind} {getattr(fn, '__name__', '?')}" for kind, fn in self.ops]
        if self.key_cols:
            names.append(f"partition_by{list(self.key_cols)}")
        return " | ".join(names) or "records"

    def __call__(self, batch: pa.RecordBatch, ctx: BatchContext | None = None) -> Outcome:
        fails = _Failures(self.raise_all)
        outs: list[Any] = []
        parents: list[int] = []
        for i, record in enumerate(_records(batch)):
            try:
                rctx = None if ctx is None else ctx.record(i)
                items = apply_ops(self.ops, record, self.errors, rctx)
            except Exception as e:
                fails.add(i, getattr(e, "ft_where", "stage"), e)
                continue
            outs.extend(items)
            parents.extend([i] * len(items))
        where = f"partition_by{list(self.key_cols)}" if self.key_cols else "records"
        keys: list[list[Any]] = [[] for _ in self.key_cols]
        blobs: list[bytes | None] = []
        for out, parent in zip(outs, parents, strict=True):
            try:
                row_keys = [out[c] for c in self.key_cols]
                blob: bytes | None = encode_rec(out)
            except Exception as e:
                fails.add(parent, where, e)
                row_keys, blob = [None] * len(self.key_cols), None
            blobs.append(blob)
            for col, value in zip(keys, row_keys, strict=True):
                col.append(value)
        arrays = [self._column(values, t, parents, fails, where)
                  for values, t in zip(keys, self.key_types, strict=True)]  # fmt: skip
        arrays.append(pa.array(blobs, pa.binary()))
        names = [*self.key_cols, REC_COL]
        return fails.outcome(output=pa.RecordBatch.from_arrays(arrays, names=names),
                             parents=np.array(parents, np.int64))  # fmt: skip

    @staticmethod
    def _column(
        values: list[Any], t: pa.DataType, parents: list[int], fails: _Failures, where: str
    ) -> pa.Array:
        """The key column; a value that does not fit its type fails its record."""
        try:
            return pa.array(values, t)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            pass
        fit: list[Any] = []
        for value, parent in zip(values, parents, strict=True):
            try:
                pa.array([value], t)
                fit.append(value)
            except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
                fails.add(parent, where, ValueError(f"key {value!r} is not a {t}: {e}"))
                fit.append(None)
        return pa.array(fit, t)


@dataclass(frozen=True)
class RowSink:
    """A row sink as a sink batch function: ``per="record"`` calls ``fn(record)`` for
    each record, ``per="partition"`` calls ``fn(records)`` once per input batch (up to
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` records, 10,000 by default)."""

    fn: RowFn
    per: str
    raise_all: bool
    errors: ErrorPolicy = DEFAULT_POLICY

    ft_kind = "sink"

    @property
    def wants_ctx(self) -> bool:
        return self.fn.ctx

    @property
    def __name__(self) -> str:
        return self.fn.__name__

    def __call__(self, batch: pa.RecordBatch, ctx: BatchContext | None = None) -> Outcome:
        """``per="partition"``: ``ctx`` (when the sink wants one) is the batch's."""
        fails = _Failures(self.raise_all)
        where = f"sink {self.__name__}"
        records = _records(batch)
        unconfirmed: list[int] = []
        if self.per == "record":
            for i, record in enumerate(records):
                try:
                    rctx = None if ctx is None else ctx.record(i)
                    if isinstance(self.fn(record, rctx, self.errors), Unconfirmed):
                        unconfirmed.append(i)
                except Exception as e:
                    fails.add(i, where, e)
            return fails.outcome(unconfirmed=unconfirmed)
        if not records:
            return fails.outcome()
        try:
            answer = self.fn(records, ctx, self.errors)  # type: ignore[arg-type]
        except Exception as e:
            for i in range(len(records)):
                fails.add(i, where, e)
            return fails.outcome()
        if isinstance(answer, Unconfirmed):
            unconfirmed = [i for i in answer.positions if 0 <= i < len(records)]
        return fails.outcome(unconfirmed=unconfirmed)


def _key_ddl(types: tuple[str, ...], cols: tuple[str, ...]) -> str:
    return ", ".join(f"`{c}` {t}" for c, t in zip(cols, types, strict=True))


def compile_rows(
    segments: tuple[Segment, ...],
    input_schema: Any,
    on_error: str,
    arrow_schema: Any,
    errors: ErrorPolicy = DEFAULT_POLICY,
) -> tuple[Segment, ...]:
    """The batch-stage segments running a row pipeline (``input_schema``: the source
    DataFrame's StructType; ``arrow_schema(ddl)``: the session's DDL parser; ``errors``:
    the pipeline's policy, applied per record -- the batch stages they compile to retry
    nothing themselves)."""
    names = set(input_schema.fieldNames())
    raise_all = on_error == "fail_batch"
    out = []
    last = len(segments) - 1
    for i, seg in enumerate(segments):
        stages: tuple[Op, ...] = ()
        if seg.shuffle_n:
            types = seg.shuffle_types
            if types is None:
                missing = [c for c in seg.shuffle_cols if c not in names]
                if missing:
                    raise ConfigError(
                        f"partition_by({list(seg.shuffle_cols)}) after row stages needs "
                        f"types= for {missing}: they are not input columns, and Spark's "
                        "placement of a key depends on its type"
                    )
                types = tuple(input_schema[c].dataType.simpleString() for c in seg.shuffle_cols)
            ddl = _key_ddl(types, seg.shuffle_cols)
            arrow_types = tuple(f.type for f in arrow_schema(ddl))
            stage = RowStage(seg.ops, seg.shuffle_cols, arrow_types, raise_all, errors)
            stages = (("batches", BatchStage(stage, f"{ddl}, `{REC_COL}` binary",
                                             errors=DEFAULT_POLICY)),)  # fmt: skip
        elif seg.ops:
            stage = RowStage(seg.ops, (), (), raise_all, errors)
            stages = (("batches", BatchStage(stage, f"`{REC_COL}` binary",
                                             errors=DEFAULT_POLICY)),)  # fmt: skip
        sink = None
        if i == last:
            assert seg.sink is not None
            sink = RowSink(RowFn.of(seg.sink), seg.sink_per, raise_all,
                           seg.sink_errors or errors)  # fmt: skip
        out.append(replace(seg, ops=stages, shuffle_types=None, sink=sink, sink_per="batch",
                           sink_pandas=False, sink_errors=DEFAULT_POLICY))  # fmt: skip
    return tuple(out)
