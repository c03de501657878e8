"""RecordId and cheap batches of random 64-bit ids.

Invariant: ids are uniformly random, non-zero, and never repeat across forked processes
(PySpark forks its Python workers from a daemon, so pools are dropped in the child).
"""

from __future__ import annotations

import os
import weakref
from typing import NamedTuple

import numpy as np

__all__ = ["IdPool", "RecordId", "new_ids", "shard_of"]

_POOL = 4096


class RecordId(NamedTuple):
    """(source_record_id, current_record_id): the source record this one derives from,
    and this record itself. Children inherit ``source_id`` and get a fresh ``current_id``."""

    source_id: int
    current_id: int

    def __str__(self) -> str:
        return f"{self.source_id:016x}/{self.current_id:016x}"


def new_ids(n: int) -> np.ndarray:
    """``n`` random non-zero ids as a uint64 array (from os.urandom: fork-safe)."""
    ids = np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()
    zero = ids == 0
    while zero.any():  # probability 2**-64 per id; kept for the invariant
        ids[zero] = np.frombuffer(os.urandom(8 * int(zero.sum())), dtype=np.uint64)
        zero = ids == 0
    return ids


def shard_of(source_id: int, shards: int) -> int:
    """The shard of a source id: its low 16 bits modulo the shard count. A replayed
    record's new id keeps those 16 bits (see lua/_common.lua), so it stays in its shard."""
    return (source_id & 0xFFFF) % shards


class IdPool:
    """Hands out ids one at a time from batches of 4096."""

    __slots__ = ("_ids", "__weakref__")
    _pools: weakref.WeakSet[IdPool] = weakref.WeakSet()

    def __init__(self) -> None:
        self._ids: list[int] = []
        IdPool._pools.add(self)

    def next(self) -> int:
        ids = self._ids
        if not ids:
            ids.extend(new_ids(_POOL).tolist())
        return ids.pop()

    @classmethod
    def _forget_all(cls) -> None:
        for pool in cls._pools:
            pool._ids.clear()


os.register_at_fork(after_in_child=IdPool._forget_all)
