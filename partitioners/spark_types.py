"""Spark SQL type names, PySpark-style type inference and value encoding for hashing.

Spark's hash expressions (``Murmur3Hash``, ``XxHash64``; see ``hash.scala`` in apache/spark,
``HashExpression`` / ``InterpretedHashFunction``) reduce every supported value to one of three
shapes before hashing it, and so do we:

* ``INT``   – a 32-bit integer: boolean (1/0), tinyint, smallint, int, date (days since
  1970-01-01), float (``Float.floatToIntBits`` after mapping -0.0 to 0.0; NaN canonical);
* ``LONG``  – a 64-bit integer: bigint, timestamp / timestamp_ntz (microseconds since the
  epoch), double (``Double.doubleToLongBits``, -0.0 → 0.0, NaN canonical), decimal with
  precision ≤ 18 (the unscaled value);
* ``BYTES`` – a byte string: string (UTF-8), binary, decimal with precision > 18 (the
  minimal two's-complement big-endian bytes of the unscaled value, as
  ``BigInteger.toByteArray``).

Invariant: an encoder either returns exactly the int/bytes Spark hashes for that value in a
column of that type, or raises a :class:`~partitioners.errors.PartitionerError`.
Conversions of Python values follow PySpark's own ``toInternal`` (``pyspark/sql/types.py``):
a naive ``datetime`` in a ``timestamp`` column is read in the local time zone of this process
(``time.mktime``), an aware one by its UTC instant; ``timestamp_ntz`` takes the wall clock.
"""

from __future__ import annotations

import calendar
import datetime
import math
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from .errors import TypeMismatchError, UnsupportedTypeError, ValueOutOfRangeError

__all__ = [
    "BYTES",
    "INT",
    "LONG",
    "Encoder",
    "SparkType",
    "encoder_for",
    "infer_type",
    "parse_type",
]

INT: Final = "int"
LONG: Final = "long"
BYTES: Final = "bytes"

#: (shape, convert): ``convert(value)`` returns the int (signed) or bytes Spark hashes.
Encoder = tuple[str, Callable[[Any], Any]]

_EPOCH_ORDINAL: Final = datetime.date(1970, 1, 1).toordinal()
_MAX_LONG_DIGITS: Final = 18
_F32 = struct.Struct("<f")
_U32 = struct.Struct("<I")
_F64 = struct.Struct("<d")
_I64 = struct.Struct("<q")
_FLOAT_NAN_BITS: Final = 0x7FC00000  # Float.floatToIntBits(Float.NaN)
_DOUBLE_NAN_BITS: Final = 0x7FF8000000000000  # Double.doubleToLongBits(Double.NaN)

_ALIASES: Final = {
    "boolean": "boolean",
    "bool": "boolean",
    "tinyint": "tinyint",
    "byte": "tinyint",
    "smallint": "smallint",
    "short": "smallint",
    "int": "int",
    "integer": "int",
    "bigint": "bigint",
    "long": "bigint",
    "float": "float",
    "real": "float",
    "double": "double",
    "string": "string",
    "binary": "binary",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
}
_INT_RANGES: Final = {
    "tinyint": (-(2**7), 2**7 - 1),
    "smallint": (-(2**15), 2**15 - 1),
    "int": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}
_DECIMAL_RE = re.compile(r"^decimal\s*(?:\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\))?$")
_COLLATE_RE = re.compile(r"^string\s+collate\s+(\S+)$")


@dataclass(frozen=True)
class SparkType:
    """A parsed Spark SQL type. ``precision``/``scale`` are set only for ``decimal``."""

    name: str
    precision: int = 0
    scale: int = 0

    def __str__(self) -> str:
        if self.name == "decimal":
            return f"decimal({self.precision},{self.scale})"
        return self.name


def parse_type(spec: Any) -> SparkType:
    """Parse a Spark SQL type name (``"bigint"``, ``"decimal(20,2)"``, …).

    Also accepts a :class:`SparkType` or any object with ``simpleString()`` (a PySpark
    ``DataType``). Collated strings other than ``UTF8_BINARY`` raise
    :class:`UnsupportedTypeError`: Spark hashes their collation key, which we do not mirror.
    """
    if isinstance(spec, SparkType):
        return spec
    if hasattr(spec, "simpleString") and not isinstance(spec, str):
        spec = spec.simpleString()
    if not isinstance(spec, str):
        raise UnsupportedTypeError(f"type must be a Spark SQL type name, got {spec!r}")
    text = " ".join(spec.strip().lower().split())
    name = _ALIASES.get(text)
    if name is not None:
        return SparkType(name)
    m = _COLLATE_RE.match(text)
    if m:
        if m.group(1) == "utf8_binary":
            return SparkType("string")
        raise UnsupportedTypeError(
            f"collated string type {spec!r} is not supported: Spark hashes the collation key "
            "of such strings; only UTF8_BINARY strings are mirrored"
        )
    m = _DECIMAL_RE.match(text)
    if m:
        precision = int(m.group(1)) if m.group(1) else 10
        scale = int(m.group(2)) if m.group(2) else 0
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise UnsupportedTypeError(f"invalid decimal type {spec!r}")
        return SparkType("decimal", precision, scale)
    raise UnsupportedTypeError(f"unsupported Spark SQL type {spec!r}")


_INFERRED: Final = {
    bool: SparkType("boolean"),
    int: SparkType("bigint"),
    float: SparkType("double"),
    str: SparkType("string"),
    bytes: SparkType("binary"),
    bytearray: SparkType("binary"),
    Decimal: SparkType("decimal", 38, 18),
    datetime.date: SparkType("date"),
    datetime.datetime: SparkType("timestamp"),
}


def infer_type(value: Any) -> SparkType:
    """The Spark SQL type PySpark's schema inference gives ``value`` (``_infer_type``).

    ``None`` has no type of its own; callers skip it (nulls pass the seed through).
    """
    t = _INFERRED.get(type(value))
    if t is not None:
        return t
    for py_type in (bool, int, float, str, bytes, bytearray, Decimal, datetime.datetime):
        if isinstance(value, py_type):
            return _INFERRED[py_type]
    if isinstance(value, datetime.date):
        return _INFERRED[datetime.date]
    raise UnsupportedTypeError(
        f"cannot infer a supported Spark SQL type for {type(value).__name__} value {value!r}"
    )


def _mismatch(value: Any, t: str) -> TypeMismatchError:
    return TypeMismatchError(f"{type(value).__name__} value {value!r} is not valid for {t}")


def _boolean(value: Any) -> int:
    if type(value) is not bool:
        raise _mismatch(value, "boolean")
    return 1 if value else 0


def _integral(name: str) -> Callable[[Any], int]:
    lo, hi = _INT_RANGES[name]

    def convert(value: Any) -> int:
        if type(value) is not int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _mismatch(value, name)
            value = int(value)
        if value < lo or value > hi:
            raise ValueOutOfRangeError(f"{value} is out of range for {name} [{lo}, {hi}]")
        return value

    return convert


def _float_bits(value: Any) -> int:
    if not isinstance(value, float):
        raise _mismatch(value, "float")
    if value != value:
        return _FLOAT_NAN_BITS
    if value == 0.0:  # -0.0 and 0.0 hash alike (SPARK-35207)
        return 0
    try:
        packed = _F32.pack(value)
    except OverflowError:
        raise ValueOutOfRangeError(f"{value!r} overflows float (32-bit)") from None
    bits: int = _U32.unpack(packed)[0]
    return bits - (1 << 32) if bits & 0x80000000 else bits


def _double_bits(value: Any) -> int:
    if not isinstance(value, float):
        raise _mismatch(value, "double")
    if value != value:
        return _DOUBLE_NAN_BITS
    if value == 0.0:  # -0.0 and 0.0 hash alike (SPARK-35207)
        return 0
    bits: int = _I64.unpack(_F64.pack(value))[0]
    return bits


def _unscaled(precision: int, scale: int) -> Callable[[Any], int]:
    limit = 10**precision
    label = f"decimal({precision},{scale})"

    def convert(value: Any) -> int:
        if not isinstance(value, Decimal):
            raise _mismatch(value, label)
        if not value.is_finite():
            raise ValueOutOfRangeError(f"{value!r} is not a finite decimal")
        sign, digits, exponent = value.as_tuple()
        assert isinstance(exponent, int)
        magnitude = int("".join(map(str, digits))) if digits else 0
        shift = exponent + scale
        if shift >= 0:
            magnitude *= 10**shift
        else:
            magnitude, rest = divmod(magnitude, 10**-shift)
            if rest:
                raise ValueOutOfRangeError(
                    f"{value} has more than {scale} fractional digits for {label}"
                )
        if magnitude >= limit:
            raise ValueOutOfRangeError(f"{value} does not fit {label}")
        return -magnitude if sign else magnitude

    return convert


def _big_endian(unscaled: Callable[[Any], int]) -> Callable[[Any], bytes]:
    def convert(value: Any) -> bytes:
        n = unscaled(value)
        # BigInteger.toByteArray: minimal two's complement, at least one byte.
        length = ((n if n >= 0 else ~n).bit_length() + 8) // 8
        return n.to_bytes(length, "big", signed=True)

    return convert


def _string(value: Any) -> bytes:
    if not isinstance(value, str):
        raise _mismatch(value, "string")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueOutOfRangeError(f"{value!r} is not encodable as UTF-8") from None


def _binary(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray):
        return bytes(value)
    raise _mismatch(value, "binary")


def _date(value: Any) -> int:
    if not isinstance(value, datetime.date):
        raise _mismatch(value, "date")
    return value.toordinal() - _EPOCH_ORDINAL


def _timestamp(value: Any) -> int:
    if not isinstance(value, datetime.datetime):
        raise _mismatch(value, "timestamp")
    if value.tzinfo is not None:
        seconds = calendar.timegm(value.utctimetuple())
    else:  # PySpark's TimestampType.toInternal reads naive datetimes in local time
        seconds = int(time.mktime(value.timetuple()))
    return seconds * 1_000_000 + value.microsecond


def _timestamp_ntz(value: Any) -> int:
    if not isinstance(value, datetime.datetime):
        raise _mismatch(value, "timestamp_ntz")
    return calendar.timegm(value.timetuple()) * 1_000_000 + value.microsecond


_SIMPLE: Final[dict[str, Encoder]] = {
    "boolean": (INT, _boolean),
    "tinyint": (INT, _integral("tinyint")),
    "smallint": (INT, _integral("smallint")),
    "int": (INT, _integral("int")),
    "bigint": (LONG, _integral("bigint")),
    "float": (INT, _float_bits),
    "double": (LONG, _double_bits),
    "string": (BYTES, _string),
    "binary": (BYTES, _binary),
    "date": (INT, _date),
    "timestamp": (LONG, _timestamp),
    "timestamp_ntz": (LONG, _timestamp_ntz),
}
_DECIMALS: dict[tuple[int, int], Encoder] = {}


def encoder_for(spec: Any) -> Encoder:
    """The ``(shape, convert)`` pair for a type (name, :class:`SparkType` or DataType)."""
    t = parse_type(spec)
    if t.name != "decimal":
        return _SIMPLE[t.name]
    key = (t.precision, t.scale)
    enc = _DECIMALS.get(key)
    if enc is None:
        unscaled = _unscaled(t.precision, t.scale)
        if t.precision <= _MAX_LONG_DIGITS:
            enc = (LONG, unscaled)
        else:
            enc = (BYTES, _big_endian(unscaled))
        _DECIMALS[key] = enc
    return enc


def is_nan(value: Any) -> bool:
    """True for float or Decimal NaN (helper for callers that must reject NaN)."""
    if isinstance(value, float):
        return math.isnan(value)
    return isinstance(value, Decimal) and value.is_nan()
