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
from ftlayer.ids import IdPool, RecordId, SourceIds, as_ids, new_ids, persisted_ids
from ftlayer.limits import MAX_SOURCE
from ftlayer.pending_work import BornMany, PendingWork
from ftlayer.tally import Tally
from serialization import FrameError, encode_payload
from serialization.stored import STORED_HEADER_SIZE, encode_stored_many

__all__ = ["AbstractFTHandler", "FTHandler", "NonFTHandler"]

_NO_ID = RecordId(0, 0)
_REASONS = ("explicit", "timeout", "dead_letter")


class AbstractFTHandler:
    """The interface shared by FTHandler and NonFTHandler."""

    __slots__ = ()

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
    work: PendingWork


class FTHandler(AbstractFTHandler):
    """The operating handler of one task attempt."""

    __slots__ = ("table", "config", "partition", "_work", "_anchor", "_ids", "_sources",
                 "_reset", "_unsent")  # fmt: skip

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
        self._work = PendingWork()
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
        self._work.born[src] = (bytes(payload), hash_code, source, partition)
        self._work.xors[src] = cur
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
        self._work.born_many.append(BornMany(src, cur, headers, payloads))
        self._work.xor_arrays.append((src, cur))
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
        work = self._work
        work.born[src] = (bytes(raw), hash_code, source, partition)
        work.fail(src, "explicit", error)
        work.rejected.add(src)
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
        xors = self._work.xors
        xors[src] = xors.get(src, 0) ^ cur
        return RecordId(src, cur)

    def ack(self, record_id: RecordId) -> None:
        """This task is done with ``record_id`` (after emitting its children)."""
        src, xors = record_id[0], self._work.xors
        xors[src] = xors.get(src, 0) ^ record_id[1]

    # -- many at once: the same events for whole numpy arrays, no Python per record ------
    def emit_many(self, src: Any) -> np.ndarray:
        """``emit`` for each source id of ``src`` (an int64 or uint64 array, one entry per
        child): the children's fresh current ids, aligned with ``src``. Folded with numpy
        at flush, like every XOR of this handler."""
        s = as_ids(src)
        cur = new_ids(len(s))
        self._work.xor_arrays.append((s, cur))
        return cur

    def ack_many(self, src: Any, cur: Any) -> None:
        """``ack`` for each RecordId given as two aligned arrays (source ids, current ids)."""
        s, c = as_ids(src), as_ids(cur)
        if s.shape != c.shape:
            raise FTLayerError(f"ack_many: {len(s)} source ids for {len(c)} current ids")
        self._work.xor_arrays.append((s, c))

    def fail_many(self, src: Any, error: str = "", reason: str = "explicit") -> None:
        """``fail`` for each source id of ``src`` (failures are rare: one dict entry each)."""
        if reason not in _REASONS:
            raise FTLayerError(f"reason must be one of {_REASONS}, not {reason!r}")
        work = self._work
        for s in as_ids(src).tolist():
            work.fail(s, reason, error)

    def fail(self, record_id: RecordId, error: str = "", reason: str = "explicit") -> None:
        """Fail the source record of ``record_id``: at flush it is retired and replayed
        under a new source id (or dead-lettered). The first failure of a source id in a
        flush wins; its XORs from this task are dropped, later ones become orphans."""
        if reason not in _REASONS:
            raise FTLayerError(f"reason must be one of {_REASONS}, not {reason!r}")
        self._work.fail(record_id[0], reason, error)

    def reset_timeout(self, record_id: RecordId) -> bool:
        if self._reset is None:
            raise FTLayerError("this handler was built without a timeout layer")
        src = record_id[0]
        if self._work.holds_born(src) or (self._unsent and self._unsent.work.holds_born(src)):
            return True  # not (known to be) in Redis yet: its timeout starts at flush
        return self._reset([src]) == 1

    def pending_batches(self) -> dict[int, ShardBatch]:
        """What the next flush would send for the work buffered since the last one (one
        ShardBatch per shard), without sending or forgetting it."""
        return self._work.batches(self.config)

    def pending_deltas(self) -> dict[int, int]:
        """Each source id's folded delta in the work buffered since the last flush."""
        srcs, vals = self._work.folded()
        return dict(zip(srcs.tolist(), vals.tolist(), strict=True))

    @property
    def pending_sources(self) -> int:
        """Source ids with unflushed work in this handler."""
        ids = self._work.source_ids()
        if self._unsent is not None:
            ids |= self._unsent.work.source_ids()
        return len(ids)

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
        batches = self.pending_batches()  # raises with the work kept
        work, self._work = self._work, PendingWork()
        if batches:
            self._unsent = _Unsent(os.urandom(12).hex(), batches, work)
            result.merge(self.table.apply(batches, token=self._unsent.token))
            self._unsent = None
        return result
