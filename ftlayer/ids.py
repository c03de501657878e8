"""RecordId and cheap batches of random 64-bit ids.

Invariants: current ids are uniformly random and non-zero. Source ids (the keys of the
acker table) come in buckets: ids persisted together share all bits but their slot, byte 6
(bits 16..23, ``0 .. BUCKET_SLOTS-1``), so Redis keeps their entries in one string and their
frames in another (docs/storage-layout.md); a bucket's other 55 bits are random, bit 63
clear. A bucket takes records while their frames fit ``bucket_bytes`` of its first one
(ftlayer.limits), and BUCKET_SLOTS at the most. No id repeats
across forked processes (PySpark forks its Python workers from a daemon, so pools and open
buckets are dropped in the child).
"""

from __future__ import annotations

import os
import weakref
from typing import Any, NamedTuple

import numpy as np

from ftlayer.limits import BUCKET_SLOTS, bucket_bytes

__all__ = [
    "LOCAL_BIT",
    "MARKER_PARTITION",
    "IdPool",
    "SourceIds",
    "RecordId",
    "batch_source_ids",
    "bucket_starts",
    "edge_hashes",
    "fold_sum",
    "is_local",
    "local_ids",
    "marker_id",
    "mix64",
    "new_ids",
    "persisted_ids",
    "as_ids",
    "shard_of",
    "shards_of",
    "xor_fold",
    "split_local",
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


# -- ids of the vectorized path, as one numpy column ---------------------------------------
# Bit 63 marks a batch-local id (a fresh row's locator, or a marker row); every id stored in
# Redis has it clear (lua/core/ids.lua's new_source_id, persisted_ids), so the two never meet.
_U = np.uint64
LOCAL_BIT = _U(1 << 63)
_PARTITION_BITS, _ROW_BITS = 23, 40
MARKER_PARTITION = (1 << _PARTITION_BITS) - 1
"""The partition field of marker rows (no source task has this index)."""


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer (Steele, Lea, Flood 2014): a bijection of uint64 whose
    outputs of consecutive inputs look independent and uniform."""
    return _mix64_into(np.array(x, dtype=np.uint64))


def _mix64_into(z: np.ndarray) -> np.ndarray:
    """``mix64`` in place on ``z`` (one array for the whole computation: it runs on every
    row crossing a shuffle)."""
    with np.errstate(over="ignore"):
        z += _U(0x9E3779B97F4A7C15)
        z ^= z >> _U(30)
        z *= _U(0xBF58476D1CE4E5B9)
        z ^= z >> _U(27)
        z *= _U(0x94D049BB133111EB)
        z ^= z >> _U(31)
    return z


def batch_source_ids(partition: int, start: int, n: int) -> np.ndarray:
    """Source ids of the fresh rows ``start .. start+n-1`` of one source task of a
    vectorized batch: bit 63 set, the partition in bits 40..62, the row's index in its
    segment in bits 0..39. Unique within a batch run and the same in every attempt that
    reads its input in the same order; never stored in Redis as ids."""
    if not 0 <= partition < MARKER_PARTITION or start + n > 1 << _ROW_BITS:
        raise ValueError(f"partition {partition} or row {start + n} out of range for ids")
    return local_ids(partition, np.arange(start, start + n, dtype=np.uint64))


def local_ids(partition: int, rows: np.ndarray) -> np.ndarray:
    """The batch-local ids of rows ``rows`` (their indices in the segment) of source
    ``partition`` (see batch_source_ids)."""
    return np.asarray(rows, np.uint64) | _U((partition << _ROW_BITS) | (1 << 63))


def marker_id(token: int) -> int:
    """The id a marker row carries: a batch-local id whose partition field is
    MARKER_PARTITION and whose low 40 bits are the task attempt's token."""
    return int(LOCAL_BIT) | (MARKER_PARTITION << _ROW_BITS) | (token & ((1 << _ROW_BITS) - 1))


def split_local(src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(partition, low 40 bits) of batch-local ids: (source partition, row index) of a
    fresh row, (MARKER_PARTITION, token) of a marker."""
    part = ((src >> _U(_ROW_BITS)) & _U(MARKER_PARTITION)).astype(np.int64)
    return part, (src & _U((1 << _ROW_BITS) - 1)).astype(np.int64)


def is_local(src: np.ndarray) -> np.ndarray:
    """Which ids are batch-local (fresh rows, markers), not persisted replay ids."""
    return (src & LOCAL_BIT) != 0


_BUCKET_BITS = 0x7FFF_FFFF_FF00_FFFF  # what names a bucket: all but bit 63 and the slot
_SLOT_SHIFT = 16
_SHARD_BITS = 0xFFFF


def _bucket_bases(k: int, shard: int | None) -> np.ndarray:
    """``k`` random bucket names (bits 0..15 ``shard`` if given), none of them 0."""
    bases = np.frombuffer(os.urandom(8 * k), np.uint64) & _U(_BUCKET_BITS)
    if shard is not None:
        bases = (bases & ~_U(_SHARD_BITS)) | _U(shard)
    zero = bases == 0  # probability 2**-55 a bucket; kept for the invariant
    if zero.any():
        bases[zero] = _bucket_bases(int(zero.sum()), shard)
    return bases


def bucket_starts(sizes: np.ndarray) -> np.ndarray:
    """The index of the first record of each bucket when records whose frames have
    ``sizes`` bytes (int64) take buckets in order as ``SourceIds`` fills them: a bucket
    takes its first record, then each next one while its slots last (BUCKET_SLOTS) and its
    frames stay within ``bucket_bytes`` of its first. One step per bucket, none per record;
    records of one size take equal buckets with no step at all."""
    n = len(sizes)
    if n == 0:
        return np.zeros(0, np.int64)
    first = int(sizes[0])
    if int(sizes.min()) == int(sizes.max()):
        per = min(BUCKET_SLOTS, max(1, bucket_bytes(first) // first)) if first > 0 else 0
        return np.arange(0, n, per or BUCKET_SLOTS, dtype=np.int64)
    ends = np.cumsum(sizes)  # ends[j]: the frames of records 0..j
    starts, i = [], 0
    while i < n:
        starts.append(i)
        first = int(sizes[i])
        fit = int(np.searchsorted(ends, int(ends[i]) - first + bucket_bytes(first), "right"))
        i = max(i + 1, min(fit, i + BUCKET_SLOTS))
    return np.array(starts, np.int64)


def persisted_ids(sizes: Any, shard: int | None = None) -> np.ndarray:
    """New source ids for records whose frames have ``sizes`` bytes, bit 63 clear, in fresh
    buckets filled as ``SourceIds`` fills them (bucket_starts): the ids it would hand out
    one by one, with no Python per record. ``shard``: the low 16 bits of every id (random
    per bucket if None)."""
    sz = np.asarray(sizes, dtype=np.int64)
    starts = bucket_starts(sz)
    bases = _bucket_bases(len(starts), shard)
    which = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(sz))))
    slots = (np.arange(len(sz), dtype=np.int64) - starts[which]).astype(np.uint64)
    return bases[which] | (slots << _U(_SLOT_SHIFT))


def edge_hashes(src: np.ndarray, salt: int) -> np.ndarray:
    """What a row of source ``src`` counts when it crosses the shuffle edge with ``salt``:
    odd, so that no multiple below 2**64 of one value sums to 0 (siblings sharing a source
    id cannot cancel, as they could under XOR)."""
    z = _mix64_into(src ^ _U(salt))  # a new array: ``src`` is left as it is
    z |= _U(1)
    return z


def fold_sum(values: np.ndarray) -> int:
    """Sum of a uint64 array modulo 2**64 (0 for none)."""
    return int(values.sum(dtype=np.uint64)) if len(values) else 0


def xor_fold(src: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Storm's per-task fold, vectorized: the distinct source ids of ``src`` (sorted) and,
    for each, the XOR of its ``values``. Both arrays uint64, aligned."""
    if len(src) == 0:
        return src.astype(_U), values.astype(_U)
    order = np.argsort(src, kind="stable")
    s, v = src[order], values[order]
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
    return s[starts], np.bitwise_xor.reduceat(v, starts)


def as_ids(values: Any) -> np.ndarray:
    """Ids as uint64 (an int64 column's bits as they are: negative ids stay the same ids).
    Anything but an integer array is refused: ``np.array`` of large Python ints silently
    makes float64, which would XOR other ids than the ones meant."""
    arr = np.asarray(values)
    if arr.dtype == np.int64:
        return arr.view(_U)
    if arr.dtype == _U:
        return arr
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize > 8:
        raise TypeError(f"ids must be a uint64 or int64 array, not {arr.dtype} (build it with "
                        "dtype=np.uint64)")  # fmt: skip
    if arr.dtype.kind == "i" and len(arr) and arr.min() < 0:
        raise TypeError(f"ids of dtype {arr.dtype} must not be negative")
    return arr.astype(_U)


def shard_of(source_id: int, shards: int) -> int:
    """The shard of a source id: its low 16 bits modulo the shard count. A replayed
    record's new id keeps those 16 bits (see lua/core/ids.lua), so it stays in its shard.
    The one shard rule (:func:`shards_of` is the same over an array)."""
    return (source_id & _SHARD_BITS) % shards


def shards_of(source_ids: np.ndarray, shards: int) -> np.ndarray:
    """:func:`shard_of` of every id of a uint64 array."""
    return (source_ids & _U(_SHARD_BITS)) % _U(shards)


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


class SourceIds:
    """Hands out source ids one at a time, a bucket after another: ids share a bucket until
    ``close()`` (a handler closes its bucket at each flush, so a bucket's frames are written
    together), BUCKET_SLOTS of them at the most, and while their frames fit ``bucket_bytes``
    of the bucket's first (so its frames string fills a size class of the server's
    allocator: ftlayer.limits). A bucket's 55 bits are random: two live buckets share them
    with probability (live buckets) / 2**55."""

    __slots__ = ("_base", "_slot", "_bytes", "_cap", "_low", "__weakref__")
    _open: weakref.WeakSet[SourceIds] = weakref.WeakSet()

    def __init__(self, low: int | None = None) -> None:
        """``low``: the low 16 bits of every id (a shard); random per bucket if None."""
        self._base = 0
        self._slot = BUCKET_SLOTS
        self._bytes = 0
        self._cap = 0
        self._low = low
        SourceIds._open.add(self)

    def next(self, size: int = 0) -> int:
        """The next id, for a record whose frame has ``size`` bytes."""
        if self._slot >= BUCKET_SLOTS or (self._slot and self._bytes + size > self._cap):
            base = 0
            while base == 0:
                base = int.from_bytes(os.urandom(8), "big") & _BUCKET_BITS
                if self._low is not None:
                    base = (base & ~0xFFFF) | self._low
            self._base, self._slot, self._bytes = base, 0, 0
            self._cap = bucket_bytes(size)
        sid = self._base | (self._slot << _SLOT_SHIFT)
        self._slot += 1
        self._bytes += size
        return sid

    def close(self) -> None:
        """The next id opens a new bucket."""
        self._slot = BUCKET_SLOTS

    @classmethod
    def _close_all(cls) -> None:
        for ids in cls._open:
            ids.close()


def _after_fork() -> None:
    IdPool._forget_all()
    SourceIds._close_all()


os.register_at_fork(after_in_child=_after_fork)
