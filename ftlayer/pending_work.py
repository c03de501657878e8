"""What one handler buffered since its last flush, and how it becomes one flush's calls.

Every call of a handler lands here in one of two forms, chosen for its cost:

* the per-record calls (``persist``, ``emit``, ``ack``, ``fail``, ``reject``) write dicts,
  one dict operation per call;
* the numpy calls (``persist_many``, ``emit_many``, ``ack_many``) append whole arrays, no
  Python per record.

This class is the one place the two forms meet: :meth:`PendingWork.folded`,
:meth:`PendingWork.source_ids`, :meth:`PendingWork.holds_born` and
:meth:`PendingWork.batches` see both. Invariants: an XOR is kept until it is folded, never
dropped; a record born here is either persisted with its folded delta as its init, or
counted as completed inside the task (delta 0 and not failed); a failed record is stored
first if it was born here (delta 0: its tree is retired by the failure).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from ftlayer.acker import ShardBatch
from ftlayer.config import FTConfig
from ftlayer.ids import shard_of, shards_of, xor_fold
from ftlayer.limits import MAX_RECORD_BYTES
from ftlayer.wire import PERSIST_DTYPE
from serialization.stored import STORED_HEADER_SIZE, encode_stored

__all__ = ["BornMany", "PendingWork"]


class BornMany(NamedTuple):
    """Records of one ``persist_many`` call: source and current ids, stored headers
    (serialization.stored.STORED_DTYPE) and payloads, aligned."""

    src: np.ndarray
    cur: np.ndarray
    headers: np.ndarray
    payloads: list[bytes]


class PendingWork:
    """One handler's buffered work (see the module docstring for its two forms)."""

    __slots__ = ("xors", "born", "failed", "rejected", "xor_arrays", "born_many")

    def __init__(self) -> None:
        self.xors: dict[int, int] = {}
        """Per-record XORs: source id -> the XOR of the current ids emitted / acked."""
        self.born: dict[int, tuple[bytes, int, int, int]] = {}
        """Per-record births: source id -> (payload, hash code, source index, partition)."""
        self.failed: dict[int, tuple[str, str]] = {}
        """Source id -> (reason, error) of its first failure in this work."""
        self.rejected: set[int] = set()
        """Born here to be dead-lettered at once (budget 0)."""
        self.xor_arrays: list[tuple[np.ndarray, np.ndarray]] = []
        """The numpy calls' XOR events: (source ids, current ids), aligned."""
        self.born_many: list[BornMany] = []

    def __bool__(self) -> bool:
        return bool(self.xors or self.born or self.failed or self.xor_arrays or self.born_many)

    def fail(self, src: int, reason: str, error: str) -> None:
        self.failed.setdefault(src, (reason, error))

    def folded(self) -> tuple[np.ndarray, np.ndarray]:
        """Each source id XORed into, sorted when any numpy call was made, with its
        folded delta (one entry per id, zeros included), from both forms."""
        d = self.xors
        srcs = np.fromiter(d.keys(), dtype=np.uint64, count=len(d))
        vals = np.fromiter(d.values(), dtype=np.uint64, count=len(d))
        if not self.xor_arrays:
            return srcs, vals
        return xor_fold(
            np.concatenate([srcs, *(s for s, _ in self.xor_arrays)]),
            np.concatenate([vals, *(c for _, c in self.xor_arrays)]),
        )

    def source_ids(self) -> set[int]:
        """Every source id this work touches (XORed, born or failed)."""
        ids = self.xors.keys() | self.failed.keys() | self.born.keys()
        for s, _ in self.xor_arrays:
            ids.update(s.tolist())
        return ids

    def holds_born(self, src: int) -> bool:
        """Whether ``src`` was born in this work (so it is not in Redis yet)."""
        if src in self.born:
            return True
        key = np.uint64(src)
        return any(bool(np.isin(key, b.src)) for b in self.born_many)

    def batches(self, config: FTConfig) -> dict[int, ShardBatch]:
        """This work as one ShardBatch per shard touched."""
        out: dict[int, ShardBatch] = {}
        srcs, vals = self.folded()
        failed = self.failed
        # born and failed records take their delta one by one (few); persist_many's
        # records are taken out as arrays; the rest of the XORs stay arrays
        special = np.fromiter(self.born.keys() | failed.keys(), np.uint64)
        one_by_one = np.isin(srcs, special) if len(special) else np.zeros(len(srcs), bool)
        born_many = []
        for blk in self.born_many:  # folded() sorted srcs (a block's born XOR is in there)
            at = np.searchsorted(srcs, blk.src)
            born_many.append((blk, vals[at]))
            one_by_one[at] = True
        deltas = dict(zip(srcs[one_by_one].tolist(), vals[one_by_one].tolist(), strict=True))
        local_done = self._add_born(deltas, config, out)
        failed_ids = np.fromiter(failed.keys(), np.uint64, len(failed))
        for blk, delta in born_many:
            local_done += _add_born_many(blk, delta, failed_ids, config.shards, out)
        if local_done:
            _batch(out, 0, config.shards).local_completed = local_done
        for src, (reason, error) in failed.items():
            _batch(out, src, config.shards).fails.append((src, reason, error))
        _add_xors(srcs[~one_by_one], vals[~one_by_one], config.shards, out)
        return out

    def _add_born(
        self, deltas: dict[int, int], config: FTConfig, out: dict[int, ShardBatch]
    ) -> int:
        """Persist the per-record births whose tree did not complete here (or that
        failed); returns how many completed inside the task."""
        local_done = 0
        for src, (payload, hash_code, source, partition) in self.born.items():
            delta = deltas.get(src, 0)
            if src in self.failed:
                delta = 0  # stored only, then failed by the same call
            elif delta == 0:
                local_done += 1
                continue
            rejected = src in self.rejected
            stored = encode_stored(
                payload, hash_code, source, partition=partition,
                max_replays=0 if rejected else config.max_replays,
                max_payload=MAX_RECORD_BYTES if rejected else config.max_record_bytes,
                source_id=src,
                lineage=src,  # its lineage id: its first source id (bit 63 is 0)
            )  # fmt: skip
            _batch(out, src, config.shards).add_persist(delta, src, stored)
        return local_done


def _batch(out: dict[int, ShardBatch], src: int, shards: int) -> ShardBatch:
    k = shard_of(src, shards)
    b = out.get(k)
    if b is None:
        b = out[k] = ShardBatch()
    return b


def _add_born_many(
    blk: BornMany,
    delta: np.ndarray,
    failed_ids: np.ndarray,
    shards: int,
    out: dict[int, ShardBatch],
) -> int:
    """Persist ``blk``'s records whose tree did not complete here (delta != 0) or that
    failed (stored, then failed by the same call: delta 0), one packed buffer per shard;
    returns how many completed inside the task."""
    failed = np.isin(blk.src, failed_ids) if len(failed_ids) else np.zeros(len(delta), bool)
    delta = np.where(failed, np.uint64(0), delta)
    keep = failed | (delta != 0)
    shard_ids = shards_of(blk.src, shards)
    for k in np.unique(shard_ids[keep]).tolist():
        rows = np.flatnonzero(keep & (shard_ids == k))
        head = np.empty(len(rows), PERSIST_DTYPE)
        head["delta"] = delta[rows]
        head["source_id"] = blk.src[rows]
        head["stored_len"] = blk.headers["payload_len"][rows] + STORED_HEADER_SIZE
        parts: list[Any] = [None] * (2 * len(rows))
        parts[0::2] = blk.headers[rows].view(f"V{STORED_HEADER_SIZE}").tolist()
        payloads = blk.payloads
        parts[1::2] = payloads if len(rows) == len(payloads) else [payloads[i] for i in rows]
        b = out.get(k) or out.setdefault(k, ShardBatch())
        b.add_persists(head.tobytes(), b"".join(parts), head["stored_len"].astype(np.int64))
    return int(len(keep) - keep.sum())


def _add_xors(srcs: np.ndarray, vals: np.ndarray, shards: int, out: dict[int, ShardBatch]) -> None:
    """The plain XORs (of records born elsewhere), non-zero ones only, as arrays per shard."""
    if not len(srcs):
        return
    keep = vals != 0
    srcs, vals = srcs[keep], vals[keep]
    shard_ids = shards_of(srcs, shards)
    for k in np.unique(shard_ids).tolist():
        sel = shard_ids == k
        b = out.get(k) or out.setdefault(k, ShardBatch())
        b.xor_srcs, b.xor_deltas = srcs[sel], vals[sel]
