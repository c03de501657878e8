"""The replay partitioner: where a replayed record must go, from what was stored with it.

``partition_by`` places records as ``df.repartition(n, *cols)`` does, and a replay must land
in the partition where its key lives. With every persisted record the source stores
``hash_code`` -- Spark SQL's Murmur3 ``hash(key cols)`` (signed int32, seed 42) computed in
the JVM -- so :meth:`HashPartitioner.select` maps it to ``pmod(hash_code, n)`` without
touching the payload, and :meth:`HashPartitioner.partition` computes the same from the key
itself (Spark is the oracle in the tests).

Only hash partitioning is mirrored: it is the one placement a replay can reproduce. Range
bounds are sampled from each run's data, and round-robin placement depends on a row's
position in its input partition, so neither says where a replayed row would go.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .errors import InvalidPartitionError, TypeMismatchError, ValueOutOfRangeError
from .murmur3 import inferred_hasher, resolve_hashers

__all__ = ["HashPartitioner"]

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _check_count(num_partitions: Any) -> int:
    if type(num_partitions) is not int or num_partitions < 1:
        raise InvalidPartitionError(
            f"num_partitions must be a positive int, got {num_partitions!r}"
        )
    return num_partitions


class HashPartitioner:
    """Mirror of ``df.repartition(n, *cols)``: ``pmod(hash(cols), n)`` (``HashPartitioning``).

    ``types`` are the key columns' Spark SQL types; ``None`` infers them per value as
    PySpark's schema inference does. Declared types are resolved once, here.
    """

    def __init__(self, num_partitions: int, types: Sequence[Any] | None = None) -> None:
        self._n = _check_count(num_partitions)
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

    @property
    def num_partitions(self) -> int:
        return self._n

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
