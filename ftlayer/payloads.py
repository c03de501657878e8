"""Row payloads: a Spark row as a msgpack map, and back as the fresh row looked.

msgpack carries ints, floats, strings, bools, lists and maps as they come; the columns it
cannot carry as PySpark hands them out (dates, timestamps, decimals, binary) get a codec by
their Spark type. Shared by the row path and the vectorized path (residues and replays).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from serialization import decode_payload, encode_payload

__all__ = [
    "Codecs",
    "arrow_codecs",
    "decode_record",
    "encode_record",
    "field_codecs",
    "normalize_row",
]

Codecs = tuple[tuple[str, str], ...]
"""(column, codec name) pairs of a schema (see :func:`field_codecs`)."""


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


def field_codecs(schema: Any) -> Codecs:
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


def encode_record(record: dict[str, Any], codecs: Codecs) -> bytes:
    """The record's msgpack payload (PayloadEncodeError if a value cannot be encoded)."""
    if codecs:
        record = dict(record)
        for col, name in codecs:
            if col in record:
                record[col] = _codec(name)[0](record[col])
    return encode_payload(record)


def normalize_row(record: dict[str, Any], codecs: Codecs) -> None:
    """Make a fresh row look like its decoded replay (binary -> bytes), in place."""
    for col, name in codecs:
        if name == "binary" and col in record:
            record[col] = _bin_in(record[col])


def decode_record(payload: bytes, codecs: Codecs, desc: str) -> Any:
    """The record of a replay payload, as the fresh row looked (PayloadDecodeError)."""
    record = decode_payload(payload, record=desc)
    if codecs and isinstance(record, dict):
        for col, name in codecs:
            if col in record:
                record[col] = _codec(name)[1](record[col])
    return record


def arrow_codecs(schema: Any) -> Codecs:
    """Codecs for the columns of an Arrow schema that msgpack
    cannot carry as ``to_pylist`` gives them; tz-aware timestamps pass unchanged."""
    import pyarrow as pa

    out = []
    for f in schema:
        t = f.type
        if pa.types.is_decimal(t):
            out.append((f.name, "decimal"))
        elif pa.types.is_date(t):
            out.append((f.name, "date"))
        elif pa.types.is_timestamp(t) and t.tz is None:
            out.append((f.name, "timestamp_ntz"))
        elif pa.types.is_binary(t) or pa.types.is_large_binary(t):
            out.append((f.name, "binary"))
    return tuple(out)
