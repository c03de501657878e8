"""Task-side fault tolerance: the seed's AbstractFTHandler (anchor, persist, XOR, fail).

One handler per task attempt, used from one thread. Nothing reaches Redis before
``flush()``; a flush sends, per source id, ONE delta = XOR of every current id the task
emitted under it and every one it acked (invariant 3). A record born and completed inside
the task folds to 0 and costs no Redis work at all; a record born here that is still
pending is persisted with its delta as its init in the same call.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np

from ftlayer.acker import RedisAckerTable, ShardBatch
from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord, FTLayerError, RecordError
from ftlayer.ids import (
    IdPool,
    RecordId,
    SourceIds,
    as_ids,
    new_ids,
    persisted_ids,
    shard_of,
    shards_of,
    xor_fold,
)
from ftlayer.limits import MAX_RECORD_BYTES, MAX_SOURCE
from ftlayer.tally import Tally
from ftlayer.wire import PERSIST_DTYPE
from serialization import FrameError, encode_payload
from serialization.stored import (
    STORED_HEADER_SIZE,
    encode_stored,
    encode_stored_many,
)

__all__ = ["AbstractFTHandler", "FTHandler", "NonFTHandler"]

_NO_ID = RecordId(0, 0)
_REASONS = ("explicit", "timeout", "dead_letter")


class AbstractFTHandler:
    """The interface shared by FTHandler and NonFTHandler."""

    def persist(
        self, payload: bytes, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        raise NotImplementedError

    def persist_record(
        self, record: Any, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        """msgpack-encode ``record`` and persist it (PayloadEncodeError if it cannot be)."""
        return self.persist(encode_payload(record), hash_code, source, partition)

    def reject(
        self, raw: bytes, error: str, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        """A source record that cannot enter the pipeline (it does not encode, or it is
        larger than ``max_record_bytes``): the next flush stores ``raw`` (its bytes, or
        a repr of it) and dead-letters it at once with ``error`` (replay budget 0), so it
        shows in ``ftlayer dlq`` to be fixed and re-driven. Never dropped."""
        raise NotImplementedError

    def emit(self, anchor: RecordId | None = None) -> RecordId:
        raise NotImplementedError

    def ack(self, record_id: RecordId) -> None:
        raise NotImplementedError

    def fail(self, record_id: RecordId, error: str = "", reason: str = "explicit") -> None:
        raise NotImplementedError

    def flush(self) -> Tally:
        raise NotImplementedError

    def reset_timeout(self, record_id: RecordId) -> bool:
        """Storm's resetTimeout, for long-running work on ``record_id``: its source record
        gets a fresh deadline now (one Redis call). False if it is no longer pending."""
        raise NotImplementedError

    @contextmanager
    def processing(self, record_id: RecordId) -> Iterator[None]:
        """Anchor ``record_id`` for the block; ack it when the block returns, fail it
        when the block raises FailRecord (suppressed). Any other exception propagates
        with the record neither acked nor failed: the task dies, nothing is flushed, and
        the record times out and is replayed."""
        previous = self._swap_anchor(record_id)
        try:
            yield
        except FailRecord as e:
            self.fail(record_id, str(e) or "FailRecord")
        else:
            self.ack(record_id)
        finally:
            self._swap_anchor(previous)

    def _swap_anchor(self, record_id: RecordId | None) -> RecordId | None:
        raise NotImplementedError


class NonFTHandler(AbstractFTHandler):
    """FT status OFF: the same interface, no ids, no Redis, no cost."""

    __slots__ = ()

    def persist(
        self, payload: bytes, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        return _NO_ID

    def persist_record(
        self, record: Any, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        return _NO_ID

    def reject(
        self, raw: bytes, error: str, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        return _NO_ID

    def emit(self, anchor: RecordId | None = None) -> RecordId:
        return _NO_ID

    def ack(self, record_id: RecordId) -> None:
        pass

    def fail(self, record_id: RecordId, error: str = "", reason: str = "explicit") -> None:
        pass

    def flush(self) -> Tally:
        return Tally()

    def reset_timeout(self, record_id: RecordId) -> bool:
        return True

    def _swap_anchor(self, record_id: RecordId | None) -> RecordId | None:
        return None


class _Unsent(NamedTuple):
    """Work frozen for a flush until Redis confirms it, with the token that names it."""

    token: str
    batches: dict[int, ShardBatch]
    srcs: frozenset[int]
    born_many: tuple[np.ndarray, ...]


class _BornMany(NamedTuple):
    """Records of one ``persist_many`` call: source and current ids, frame headers
    (serialization.many.HEADER_DTYPE) and payloads, aligned."""

    src: np.ndarray
    cur: np.ndarray
    headers: np.ndarray
    payloads: list[bytes]


class FTHandler(AbstractFTHandler):
    """The operating handler of one task attempt."""

    __slots__ = ("table", "config", "partition", "_deltas", "_born", "_failed", "_anchor",
                 "_ids", "_reset", "_unsent", "_rejected", "_xors", "_born_many")  # fmt: skip

    def __init__(
        self,
        table: RedisAckerTable,
        config: FTConfig,
        partition: int = -1,
        reset: Callable[[list[int]], int] | None = None,
    ) -> None:
        self.table = table
        self._reset = reset
        self.config = config
        self.partition = partition
        self._deltas: dict[int, int] = {}
        self._xors: list[tuple[np.ndarray, np.ndarray]] = []  # emit_many / ack_many events
        self._born: dict[int, tuple[bytes, int, int, int]] = {}
        self._born_many: list[_BornMany] = []
        self._failed: dict[int, tuple[str, str]] = {}
        self._rejected: set[int] = set()  # born here to be dead-lettered (budget 0)
        self._anchor: RecordId | None = None
        self._ids = IdPool()
        self._sources = SourceIds()
        self._unsent: _Unsent | None = None

    # -- source side (the seed's Persister) ------------------------------------------
    def persist(
        self, payload: bytes, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        """Register a new source record and emit it: returns its RecordId. It is stored
        in Redis at flush unless its whole tree completed inside this task."""
        if partition < 0:
            partition = self.partition
        if not isinstance(payload, bytes | bytearray):
            raise RecordError(
                f"payload must be msgpack bytes, not {type(payload).__name__} "
                f"(source={source}); use persist_record() to encode a Python object"
            )
        if len(payload) > self.config.max_record_bytes:
            raise RecordError(
                f"record of {len(payload)} bytes from source {source} (hash_code={hash_code}, "
                f"partition={partition}) exceeds max_record_bytes={self.config.max_record_bytes}"
            )
        if not 0 <= source <= MAX_SOURCE:
            raise RecordError(f"source index {source} is outside 0..{MAX_SOURCE}")
        if not -(2**31) <= hash_code < 2**31:
            raise RecordError(f"hash_code {hash_code} of a source {source} record is not int32")
        src = self._sources.next(STORED_HEADER_SIZE + len(payload))
        cur = self._ids.next()
        self._born[src] = (bytes(payload), hash_code, source, partition)
        self._deltas[src] = cur
        return RecordId(src, cur)

    def persist_many(
        self, payloads: Any, hash_codes: Any = 0, source: int = 0, partitions: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``persist`` for many records with no Python call per record but the payload's
        checksum: ``payloads`` a sequence of msgpack bytes, ``hash_codes`` and
        ``partitions`` int32 arrays aligned with it or one value for all (default
        partition: the handler's). Returns the records' (source ids, current ids) as uint64
        arrays, for ``emit_many`` / ``ack_many``. The records take buckets of their own and
        are stored at flush exactly as ``persist`` would store them. A bad record raises
        RecordError naming its index before any of them is registered."""
        if not isinstance(payloads, list):
            payloads = list(payloads)
        n = len(payloads)
        if not set(map(type, payloads)) <= {bytes}:
            i, p = next((i, p) for i, p in enumerate(payloads) if type(p) is not bytes)
            if not isinstance(p, bytearray):
                raise RecordError(
                    f"payload {i} must be msgpack bytes, not {type(p).__name__} "
                    f"(source={source}); encode records with encode_payload()"
                )
            payloads = [bytes(p) for p in payloads]
        if not 0 <= source <= MAX_SOURCE:
            raise RecordError(f"source index {source} is outside 0..{MAX_SOURCE}")
        try:
            headers = encode_stored_many(
                payloads, hash_codes, source,
                partitions=self.partition if partitions is None else partitions,
                max_replays=self.config.max_replays, max_payload=self.config.max_record_bytes,
            )  # fmt: skip
        except FrameError as e:
            raise RecordError(f"persist_many: {e} (max_record_bytes)") from e
        src = persisted_ids(headers["payload_len"].astype(np.int64) + STORED_HEADER_SIZE)
        headers["lineage"] = src.view(np.int64)  # a record's lineage id: its first source id
        cur = new_ids(n)
        self._born_many.append(_BornMany(src, cur, headers, payloads))
        self._xors.append((src, cur))
        return src, cur

    def reject(
        self, raw: bytes, error: str, hash_code: int = 0, source: int = 0, partition: int = -1
    ) -> RecordId:
        if partition < 0:
            partition = self.partition
        if not 0 <= source <= MAX_SOURCE:
            raise RecordError(f"source index {source} is outside 0..{MAX_SOURCE}")
        cap = self.config.flush_chunk_bytes // 2  # one flush call must still carry it
        if len(raw) > cap:
            error = f"{error} [dead letter keeps the first {cap} of {len(raw)} bytes]"
            raw = raw[:cap]
        if not -(2**31) <= hash_code < 2**31:
            hash_code = 0
        src, cur = self._sources.next(STORED_HEADER_SIZE + len(raw)), self._ids.next()
        self._born[src] = (bytes(raw), hash_code, source, partition)
        self._failed[src] = ("explicit", error)
        self._rejected.add(src)
        return RecordId(src, cur)

    # -- task side ---------------------------------------------------------------------
    def _swap_anchor(self, record_id: RecordId | None) -> RecordId | None:
        previous, self._anchor = self._anchor, record_id
        return previous

    def emit(self, anchor: RecordId | None = None) -> RecordId:
        """A child of ``anchor`` (default: the current anchor): same source id, fresh
        current id, XORed in now (its emit) and again by whoever acks it."""
        parent = anchor or self._anchor
        if parent is None:
            raise FTLayerError(
                "emit() without an anchor: use `with handler.processing(rid)` or pass anchor="
            )
        src = parent[0]
        cur = self._ids.next()
        deltas = self._deltas
        deltas[src] = deltas.get(src, 0) ^ cur
        return RecordId(src, cur)

    def ack(self, record_id: RecordId) -> None:
        """This task is done with ``record_id`` (after emitting its children)."""
        src = record_id[0]
        deltas = self._deltas
        deltas[src] = deltas.get(src, 0) ^ record_id[1]

    # -- many at once: the same events for whole numpy arrays, no Python per record ------
    def emit_many(self, src: Any) -> np.ndarray:
        """``emit`` for each source id of ``src`` (an int64 or uint64 array, one entry per
        child): the children's fresh current ids, aligned with ``src``. Folded with numpy
        at flush, like every XOR of this handler."""
        s = as_ids(src)
        cur = new_ids(len(s))
        self._xors.append((s, cur))
        return cur

    def ack_many(self, src: Any, cur: Any) -> None:
        """``ack`` for each RecordId given as two aligned arrays (source ids, current ids)."""
        s, c = as_ids(src), as_ids(cur)
        if s.shape != c.shape:
            raise FTLayerError(f"ack_many: {len(s)} source ids for {len(c)} current ids")
        self._xors.append((s, c))

    def fail_many(self, src: Any, error: str = "", reason: str = "explicit") -> None:
        """``fail`` for each source id of ``src`` (failures are rare: one dict entry each)."""
        if reason not in _REASONS:
            raise FTLayerError(f"reason must be one of {_REASONS}, not {reason!r}")
        for s in as_ids(src).tolist():
            self._failed.setdefault(s, (reason, error))

    def fail(self, record_id: RecordId, error: str = "", reason: str = "explicit") -> None:
        """Fail the source record of ``record_id``: at flush it is retired and replayed
        under a new source id (or dead-lettered). The first failure of a source id in a
        flush wins; its XORs from this task are dropped, later ones become orphans."""
        if reason not in _REASONS:
            raise FTLayerError(f"reason must be one of {_REASONS}, not {reason!r}")
        self._failed.setdefault(record_id[0], (reason, error))

    def reset_timeout(self, record_id: RecordId) -> bool:
        if self._reset is None:
            raise FTLayerError("this handler was built without a timeout layer")
        src = record_id[0]
        many = [b.src for b in self._born_many]
        many += self._unsent.born_many if self._unsent else ()
        if (src in self._born or (self._unsent and src in self._unsent.srcs)
                or any(np.isin(np.uint64(src), m) for m in many)):  # fmt: skip
            return True  # not (known to be) in Redis yet: its timeout starts at flush
        return self._reset([record_id[0]]) == 1

    @property
    def pending_sources(self) -> int:
        """Source ids with unflushed work in this handler."""
        unsent: set[int] = set(self._unsent.srcs) if self._unsent else set()
        for arr in self._unsent.born_many if self._unsent else ():
            unsent.update(arr.tolist())
        many = {int(s) for s in xor_fold(*self._folded_arrays())[0]} if self._xors else set()
        return len(self._deltas.keys() | self._failed.keys() | unsent | many)

    def _folded_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every XOR event of the numpy APIs, as two concatenated arrays."""
        return (np.concatenate([s for s, _ in self._xors]),
                np.concatenate([c for _, c in self._xors]))  # fmt: skip

    def flush(self) -> Tally:
        """Send everything to Redis; afterwards every record born here is complete or
        persisted with a live timeout (invariant 1). On FlushError the work is kept, so
        the call may be retried; if the task dies instead, Spark re-runs it.

        The idempotency token belongs to the work, not to the call: buffered work is
        frozen with a token drawn when it is first sent and kept until Redis confirms
        it. A retry after a FlushError (Redis applied the call, its reply was lost, or
        ``WAIT`` timed out) sends the same frozen work under the same token, which Redis
        recognises and skips (for ``FLUSH_TOKEN_TTL_MS``, ftlayer.limits); work buffered
        since then is sent after it, under a token of its own."""
        result = Tally()
        self._sources.close()  # a bucket's frames are written by one flush
        if self._unsent is not None:
            result.merge(self.table.apply(self._unsent.batches, token=self._unsent.token))
            self._unsent = None
        batches = self._batches()
        if batches:
            srcs = frozenset(self._deltas.keys() | self._failed.keys() | self._born.keys())
            many = tuple(b.src for b in self._born_many)
            self._unsent = _Unsent(os.urandom(12).hex(), batches, srcs, many)
            self._deltas.clear()
            self._xors.clear()
            self._born.clear()
            self._born_many.clear()
            self._failed.clear()
            self._rejected.clear()
            result.merge(self.table.apply(batches, token=self._unsent.token))
            self._unsent = None
        return result

    def _add_born_many(
        self,
        blk: _BornMany,
        delta: np.ndarray,
        failed_ids: np.ndarray,
        batches: dict[int, ShardBatch],
    ) -> int:
        """Persist ``blk``'s records whose tree did not complete here (delta != 0) or that
        failed (stored, then failed by the same call: delta 0), one packed buffer per
        shard; returns how many completed inside the task."""
        failed = np.isin(blk.src, failed_ids) if len(failed_ids) else np.zeros(len(delta), bool)
        delta = np.where(failed, np.uint64(0), delta)
        keep = failed | (delta != 0)
        shard_ids = shards_of(blk.src, self.config.shards)
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
            b = batches.get(k) or batches.setdefault(k, ShardBatch())
            b.add_persists(head.tobytes(), b"".join(parts), head["stored_len"].astype(np.int64))
        return int(len(keep) - keep.sum())

    def _all_deltas(self) -> tuple[np.ndarray, np.ndarray]:
        """Each source id this handler XORed into, with its folded delta (one entry per
        id, zeros included): the per-record calls' dict and the numpy calls' events."""
        d = self._deltas
        srcs = np.fromiter(d.keys(), dtype=np.uint64, count=len(d))
        vals = np.fromiter(d.values(), dtype=np.uint64, count=len(d))
        if not self._xors:
            return srcs, vals
        many_s, many_v = self._folded_arrays()
        return xor_fold(np.concatenate([srcs, many_s]), np.concatenate([vals, many_v]))

    def _batches(self) -> dict[int, ShardBatch]:
        shards = self.config.shards
        max_payload = self.config.max_record_bytes
        budget = self.config.max_replays
        failed = self._failed
        srcs, vals = self._all_deltas()
        # born and failed records need their delta one by one (few); persist_many's born
        # records are taken out as arrays; the rest stay arrays
        special = np.fromiter(self._born.keys() | failed.keys(), np.uint64)
        one_by_one = np.isin(srcs, special) if len(special) else np.zeros(len(srcs), bool)
        born_many = []
        for blk in self._born_many:  # xor_fold sorted srcs (a block's born XOR is in _xors)
            at = np.searchsorted(srcs, blk.src)
            born_many.append((blk, vals[at]))
            one_by_one[at] = True
        deltas = dict(zip(srcs[one_by_one].tolist(), vals[one_by_one].tolist(), strict=True))
        srcs, vals = srcs[~one_by_one], vals[~one_by_one]
        batches: dict[int, ShardBatch] = {}

        def batch(src: int) -> ShardBatch:
            k = shard_of(src, shards)
            b = batches.get(k)
            if b is None:
                b = batches[k] = ShardBatch()
            return b

        local_done = 0
        rejected = self._rejected
        for src, (payload, hash_code, source, partition) in self._born.items():
            delta = deltas.pop(src, 0)
            if src in failed:
                delta = 0  # stored only, then failed by the same call
            elif delta == 0:
                local_done += 1
                continue
            stored = encode_stored(
                payload,
                hash_code,
                source,
                partition=partition,
                max_replays=0 if src in rejected else budget,
                max_payload=MAX_RECORD_BYTES if src in rejected else max_payload,
                source_id=src,
                lineage=src,  # its lineage id: its first source id (bit 63 is 0)
            )
            batch(src).add_persist(delta, src, stored)
        failed_ids = np.fromiter(failed.keys(), np.uint64, len(failed))
        for blk, delta in born_many:
            local_done += self._add_born_many(blk, delta, failed_ids, batches)
        if local_done:
            batch(0).local_completed = local_done
        for src, (reason, error) in failed.items():
            batch(src).fails.append((src, reason, error))
        if len(srcs):
            keep = vals != 0
            srcs, vals = srcs[keep], vals[keep]
            shard_ids = shards_of(srcs, shards)
            for k in np.unique(shard_ids).tolist():
                sel = shard_ids == k
                b = batches.get(k) or batches.setdefault(k, ShardBatch())
                b.xor_srcs, b.xor_deltas = srcs[sel], vals[sel]
        return batches
