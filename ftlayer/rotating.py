"""RotatingHashMap: the in-process timeout structure of the seed (Storm's RotatingMap).

``buckets`` dicts, newest first. ``put`` writes into the newest; ``rotate`` opens a new
newest bucket and hands every entry of the oldest to the ExpiredFunction. Rotated every
``T/(B-1)``, an entry that is neither removed nor re-put expires between ``T`` and
``T*B/(B-1)`` after its last put. ftlayer's Redis-backed equivalent (ftlayer.timeouts)
keeps the same bound with per-deadline sets, so it survives the process that rotates it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["ExpiredFunction", "RotatingHashMap"]

K = TypeVar("K")
V = TypeVar("V")

ExpiredFunction = Callable[[K, V], None]


class RotatingHashMap(Generic[K, V]):
    """Not thread-safe: guard it with a lock if a rotating thread shares it."""

    __slots__ = ("_buckets", "_expired")

    def __init__(self, buckets: int = 3, expired: ExpiredFunction[K, V] | None = None):
        if buckets < 2:
            raise ValueError(f"RotatingHashMap needs at least 2 buckets, not {buckets}")
        self._buckets: list[dict[K, V]] = [{} for _ in range(buckets)]
        self._expired = expired

    def put(self, key: K, value: V) -> None:
        """Insert or refresh: the entry moves to the newest bucket."""
        self._buckets[0][key] = value
        for bucket in self._buckets[1:]:
            bucket.pop(key, None)

    def get(self, key: K, default: V | None = None) -> V | None:
        for bucket in self._buckets:
            if key in bucket:
                return bucket[key]
        return default

    def remove(self, key: K) -> V | None:
        for bucket in self._buckets:
            if key in bucket:
                return bucket.pop(key)
        return None

    def rotate(self) -> dict[K, V]:
        """Drop the oldest bucket, call the ExpiredFunction on each of its entries, and
        return them."""
        dead = self._buckets.pop()
        self._buckets.insert(0, {})
        if self._expired is not None:
            for key, value in dead.items():
                self._expired(key, value)
        return dead

    def __contains__(self, key: object) -> bool:
        return any(key in bucket for bucket in self._buckets)

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self._buckets)

    def __iter__(self) -> Iterator[K]:
        for bucket in self._buckets:
            yield from bucket
