"""``ftlayer dlq export --format parquet``: dead letters as one Parquet file that Spark
(``spark.read.parquet``), pandas or DuckDB read.

A row per dead letter: its id (hex, as ``dlq list`` prints it), source, hash code,
partition, lineage id, attempts, when it was dead-lettered, the last failure's reason and
error, ``history`` (a list of every failure: reason, time, attempt, error), why its frame or
payload does not decode (if so), and its payload three ways: ``payload_raw`` (the record's
msgpack bytes, or the undecodable bytes), ``payload_json`` (as ``dlq show --json`` prints
it) and ``payload`` -- the decoded record's columns as a struct, where records are maps
(dicts, Arrow and Spark rows); null for a record that is not one. A struct, not top-level
columns, so a record's own ``id`` or ``error`` never collides with the dead letter's;
``select("payload.*")`` gives them as columns.

Each record column takes the type Arrow infers from its values; a column whose values do
not share one type (an int here, a string there) holds their JSON text instead, and one
that is always null is a string column (Spark reads no Parquet null type).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ftlayer.deadletters import decoded
from ftlayer.persistence import DeadLetter

__all__ = ["dead_letter_table", "write_parquet"]

_TIME = pa.timestamp("ms", tz="UTC")
_FAILURE = pa.struct([("reason", pa.string()), ("time", _TIME), ("attempt", pa.int32()),
                      ("error", pa.string())])  # fmt: skip
_ARROW_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    return repr(value)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, default=_json_default)
    except (TypeError, ValueError):  # keys JSON cannot take (bytes, tuples)
        return json.dumps(repr(value))


def _no_nulls(t: pa.DataType) -> pa.DataType:
    """``t`` with every null type in it (an always-null column or field) as string."""
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_no_nulls(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        inner = t.value_field.with_type(_no_nulls(t.value_type))
        return pa.list_(inner) if pa.types.is_list(t) else pa.large_list(inner)
    return t


def _column(values: list[Any]) -> pa.Array:
    """One record column: Arrow's inferred type, else the values' JSON text."""
    try:
        arr = pa.array(values)
        return arr.cast(_no_nulls(arr.type))
    except _ARROW_ERRORS:
        return pa.array([None if v is None else _json(v) for v in values], pa.string())


def _payload_struct(records: Sequence[Any]) -> pa.StructArray | None:
    """The records' columns as one struct (null where a record is not a map), or None
    when no record is a map with a column."""
    maps = [{str(k): v for k, v in r.items()} if isinstance(r, dict) else None for r in records]
    names = list(dict.fromkeys(k for m in maps if m for k in m))
    if not names:
        return None
    children = [_column([None if m is None else m.get(k) for m in maps]) for k in names]
    mask = pa.array([m is None for m in maps], pa.bool_())
    return pa.StructArray.from_arrays(children, names=names, mask=mask)


def dead_letter_table(letters: Sequence[DeadLetter]) -> pa.Table:
    """The dead letters as one Arrow table (the module docstring lists its columns), oldest
    first (ties by id); the payload struct's fields in the order they first appear in that
    order: the same letters always give the same table."""
    letters = sorted(letters, key=lambda d: (d.time_ms, d.source_id))
    records = [decoded(d) for d in letters]
    frames = [d.frame for d in letters]
    last = [d.history[-1] if d.history else None for d in letters]
    columns: dict[str, pa.Array] = {
        "id": pa.array([f"{d.source_id:016x}" for d in letters], pa.string()),
        "source": pa.array([f.source if f else None for f in frames], pa.int32()),
        "hash_code": pa.array([f.hash_code if f else None for f in frames], pa.int32()),
        "partition": pa.array([f.partition if f else None for f in frames], pa.int32()),
        "lineage": pa.array([f.lineage if f else None for f in frames], pa.int64()),
        "attempts": pa.array([d.attempts for d in letters], pa.int32()),
        "dead_lettered": pa.array([d.time_ms for d in letters], pa.int64()).cast(_TIME),
        "reason": pa.array([h.reason if h else None for h in last], pa.string()),
        "error": pa.array([h.error if h else None for h in last], pa.string()),
        "history": pa.array(
            [[{"reason": h.reason, "time": h.time_ms, "attempt": h.attempt, "error": h.error}
              for h in d.history] for d in letters],
            pa.list_(_FAILURE),
        ),
        "frame_error": pa.array([d.frame_error for d in letters], pa.string()),
        "payload_error": pa.array([error for _, error in records], pa.string()),
        "payload_raw": pa.array([f.payload if f else d.raw for d, f in zip(letters, frames,
                                                                            strict=True)],
                                pa.binary()),
        "payload_json": pa.array([None if error else _json(record) for record, error in records],
                                 pa.string()),
    }  # fmt: skip
    struct = _payload_struct([record for record, _ in records])
    if struct is not None:
        columns["payload"] = struct
    return pa.table(columns)


def write_parquet(letters: Sequence[DeadLetter], path: str) -> None:
    pq.write_table(dead_letter_table(letters), path)
