"""Spark SQL's Murmur3 hash (``hash(c1, c2, …)``), written from the algorithm.

Reference (facts only): ``common/unsafe/.../hash/Murmur3_x86_32.java`` and
``sql/catalyst/.../expressions/hash.scala`` in apache/spark.

* ints use ``hashInt`` (one 4-byte block), longs ``hashLong`` (low word, then high word);
* strings, binary and wide decimals use the *legacy* ``hashUnsafeBytes``: 4-byte
  little-endian blocks, then every trailing byte is mixed as its own block after sign
  extension (not the standard Murmur3 tail), and the final mix uses the byte length;
* columns chain: each column's hash is the seed of the next; a null leaves the seed as is.

Internally hashes are unsigned 32-bit Python ints; the public results are signed int32,
like Spark's. Invariant: ``spark_murmur3(v, t) == F.hash(*cols)`` for supported types.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any, Final

from .errors import TypeMismatchError
from .spark_types import BYTES, INT, LONG, encoder_for, infer_type

__all__ = [
    "column_hasher",
    "hash_bytes",
    "hash_int",
    "hash_long",
    "spark_murmur3",
    "to_int32",
]

_M: Final = 0xFFFFFFFF
_C1: Final = 0xCC9E2D51
_C2: Final = 0x1B873593

#: Column hasher: ``(value, unsigned seed) -> unsigned hash``; ``value`` is never None.
ColumnHasher = Callable[[Any, int], int]


def _mix_k1(k: int) -> int:
    k = (k & _M) * _C1 & _M
    k = ((k << 15) | (k >> 17)) & _M
    return k * _C2 & _M


# mixK1 of every possible tail byte, sign-extended as Java's ``byte`` is.
_TAIL: Final = tuple(_mix_k1(b - 256 if b >= 128 else b) for b in range(256))
_BLOCKS: Final = tuple(struct.Struct(f"<{i}I").unpack_from for i in range(33))


def to_int32(h: int) -> int:
    """Signed view of an unsigned 32-bit hash."""
    return h - 0x100000000 if h & 0x80000000 else h


# The hot functions below spell the constants as literals (LOAD_CONST is cheaper than a
# global lookup) and mask only where the low 32 bits could otherwise be lost: a product or
# sum taken before ``& _M`` has the same low 32 bits as one taken on masked operands.
# C1 = 0xCC9E2D51, C2 = 0x1B873593, N = 0xE6546B64, F1 = 0x85EBCA6B, F2 = 0xC2B2AE35.


def hash_int(value: int, seed: int) -> int:
    """``Murmur3_x86_32.hashInt``; ``value`` any int (low 32 bits used), ``seed`` unsigned."""
    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    h = seed ^ (((k << 15) | (k >> 17)) * 0x1B873593 & 0xFFFFFFFF)
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64 & 0xFFFFFFFF) ^ 4
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ (h >> 16)


def hash_long(value: int, seed: int) -> int:
    """``Murmur3_x86_32.hashLong``: low 32 bits, then high 32 bits, length 8."""
    k = (value & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    h = seed ^ (((k << 15) | (k >> 17)) * 0x1B873593 & 0xFFFFFFFF)
    h = ((h << 13) | (h >> 19)) * 5 + 0xE6546B64 & 0xFFFFFFFF
    k = ((value >> 32) & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    h ^= ((k << 15) | (k >> 17)) * 0x1B873593 & 0xFFFFFFFF
    h = (((h << 13) | (h >> 19)) * 5 + 0xE6546B64 & 0xFFFFFFFF) ^ 8
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ (h >> 16)


def hash_bytes(data: bytes, seed: int) -> int:
    """``Murmur3_x86_32.hashUnsafeBytes`` (legacy tail: one block per sign-extended byte)."""
    n = len(data)
    aligned = n & ~3
    h = seed
    if aligned:
        words = aligned >> 2
        blocks = _BLOCKS[words](data) if words < 33 else struct.unpack_from(f"<{words}I", data)
        for k in blocks:
            k = k * 0xCC9E2D51 & 0xFFFFFFFF
            h ^= ((k << 15) | (k >> 17)) * 0x1B873593 & 0xFFFFFFFF
            h = ((h << 13) | (h >> 19)) * 5 + 0xE6546B64 & 0xFFFFFFFF
    for b in data[aligned:]:
        h ^= _TAIL[b]
        h = ((h << 13) | (h >> 19)) * 5 + 0xE6546B64 & 0xFFFFFFFF
    h ^= n
    h ^= h >> 16
    h = h * 0x85EBCA6B & 0xFFFFFFFF
    h ^= h >> 13
    h = h * 0xC2B2AE35 & 0xFFFFFFFF
    return h ^ (h >> 16)


def _string_hasher(value: Any, seed: int) -> int:
    if type(value) is str:
        try:
            return hash_bytes(value.encode("utf-8"), seed)
        except UnicodeEncodeError:
            pass
    return _generic_string(value, seed)  # validates: raises the documented error


_STRING_CONVERT = encoder_for("string")[1]


def _generic_string(value: Any, seed: int) -> int:
    return hash_bytes(_STRING_CONVERT(value), seed)


def _bigint_hasher(value: Any, seed: int) -> int:
    if type(value) is not int:
        return hash_long(_BIGINT_CONVERT(value), seed)
    if -0x8000000000000000 <= value <= 0x7FFFFFFFFFFFFFFF:
        return hash_long(value, seed)
    return hash_long(_BIGINT_CONVERT(value), seed)  # raises ValueOutOfRangeError


_BIGINT_CONVERT = encoder_for("bigint")[1]
_SHAPES: Final = {INT: hash_int, LONG: hash_long, BYTES: hash_bytes}
_FAST: Final[dict[str, ColumnHasher]] = {"string": _string_hasher, "bigint": _bigint_hasher}


def column_hasher(spec: Any) -> ColumnHasher:
    """A ``(value, unsigned seed) -> unsigned hash`` function for one declared column type.

    The type is resolved once here, so per-value work is only validation and hashing.
    Wrong Python types or out-of-range values raise a ``PartitionerError``.
    """
    key = spec if isinstance(spec, str) else None
    if key is not None:
        fast = _FAST.get(key.strip().lower())
        if fast is not None:
            return fast
    shape, convert = encoder_for(spec)
    core = _SHAPES[shape]

    def hasher(value: Any, seed: int, _core: Any = core, _convert: Any = convert) -> int:
        result: int = _core(_convert(value), seed)
        return result

    return hasher


_INFERRED_HASHERS: dict[Any, ColumnHasher] = {}


_BY_PYTHON_TYPE: dict[type, ColumnHasher] = {}


def inferred_hasher(value: Any) -> ColumnHasher:
    """The column hasher for the type PySpark would infer for ``value`` (cached per exact
    Python type of the builtin scalars, which always infer the same Spark type)."""
    fast = _BY_PYTHON_TYPE.get(type(value))
    if fast is not None:
        return fast
    t = infer_type(value)
    h = _INFERRED_HASHERS.get(t)
    if h is None:
        h = _INFERRED_HASHERS[t] = column_hasher(t)
    if type(value) in _CACHEABLE:
        _BY_PYTHON_TYPE[type(value)] = h
    return h


_CACHEABLE: Final = frozenset(
    {bool, int, float, str, bytes, bytearray, Decimal, datetime.date, datetime.datetime}
)


def resolve_hashers(types: Sequence[Any] | None, width: int) -> list[ColumnHasher] | None:
    """Column hashers for declared ``types`` (checked against the key width), else None."""
    if types is None:
        return None
    if isinstance(types, str):
        types = [types]
    if len(types) != width:
        raise TypeMismatchError(f"{width} values given for {len(types)} declared types")
    return [column_hasher(t) for t in types]


def _as_columns(values: Any) -> Sequence[Any]:
    if isinstance(values, (tuple, list)):
        return values
    raise TypeMismatchError(
        f"values must be a tuple or list of column values, got {type(values).__name__}"
    )


def spark_murmur3(values: Sequence[Any], types: Sequence[Any] | None = None, seed: int = 42) -> int:
    """Spark SQL ``hash(c1, c2, …)`` of ``values`` in columns of ``types`` (signed int32).

    ``types=None`` infers each column's type from its value as PySpark does; nulls pass
    the running hash through (so an all-null key hashes to ``seed``).
    """
    cols = _as_columns(values)
    h = seed & _M
    if types is None:
        for v in cols:
            if v is not None:
                h = inferred_hasher(v)(v, h)
    else:
        hashers = resolve_hashers(types, len(cols))
        assert hashers is not None
        for v, hasher in zip(cols, hashers, strict=True):
            if v is not None:
                h = hasher(v, h)
    return to_int32(h)
