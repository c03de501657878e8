"""PySpark's ``portable_hash`` (``pyspark.rdd.portable_hash``), seed-independent of this process.

``rdd.partitionBy(n)`` places key ``k`` in ``portable_hash(k) % n``, computed in a Python
worker. ``portable_hash`` is CPython's ``hash()`` except that ``None`` is 0 and tuples are
combined with a fixed recipe. ``hash()`` of ``str``/``bytes`` depends on the interpreter's hash
secret, which comes from ``PYTHONHASHSEED``. PySpark (``SparkContext.__init__``) starts its
workers with ``PYTHONHASHSEED`` = the driver's value, or ``"0"`` when the driver has none;
note that it *overrides* ``spark.executorEnv.PYTHONHASHSEED``.

Seed handling (design): like PySpark we require ``PYTHONHASHSEED`` in ``os.environ`` and
raise :class:`HashSeedError` naming it when it is missing. Its value is taken as the seed of
Spark's workers. If this interpreter was itself started with that seed, the builtin
``hash()`` is used (fast path, detected by hashing a probe). Otherwise (e.g. a plain
``pytest`` run, where the process hash is randomised and the variable was set later) we mirror
CPython's seeded hashing: the 128-bit SipHash key is derived from the seed with CPython's
LCG (``Python/bootstrap_hash.c``; seed 0 means an all-zero key), ``bytes`` are hashed with
``sys.hash_info.algorithm`` (SipHash-1-3 since 3.11, SipHash-2-4 before), and a ``str`` is
hashed over its internal representation (Latin-1, UCS-2 or UCS-4 little-endian bytes, by its
widest character). Assumption: the workers run the same CPython as this process.

Mirrored values: ``None``, ``bool``, ``int``, ``float`` (not NaN: its hash is identity based
since Python 3.10), finite ``Decimal``, ``str``, ``bytes`` and tuples of these. Anything else
raises :class:`NonPortableValueError` rather than risk a wrong partition.
"""

from __future__ import annotations

import os
import sys
from decimal import Decimal
from typing import Any, Final

from .errors import HashSeedError, NonPortableValueError

__all__ = ["portable_hash", "python_hash_seed", "seeded_str_hash"]

_M64: Final = 0xFFFFFFFFFFFFFFFF
_MAXSIZE: Final = sys.maxsize
_PROBE: Final = b"ftlayer.partitioners/probe"
_ROUNDS: Final = {"siphash13": (1, 3), "siphash24": (2, 4)}


def python_hash_seed() -> int:
    """The integer value of ``PYTHONHASHSEED`` (0 … 4294967295), or raise HashSeedError."""
    raw = os.environ.get("PYTHONHASHSEED")
    if raw is None:
        raise HashSeedError(
            "PYTHONHASHSEED is not set: portable_hash needs it, as PySpark's does. Set it to "
            "the value Spark's Python workers use (the driver's PYTHONHASHSEED, or 0 when the "
            "driver had none)"
        )
    try:
        seed = int(raw)
    except ValueError:
        seed = -1
    if not 0 <= seed <= 0xFFFFFFFF:
        raise HashSeedError(f"PYTHONHASHSEED={raw!r} must be an integer in [0, 4294967295]")
    return seed


def _siphash_key(seed: int) -> tuple[int, int]:
    if seed == 0:
        return 0, 0
    buf = bytearray(16)
    x = seed
    for i in range(16):
        x = (x * 214013 + 2531011) & 0xFFFFFFFF
        buf[i] = (x >> 16) & 0xFF
    return int.from_bytes(buf[:8], "little"), int.from_bytes(buf[8:], "little")


def _sip_rounds(v0: int, v1: int, v2: int, v3: int, n: int) -> tuple[int, int, int, int]:
    """``n`` SipRounds of the 64-bit state (the ARX round of the SipHash paper)."""
    for _ in range(n):
        v0 = (v0 + v1) & _M64
        v1 = ((v1 << 13) | (v1 >> 51)) & _M64
        v1 ^= v0
        v0 = ((v0 << 32) | (v0 >> 32)) & _M64
        v2 = (v2 + v3) & _M64
        v3 = ((v3 << 16) | (v3 >> 48)) & _M64
        v3 ^= v2
        v0 = (v0 + v3) & _M64
        v3 = ((v3 << 21) | (v3 >> 43)) & _M64
        v3 ^= v0
        v2 = (v2 + v1) & _M64
        v1 = ((v1 << 17) | (v1 >> 47)) & _M64
        v1 ^= v2
        v2 = ((v2 << 32) | (v2 >> 32)) & _M64
    return v0, v1, v2, v3


def _siphash(k0: int, k1: int, data: bytes, c_rounds: int, d_rounds: int) -> int:
    v0 = k0 ^ 0x736F6D6570736575
    v1 = k1 ^ 0x646F72616E646F6D
    v2 = k0 ^ 0x6C7967656E657261
    v3 = k1 ^ 0x7465646279746573
    n = len(data)
    tail = n & ~7
    words = [int.from_bytes(data[i : i + 8], "little") for i in range(0, tail, 8)]
    words.append(((n & 0xFF) << 56) | int.from_bytes(data[tail:], "little"))
    last = len(words) - 1
    for index, m in enumerate(words):
        v3 ^= m
        v0, v1, v2, v3 = _sip_rounds(v0, v1, v2, v3, c_rounds)
        v0 ^= m
        if index == last:
            v2 ^= 0xFF
            v0, v1, v2, v3 = _sip_rounds(v0, v1, v2, v3, d_rounds)
    return v0 ^ v1 ^ v2 ^ v3


class _SeededHasher:
    """CPython's ``_Py_HashBytes`` for one hash seed."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.key = _siphash_key(seed)
        self.rounds = _ROUNDS.get(sys.hash_info.algorithm)
        self.native = self.rounds is not None and self.hash_bytes(_PROBE) == hash(_PROBE)

    def hash_bytes(self, data: bytes) -> int:
        if not data:
            return 0
        if self.rounds is None:
            raise HashSeedError(
                f"cannot mirror Python's {sys.hash_info.algorithm!r} string hash for "
                f"PYTHONHASHSEED={self.seed}; start this process with that PYTHONHASHSEED"
            )
        h = _siphash(self.key[0], self.key[1], data, *self.rounds)
        if h >> 63:
            h -= 1 << 64
        return -2 if h == -1 else h

    def hash_str(self, text: str) -> int:
        if not text:
            return 0
        widest = max(map(ord, text))
        if widest < 0x100:
            data = text.encode("latin-1")
        elif widest < 0x10000:
            data = text.encode("utf-16-le", "surrogatepass")
        else:
            data = text.encode("utf-32-le", "surrogatepass")
        return self.hash_bytes(data)


_HASHERS: dict[int, _SeededHasher] = {}


def _hasher() -> _SeededHasher:
    seed = python_hash_seed()
    h = _HASHERS.get(seed)
    if h is None:
        h = _HASHERS[seed] = _SeededHasher(seed)
    return h


def seeded_str_hash(value: str | bytes, seed: int) -> int:
    """CPython's ``hash(value)`` in an interpreter started with ``PYTHONHASHSEED=seed``."""
    h = _HASHERS.get(seed)
    if h is None:
        h = _HASHERS[seed] = _SeededHasher(seed)
    if isinstance(value, str):
        return h.hash_str(value)
    return h.hash_bytes(value)


def _portable(x: Any, hasher: _SeededHasher) -> int:
    if x is None:
        return 0
    if isinstance(x, tuple):
        h = 0x345678
        for item in x:
            h ^= _portable(item, hasher)
            h *= 1000003
            h &= _MAXSIZE
        h ^= len(x)
        return -2 if h == -1 else h
    if isinstance(x, (str, bytes)):
        if hasher.native and type(x) in (str, bytes):
            return hash(x)
        if isinstance(x, str):
            return hasher.hash_str(x) if type(x) is str else _refuse(x)
        return hasher.hash_bytes(x) if type(x) is bytes else _refuse(x)
    if isinstance(x, (bool, int)):
        return hash(x)
    if isinstance(x, float):
        if x != x:
            raise NonPortableValueError(
                "NaN has no portable hash (CPython hashes NaN by object identity)"
            )
        return hash(x)
    if isinstance(x, Decimal):
        if not x.is_finite() and x.is_nan():
            raise NonPortableValueError(f"{x!r} has no portable hash")
        return hash(x)
    return _refuse(x)


def _refuse(x: Any) -> int:
    raise NonPortableValueError(
        f"portable_hash does not mirror {type(x).__name__} values such as {x!r}; supported: "
        "None, bool, int, float (not NaN), Decimal (not NaN), str, bytes and tuples of these"
    )


def portable_hash(value: Any) -> int:
    """``pyspark.rdd.portable_hash(value)`` as computed in a Python worker started with
    ``PYTHONHASHSEED`` = ``os.environ["PYTHONHASHSEED"]`` (see the module docstring).

    Raises :class:`HashSeedError` when the variable is missing, and
    :class:`NonPortableValueError` for values whose hash is not reproducible.
    """
    return _portable(value, _hasher())
