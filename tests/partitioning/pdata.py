"""Seeded generators of key values for the partitioner mirror tests (no Spark here)."""

from __future__ import annotations

import datetime
import random
import string
from decimal import Decimal
from typing import Any

UTC = datetime.timezone.utc
INT_RANGES = {
    "tinyint": (-(2**7), 2**7 - 1),
    "smallint": (-(2**15), 2**15 - 1),
    "int": (-(2**31), 2**31 - 1),
    "bigint": (-(2**63), 2**63 - 1),
}
# Characters by UTF-8 width: 1, 2, 3 and 4 bytes.
CHARS = {
    1: string.ascii_letters + string.digits + " \x00\x7f",
    2: "éßжλ\u0080\u07ff",
    3: "日本語€\u0800\uffff",
    4: "😀𝄞\U00010000\U0010ffff",
}


def with_nulls(rng: random.Random, values: list[Any], rate: float = 0.05) -> list[Any]:
    return [None if rng.random() < rate else v for v in values]


def ints(rng: random.Random, kind: str, n: int) -> list[int]:
    lo, hi = INT_RANGES[kind]
    edges = [lo, lo + 1, hi, hi - 1, 0, 1, -1, 2, -2, 127, -128, 255, 256]
    edges = [e for e in edges if lo <= e <= hi]
    out = list(edges)
    while len(out) < n:
        r = rng.random()
        if r < 0.3:
            out.append(rng.randint(-1000, 1000))
        elif r < 0.6:
            bits = rng.randint(1, hi.bit_length())
            out.append(rng.choice((1, -1)) * rng.randint(0, 2**bits - 1))
        else:
            out.append(rng.randint(lo, hi))
    return [max(lo, min(hi, v)) for v in out[:n]]


def utf8_string(rng: random.Random, nbytes: int) -> str:
    out: list[str] = []
    left = nbytes
    while left:
        width = rng.choice([w for w in CHARS if w <= left])
        out.append(rng.choice(CHARS[width]))
        left -= width
    return "".join(out)


def strings(rng: random.Random, n: int) -> list[str]:
    out = [utf8_string(rng, length) for length in range(10) for _ in range(3)]
    out += ["", "a", "ab", "abc", "abcd", "\x80".encode("latin-1").decode("latin-1")]
    while len(out) < n:
        out.append(utf8_string(rng, rng.randint(0, 9)))
    return out[:n]


def binaries(rng: random.Random, n: int) -> list[bytes]:
    out = [b"", b"\x00", b"\xff", b"\x80\x7f", b"\xff\xff\xff\xff\xff", bytes(range(256))]
    while len(out) < n:
        out.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 13))))
    return out[:n]


SPECIAL_FLOATS = [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1.0, -1.0]


def doubles(rng: random.Random, n: int) -> list[float]:
    out = SPECIAL_FLOATS + [5e-324, -5e-324, 1.7976931348623157e308, 2.2250738585072014e-308]
    while len(out) < n:
        r = rng.random()
        if r < 0.4:
            out.append(rng.uniform(-1e6, 1e6))
        elif r < 0.7:
            out.append(float(rng.randint(-1000, 1000)))
        else:
            out.append(rng.choice((1, -1)) * 10.0 ** rng.uniform(-300, 300))
    return out[:n]


def floats(rng: random.Random, n: int) -> list[float]:
    # Within float32 range; Python doubles are rounded to float32 by Spark and the mirror.
    out = SPECIAL_FLOATS + [1.401298464324817e-45, 3.4028234663852886e38, 0.1, 1 / 3]
    while len(out) < n:
        r = rng.random()
        if r < 0.5:
            out.append(rng.uniform(-1e6, 1e6))
        else:
            out.append(rng.choice((1, -1)) * 10.0 ** rng.uniform(-40, 38))
    return out[:n]


def dates(rng: random.Random, n: int) -> list[datetime.date]:
    out = [
        datetime.date(1970, 1, 1),
        datetime.date(1969, 12, 31),
        datetime.date(1, 1, 1),
        datetime.date(9999, 12, 31),
        datetime.date(2000, 2, 29),
    ]
    lo, hi = datetime.date(1, 1, 1).toordinal(), datetime.date(9999, 12, 31).toordinal()
    while len(out) < n:
        if rng.random() < 0.5:
            out.append(datetime.date.fromordinal(rng.randint(lo, hi)))
        else:
            out.append(datetime.date.fromordinal(rng.randint(700000, 760000)))
    return out[:n]


def timestamps(rng: random.Random, n: int, aware: bool) -> list[datetime.datetime]:
    tz = UTC if aware else None
    out = [
        datetime.datetime(1970, 1, 1, tzinfo=tz),
        datetime.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=tz),
        datetime.datetime(2038, 1, 19, 3, 14, 8, tzinfo=tz),
        datetime.datetime(1900, 1, 1, 0, 0, 0, 1, tzinfo=tz),
        datetime.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=tz),
    ]
    base = datetime.datetime(1970, 1, 1, tzinfo=tz)
    while len(out) < n:
        micros = rng.randint(-(2**50), 2**50) if rng.random() < 0.5 else rng.randint(0, 2**51)
        out.append(base + datetime.timedelta(microseconds=micros))
    return out[:n]


def decimals(rng: random.Random, n: int, precision: int, scale: int) -> list[Decimal]:
    top = 10**precision - 1
    edges = [0, 1, -1, top, -top, 127, 128, -128, -129, 255, 256, 2**63 - 1, -(2**63)]
    unscaled = [e for e in edges if abs(e) <= top]
    while len(unscaled) < n:
        digits = rng.randint(1, precision)
        unscaled.append(rng.choice((1, -1)) * rng.randint(0, 10**digits - 1))
    return [Decimal(f"{u}E-{scale}") for u in unscaled[:n]]
