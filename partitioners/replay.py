"""Replay partitioners: where a replayed record must go, from what was stored with it.

With every persisted record the source stores ``hash_code`` — Spark SQL's Murmur3
``hash(key cols)`` (signed int32, seed 42) computed in the JVM — and ``original_partition``,
the partition the record was first placed in. :meth:`ReplayPartitioner.select` maps those two
numbers to the target partition(s) without touching the payload:

============== ================================================================================
strategy       ``select(hash_code, original_partition)``
============== ================================================================================
hash           ``(pmod(hash_code, n),)`` – exactly ``repartition(n, cols)``'s choice
portable_hash  ``(original_partition,)`` – the stored Murmur3 code says nothing about Python's
               64-bit ``portable_hash``, and even that hash truncated to 32 bits would not
               determine ``h % n``; ``partitionBy`` placement is a pure function of key, ``n``
               and the workers' ``PYTHONHASHSEED``, so with those unchanged the original
               partition *is* the target
range          ``(original_partition,)`` – range bounds are sampled from the data at run time
               and a hash carries no order, so only the original placement is known
forward        ``(original_partition,)`` – narrow dependency: a record stays in its partition
broadcast      every partition
round_robin    the next partition in turn (see :class:`RoundRobinPartitioner`)
============== ================================================================================

``partition(key)`` (hash, portable_hash, range) computes the placement from the key itself.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from .errors import (
    InvalidPartitionError,
    TypeMismatchError,
    UnsupportedStrategyError,
    ValueOutOfRangeError,
)
from .murmur3 import inferred_hasher, resolve_hashers
from .portable import portable_hash

__all__ = [
    "BroadcastPartitioner",
    "ForwardPartitioner",
    "HashPartitioner",
    "PortableHashPartitioner",
    "RangePartitioner",
    "ReplayPartitioner",
    "RoundRobinPartitioner",
    "STRATEGIES",
    "replay_partitioner",
]

_M: int = 0xFFFFFFFF
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _check_count(num_partitions: Any) -> int:
    if type(num_partitions) is not int or num_partitions < 1:
        raise InvalidPartitionError(
            f"num_partitions must be a positive int, got {num_partitions!r}"
        )
    return num_partitions


class ReplayPartitioner(ABC):
    """Common interface of all replay partitioners.

    Invariant: :meth:`select` returns a non-empty tuple of distinct partitions, each in
    ``[0, num_partitions)``, and depends only on its arguments (and, for round robin, on the
    number of earlier calls).
    """

    strategy: str = ""

    def __init__(self, num_partitions: int) -> None:
        self._n = _check_count(num_partitions)

    @property
    def num_partitions(self) -> int:
        return self._n

    @abstractmethod
    def select(self, hash_code: int, original_partition: int) -> tuple[int, ...]:
        """Target partition(s) of a persisted record, from its stored hash code (Spark's
        signed 32-bit Murmur3 of the key) and its original partition."""

    def _original(self, original_partition: Any) -> tuple[int]:
        if type(original_partition) is not int or not 0 <= original_partition < self._n:
            raise InvalidPartitionError(
                f"original partition {original_partition!r} is outside [0, {self._n})"
            )
        return (original_partition,)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_partitions={self._n})"


class HashPartitioner(ReplayPartitioner):
    """Mirror of ``df.repartition(n, *cols)``: ``pmod(hash(cols), n)`` (``HashPartitioning``).

    ``types`` are the key columns' Spark SQL types; ``None`` infers them per value as
    PySpark's schema inference does. Declared types are resolved once, here.
    """

    strategy = "hash"

    def __init__(self, num_partitions: int, types: Sequence[Any] | None = None) -> None:
        super().__init__(num_partitions)
        if isinstance(types, str):
            types = [types]
        self.types = None if types is None else tuple(types)
        self._hashers = None if types is None else resolve_hashers(types, len(types))
        self._partition: Callable[[Any], int] = self._build()

    def _build(self) -> Callable[[Any], int]:
        n = self._n
        hashers = self._hashers
        if hashers is None:

            def inferred(key: Any) -> int:
                if type(key) is not tuple and not isinstance(key, (tuple, list)):
                    raise TypeMismatchError(f"key must be a tuple, got {type(key).__name__}")
                h = 42
                for v in key:
                    if v is not None:
                        h = inferred_hasher(v)(v, h)
                return (h - 0x100000000 if h & 0x80000000 else h) % n

            return inferred
        width = len(hashers)
        if width == 1:
            only = hashers[0]

            def single(key: Any) -> int:
                if type(key) is not tuple and not isinstance(key, (tuple, list)) or len(key) != 1:
                    raise TypeMismatchError(f"key must be a 1-tuple, got {key!r}")
                v = key[0]
                if v is None:
                    return 42 % n
                h = only(v, 42)
                return (h - 0x100000000 if h & 0x80000000 else h) % n

            return single

        def multi(key: Any) -> int:
            if type(key) is not tuple and not isinstance(key, (tuple, list)) or len(key) != width:
                raise TypeMismatchError(f"key must be a {width}-tuple, got {key!r}")
            h = 42
            for v, hasher in zip(key, hashers, strict=True):
                if v is not None:
                    h = hasher(v, h)
            return (h - 0x100000000 if h & 0x80000000 else h) % n

        return multi

    def partition(self, key: Sequence[Any]) -> int:
        """Partition of ``key`` (a tuple with one value per key column)."""
        return self._partition(key)

    def select(self, hash_code: int, original_partition: int) -> tuple[int, ...]:
        """``(pmod(hash_code, n),)``: ``hash_code`` is Spark's Murmur3 of the key."""
        if type(hash_code) is not int or not _INT32_MIN <= hash_code <= _INT32_MAX:
            raise ValueOutOfRangeError(f"hash code {hash_code!r} is not a signed 32-bit int")
        return (hash_code % self._n,)

    def __repr__(self) -> str:
        return f"HashPartitioner(num_partitions={self._n}, types={self.types!r})"


class PortableHashPartitioner(ReplayPartitioner):
    """Mirror of ``rdd.partitionBy(n)``: ``portable_hash(key) % n`` (Python's modulo).

    ``select`` returns the original partition; see the module table for why.
    """

    strategy = "portable_hash"

    def partition(self, key: Any) -> int:
        """Partition of ``key`` under ``partitionBy``; needs ``PYTHONHASHSEED`` (see
        :func:`partitioners.portable_hash`)."""
        return portable_hash(key) % self._n

    def select(self, hash_code: int, original_partition: int) -> tuple[int, ...]:
        return self._original(original_partition)


class ForwardPartitioner(ReplayPartitioner):
    """Narrow (one-to-one) dependency: a record goes back to the partition it came from."""

    strategy = "forward"

    def select(self, hash_code: int, original_partition: int) -> tuple[int, ...]:
        return self._original(original_partition)


class BroadcastPartitioner(ReplayPartitioner):
    """Every record goes to every partition."""

    strategy = "broadcast"

    def __init__(self, num_partitions: int) -> None:
        super().__init__(num_partitions)
        self._all = tuple(range(self._n))

    def select(self, hash_code: int, original_partition: int) -> tuple[int, ...]:
        return self._all


class RoundRobinPartitioner(ReplayPartitioner):
    """Spreads records evenly: call ``i`` (from 0) selects ``(start + i) % n``.

    This does *not* reproduce Spark's ``repartition(n)`` without columns, and nothing can per
    record: Spark first sorts each input partition locally, then deals rows out starting at a
    position drawn from the input partition's id, so a row's target depends on its rank among
    the rows of its input partition, which a single replayed record does not know. Replay
    only needs an even spread, which this gives. Thread safe (``itertools.count``).
    """

    strategy = "round_robin"

    def __init__(self, num_partitions: int, start: int = 0) -> None:
        super().__init__(num_partitions)
        if type(start) is not int:
            raise InvalidPartitionError(f"start must be an int, got {start!r}")
        self._counter = itertools.count(start)

    def select(self, hash_code: int, original_partition: int) -> tuple[int, ...]:
        return (next(self._counter) % self._n,)


class _Desc:
    """Sort helper: reverses the order of the wrapped column key."""

    __slots__ = ("key",)

    def __init__(self, key: Any) -> None:
        self.key = key

    def __lt__(self, other: _Desc) -> bool:
        result: bool = other.key < self.key
        return result

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and self.key == other.key

    __hash__ = None  # type: ignore[assignment]


class RangePartitioner(ReplayPartitioner):
    """Mirror of ``repartitionByRange(n, cols)`` once its bounds are known.

    ``bounds`` are the (strictly increasing in the sort order) upper bounds of partitions
    ``0 … len(bounds)-1``; a key goes to the first partition whose bound is ≥ it in the sort
    order, i.e. ``len(bounds)`` partitions plus one (Spark's ``RangePartitioner.getPartition``
    with its ``LazilyGeneratedOrdering``). Keys and bounds are scalars or tuples (one value per
    column, all in the same direction). ``nulls_first=None`` means Spark's default: nulls first
    when ascending, last when descending. Doubles order as in Spark: -0.0 == 0.0 and NaN above
    every other value. ``select`` returns the original partition: bounds are sampled at run
    time and a hash carries no order.
    """

    strategy = "range"

    def __init__(
        self,
        bounds: Sequence[Any],
        ascending: bool = True,
        nulls_first: bool | None = None,
    ) -> None:
        super().__init__(len(bounds) + 1)
        self.ascending = bool(ascending)
        self.nulls_first = self.ascending if nulls_first is None else bool(nulls_first)
        self.bounds = tuple(bounds)
        self._keys = [self._sort_key(b) for b in self.bounds]
        try:
            increasing = all(a < b for a, b in itertools.pairwise(self._keys))
        except TypeError:
            increasing = False
        if not increasing:
            raise InvalidPartitionError(
                "range bounds must be comparable and strictly increasing in the sort order"
            )

    def _column(self, v: Any) -> Any:
        null_rank = 0 if self.nulls_first else 2
        if v is None:
            return (null_rank,)
        if isinstance(v, float):
            v = (1, 0.0) if v != v else (0, v + 0.0)
        if not self.ascending:
            v = _Desc(v)
        return (1, v)

    def _sort_key(self, key: Any) -> tuple[Any, ...]:
        cols = key if isinstance(key, tuple) else (key,)
        return tuple(self._column(v) for v in cols)

    def partition(self, key: Any) -> int:
        """Number of bounds strictly before ``key`` in the sort order."""
        k = self._sort_key(key)
        keys = self._keys
        lo, hi = 0, len(keys)
        try:
            if keys and len(k) != len(keys[0]):
                raise TypeError
            while lo < hi:
                mid = (lo + hi) // 2
                if keys[mid] < k:
                    lo = mid + 1
                else:
                    hi = mid
        except TypeError:
            raise InvalidPartitionError(
                f"key {key!r} is not comparable with the range bounds"
            ) from None
        return lo

    def select(self, hash_code: int, original_partition: int) -> tuple[int, ...]:
        return self._original(original_partition)

    def __repr__(self) -> str:
        return (
            f"RangePartitioner(bounds={self.bounds!r}, ascending={self.ascending}, "
            f"nulls_first={self.nulls_first})"
        )


STRATEGIES: tuple[str, ...] = (
    "hash",
    "portable_hash",
    "range",
    "forward",
    "broadcast",
    "round_robin",
)


def replay_partitioner(
    strategy: str,
    num_partitions: int | None = None,
    *,
    types: Sequence[Any] | None = None,
    bounds: Sequence[Any] | None = None,
    ascending: bool = True,
    nulls_first: bool | None = None,
    start: int = 0,
) -> ReplayPartitioner:
    """Build the replay partitioner for ``strategy`` (one of :data:`STRATEGIES`).

    ``range`` takes ``bounds`` (its partition count is ``len(bounds) + 1``; a given
    ``num_partitions`` must agree); every other strategy needs ``num_partitions``.
    """
    name = strategy.strip().lower().replace("-", "_") if isinstance(strategy, str) else None
    if name == "range":
        if bounds is None:
            raise InvalidPartitionError("the range strategy needs bounds")
        rp = RangePartitioner(bounds, ascending=ascending, nulls_first=nulls_first)
        if num_partitions is not None and num_partitions != rp.num_partitions:
            raise InvalidPartitionError(
                f"{len(bounds)} bounds make {rp.num_partitions} partitions, not {num_partitions}"
            )
        return rp
    if name not in STRATEGIES:
        raise UnsupportedStrategyError(
            f"unknown replay strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}"
        )
    if num_partitions is None:
        raise InvalidPartitionError(f"the {name} strategy needs num_partitions")
    if name == "hash":
        return HashPartitioner(num_partitions, types)
    if name == "portable_hash":
        return PortableHashPartitioner(num_partitions)
    if name == "forward":
        return ForwardPartitioner(num_partitions)
    if name == "broadcast":
        return BroadcastPartitioner(num_partitions)
    return RoundRobinPartitioner(num_partitions, start)
