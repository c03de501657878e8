"""Stage rows: a failed row kept as the input of the segment it failed in, so that its
replay enters the plan there (ftlayer.spark.entries) instead of at the source.

A stored record's payload is either a *source row* -- a msgpack map: the source's columns
(a copy) or its reference (``__ft_loc``/``__ft_pos``) -- or a *stage row*, a msgpack array::

    [entry, fingerprint, schema hash, location or nil, position, format, body]

``entry``: the segment it enters before; ``fingerprint``: the entry's (the pipeline's
definition up to it: Entry.fingerprint), checked when the replay is taken in: a row kept
by another version of the pipeline goes back to its source (a reference) or, a copy with
no source to go back to, to the dead letters, named; ``schema hash``: xxh64 of the
entry's input schema as Spark's analysis gave it, checked where the row enters (a stage
whose code changed its output under the same name); ``location``/``position``: the
source record's reference (nil location: a copy); ``format``/``body``: the entry's
columns, ``json`` -- Spark's ``to_json`` of a struct whose fields are named by position
(``"0"``, ``"1"``, ...), read back with ``from_json`` and the entry's schema, so every
Spark type comes back as Spark wrote it; ``msgpack`` -- a msgpack map of the entry's
columns, as a copied source row is stored (ftlayer.payloads), read back with the entry's
Arrow schema.

Invariant: a stage row names its source record (location, position) whenever the record
has a source to go back to; a row that cannot enter where it was kept is never dropped:
it goes back to its source or is dead-lettered with an error naming it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack
import xxhash

__all__ = ["JSON_OPTIONS", "StageRow", "decode_for_people", "decode_stage_row",
           "encode_stage_row", "schema_hash", "source_payload"]  # fmt: skip

JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX",
                "timestampNTZFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"}  # fmt: skip
"""``to_json``/``from_json`` options keeping timestamps to the microsecond (Spark's
default writes milliseconds)."""


class StageRow(NamedTuple):
    """A stage row's fields (see the module docstring)."""

    entry: int
    fingerprint: int
    schema_hash: int
    location: int | None
    position: int
    format: str
    body: str | bytes
    """``json``: Spark's ``to_json`` text (DataFrame stages); ``msgpack``: a msgpack map
    of the columns, as a source row's (Python stages)."""


def encode_stage_row(row: StageRow) -> bytes:
    """A stage row's payload."""
    return msgpack.packb(list(row), use_bin_type=True)


def decode_stage_row(payload: bytes) -> StageRow | None:
    """The stage row ``payload`` holds; None for a source row (a map) or anything else."""
    if not payload or payload[0] & 0xF0 != 0x90:  # a msgpack fixarray (7 fields)
        return None
    try:
        fields = msgpack.unpackb(payload, raw=False)
    except Exception:
        return None
    if not isinstance(fields, list) or len(fields) != len(StageRow._fields):
        return None
    return StageRow(*fields)


def source_payload(row: StageRow, names: Sequence[str] = ()) -> bytes | None:
    """The source row a stage row goes back to: its reference as a msgpack map. A copy
    has no source to go back to (None) -- but one kept before segment 0 holds the
    source's own columns, ``names`` (given: the dead-letter view's best reading of it)."""
    if row.location is not None:
        return msgpack.packb({"__ft_loc": row.location, "__ft_pos": row.position})
    if row.entry or not names or row.format != "json":
        return None
    try:
        values = json.loads(row.body)  # (str or UTF-8 bytes)
        return msgpack.packb({n: values.get(str(i)) for i, n in enumerate(names)})
    except (ValueError, AttributeError):
        return None


def schema_hash(schema: Any) -> int:
    """xxh64 of a Spark StructType's JSON (int64): what a stage row's body was written
    under."""
    return xxhash.xxh64_intdigest(schema.json().encode()) - (1 << 63)


def decode_for_people(frame: Any) -> Any:
    """A stored record's payload as an operator reads it (``frame``: a
    serialization.Frame): a source row as it is; a stage row as a map of the segment it
    enters before (``__ft_segment``), its source reference and its columns (``row``: by
    name for Python stages, by position for DataFrame stages). Raises as ``Frame.decode``
    does on bytes that do not decode."""
    record = frame.decode()
    row = decode_stage_row(frame.payload)
    if row is None:
        return record
    body = row.body
    if row.format == "json":
        values: Any = json.loads(body)
    else:
        values = msgpack.unpackb(body, raw=False, timestamp=3, strict_map_key=False)
    return {"__ft_segment": row.entry, "__ft_loc": row.location, "__ft_pos": row.position,
            "row": values}
