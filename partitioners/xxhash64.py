"""Spark SQL's ``xxhash64(c1, c2, …)``, on top of the ``xxhash`` package's XXH64.

Reference (facts only): ``sql/catalyst/.../expressions/XXH64.java`` and ``hash.scala`` in
apache/spark. Spark's ``XXH64.hashInt``/``hashLong`` are XXH64 of the value's 4/8
little-endian bytes, and ``hashUnsafeBytes`` is plain XXH64 of the bytes; all with the
running hash (an unsigned 64-bit view of the signed seed) as seed. Values are reduced to
int/long/bytes exactly as for Murmur3 (see :mod:`partitioners.spark_types`); columns chain
and nulls pass the seed through. Result: signed int64.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

import xxhash

from .errors import TypeMismatchError
from .spark_types import BYTES, INT, LONG, encoder_for, infer_type

__all__ = ["spark_xxhash64"]

_M64: Final = 0xFFFFFFFFFFFFFFFF
_U32 = struct.Struct("<I").pack
_U64 = struct.Struct("<Q").pack
_digest = xxhash.xxh64_intdigest


def _hash_int(value: int, seed: int) -> int:
    return _digest(_U32(value & 0xFFFFFFFF), seed)


def _hash_long(value: int, seed: int) -> int:
    return _digest(_U64(value & _M64), seed)


def _hash_bytes(value: bytes, seed: int) -> int:
    return _digest(value, seed)


_SHAPES: Final[dict[str, Callable[[Any, int], int]]] = {
    INT: _hash_int,
    LONG: _hash_long,
    BYTES: _hash_bytes,
}


def spark_xxhash64(
    values: Sequence[Any], types: Sequence[Any] | None = None, seed: int = 42
) -> int:
    """Spark SQL ``xxhash64(c1, c2, …)`` of ``values`` in columns of ``types`` (signed int64).

    ``types=None`` infers each column's type as PySpark does; nulls pass the seed through.
    """
    if not isinstance(values, (tuple, list)):
        raise TypeMismatchError(
            f"values must be a tuple or list of column values, got {type(values).__name__}"
        )
    if isinstance(types, str):
        types = [types]
    if types is not None and len(types) != len(values):
        raise TypeMismatchError(f"{len(values)} values given for {len(types)} declared types")
    h = seed & _M64
    for i, v in enumerate(values):
        if v is None:
            continue
        shape, convert = encoder_for(infer_type(v) if types is None else types[i])
        h = _SHAPES[shape](convert(v), h)
    return h - (1 << 64) if h >> 63 else h
