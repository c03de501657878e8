"""RecordId and cheap batches of random 64-bit ids.

Invariant: ids are uniformly random, non-zero, and never repeat across forked processes
(PySpark forks its Python workers from a daemon, so pools are dropped in the child).
"""

from __future__ import annotations

import os
import weakref
from typing import NamedTuple

import numpy as np

__all__ = [
    "IdPool",
    "RecordId",
    "batch_source_ids",
    "child_ids",
    "mix64",
    "new_ids",
    "segment_of",
    "shard_of",
    "xor_fold",
    "is_fresh",
]

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


# -- ids of the vectorized path, as numpy columns -----------------------------------------
_U = np.uint64
_FRESH = _U(1 << 63)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection of uint64 whose
    outputs of consecutive inputs look independent and uniform."""
    with np.errstate(over="ignore"):
        z = x + _U(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U(27))) * _U(0x94D049BB133111EB)
    return z ^ (z >> _U(31))


def batch_source_ids(partition: int, start: int, n: int) -> np.ndarray:
    """Source ids of the fresh rows ``start .. start+n-1`` of one source task of a
    vectorized batch: bit 63 set, the partition in bits 40..62, the row's index in its
    segment in bits 0..39. Unique within a batch run and the same in every attempt of the
    task (Spark's retries and speculative copies agree); never stored in Redis as ids."""
    if not 0 <= partition < 1 << 23 or start + n > 1 << 40:
        raise ValueError(f"partition {partition} or row {start + n} out of range for ids")
    return np.arange(start, start + n, dtype=np.uint64) | _U((partition << 40) | (1 << 63))


def segment_of(src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source partition, row index) of fresh source ids (see :func:`batch_source_ids`)."""
    return ((src >> _U(40)) & _U((1 << 23) - 1)).astype(np.int64), (
        src & _U((1 << 40) - 1)
    ).astype(np.int64)


def is_fresh(src: np.ndarray) -> np.ndarray:
    """Which source ids are batch-local fresh ids (bit 63), not persisted replay ids."""
    return (src & _FRESH) != 0


def child_ids(parent_cur: np.ndarray, stage_salt: int) -> np.ndarray:
    """Current ids of a stage's output rows from their parents' current ids, the row's
    position among the outputs and the stage: deterministic, distinct between siblings."""
    with np.errstate(over="ignore"):
        ordinal = np.arange(len(parent_cur), dtype=np.uint64) * _U(0xD1B54A32D192ED03)
    out = mix64(parent_cur ^ ordinal ^ _U(stage_salt))
    out[out == 0] = 1
    return out


def xor_fold(ids: np.ndarray) -> int:
    """XOR of every id of a uint64 array (0 for none)."""
    return int(np.bitwise_xor.reduce(ids)) if len(ids) else 0


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
