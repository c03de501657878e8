"""The persistence layer: source records kept in Redis until they complete.

Each pending record is stored as its frame (serialization.frame) in its bucket's frames,
found through its ack entry (docs/storage-layout.md), with its failure history (if it ever
failed) in ``hist``.
Failed records wait in per-source replay queues until a source task claims them; records
that failed more than ``max_replays`` times sit in the dead-letter hash with their history.
"""

from __future__ import annotations

import logging
import os
import struct
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import msgpack

from ftlayer.acker import NOFRAME, AckEntry, pack_fails
from ftlayer.ids import RecordId, new_ids, shard_of
from ftlayer.scripts import NamespacePart
from serialization import HEADER_SIZE, Frame, FrameError, decode_frame

__all__ = ["ClaimedRecord", "DeadLetter", "Failure", "RedisPersistenceLayer"]

log = logging.getLogger(__name__)

_QUEUE_TAIL = struct.Struct(">iH")  # a replay queue entry after its id and hash code


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str  # "explicit" or "timeout"
    time_ms: int
    attempt: int
    error: str


@dataclass(frozen=True, slots=True)
class ClaimedRecord:
    """A replayed record handed to a source task: emit it with ``record_id``."""

    record_id: RecordId
    frame: Frame
    original_partition: int
    attempts: int = 0
    """Attempts that failed before this replay (since its last re-drive)."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A dead-lettered record. ``frame`` is None when its bytes no longer decode as a
    frame (corrupt, or larger than ``max_record_bytes``): ``raw`` holds them and
    ``frame_error`` says why."""

    source_id: int
    frame: Frame | None
    history: tuple[Failure, ...]
    time_ms: int
    raw: bytes = b""
    frame_error: str | None = None

    @property
    def attempts(self) -> int:
        """Failed attempts over its whole history: an entry's attempt number counts the
        attempts since the last redrive (one entry may stand for several attempts
        replayed at the source), so the total sums the last number before each redrive."""
        h = self.history
        ends = [i for i, f in enumerate(h) if i + 1 == len(h) or h[i + 1].reason == "redrive"]
        return sum(h[i].attempt for i in ends if h[i].reason != "redrive")


def _failures(raw: list[Any]) -> tuple[Failure, ...]:
    def text(v: Any) -> str:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)

    return tuple(Failure(text(r), int(t), int(a), text(e)) for r, t, a, e in raw)


class RedisPersistenceLayer(NamespacePart):
    def _shard(self, source_id: int) -> Any:
        return self.keyspace[shard_of(source_id, len(self.keyspace))]

    def raw_frame(self, source_id: int) -> bytes | None:
        """The stored bytes of a pending record's frame with its source id, or ``None``
        (three reads: its entry, the frame's header, the frame; for tools and tests)."""
        shard = self._shard(source_id)
        entry = AckEntry.read(self.client, shard, source_id)
        if entry is None or entry.frame_offset == NOFRAME:
            return None
        off, fkey = entry.frame_offset, shard.bucket(source_id)[1]
        head = cast(bytes, self.client.getrange(fkey, off, off + HEADER_SIZE - 1))
        if len(head) < HEADER_SIZE:
            return head
        length = HEADER_SIZE + int.from_bytes(head[4:8], "big")
        raw = cast(bytes, self.client.getrange(fkey, off, off + length - 1))
        return raw[:8] + source_id.to_bytes(8, "big") + raw[16:]  # a replay's copy: its id

    def get(self, source_id: int) -> Frame | None:
        """The persisted frame of a pending record, or ``None``."""
        raw = self.raw_frame(source_id)
        if raw is None:
            return None
        return decode_frame(raw, max_payload=self.config.max_record_bytes)

    def history(self, source_id: int) -> tuple[Failure, ...]:
        raw = self.client.hget(self._shard(source_id).hist, source_id.to_bytes(8, "big"))
        return () if raw is None else _failures(msgpack.unpackb(raw, raw=True))

    def pending(self) -> int:
        """Records persisted and neither complete nor dead-lettered (queued replays
        included): the sum of the shards' ``pending:<source>`` counters."""
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.hgetall(shard.stats)
            counters = pipe.execute()
        return sum(int(v) for c in counters for k, v in c.items() if k.startswith(b"pending:"))

    def queued(self, source: int) -> int:
        """Replays of ``source`` waiting to be claimed."""
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.llen(shard.replay(source))
            return sum(pipe.execute())

    def claim(self, source: int, limit: int) -> list[ClaimedRecord]:
        """Take up to ``limit`` queued replays of ``source``, each with a fresh current id
        that its init already covers, and a fresh timeout (see lua/claim.lua). The queue
        lengths are read first (one round trip), so a shard is asked for no more than it
        holds and the current ids drawn match what can be claimed."""
        cfg = self.config
        out: list[ClaimedRecord] = []
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.llen(shard.replay(source))
            queued = [int(n) for n in pipe.execute()]
        for shard, n in zip(self.keyspace.shards, queued, strict=True):
            want = min(limit - len(out), n)
            if want <= 0:
                continue
            curs = new_ids(want).astype(">u8").tobytes()
            token = os.urandom(12).hex()  # this claim's: every retry of the call sends it
            args = [source, want, curs, cfg.interval_ms, cfg.buckets, token]
            reply = self.retried(partial(self.scripts.claim, keys=shard.script_keys, args=args),
                                 "claim")  # fmt: skip
            bad: list[tuple[int, str, str]] = []
            for i in range(0, len(reply), 3):
                item, k, stored = reply[i], int(reply[i + 1]), reply[i + 2]
                cur = curs[(k - 1) * 8 : k * 8]
                try:
                    frame = decode_frame(stored[:8] + item[:8] + cur + stored[24:],
                                         max_payload=cfg.max_record_bytes)  # fmt: skip
                except FrameError as e:  # dead-lettered alone; the rest are delivered
                    src = int.from_bytes(item[:8], "big")
                    bad.append((src, "explicit", f"undecodable replay frame: {e}"))
                    log.error("replay dead-lettered source_id=%016x error=%s", src, e)
                    continue
                partition, attempts = _QUEUE_TAIL.unpack_from(item, 12)
                rid = RecordId(frame.source_id, frame.current_id)
                out.append(ClaimedRecord(rid, frame, partition, attempts))
            if bad:  # budget 0: straight to the dead letters, raw bytes and error kept
                self.scripts.fail(keys=shard.script_keys, args=[0, pack_fails(bad)])
        return out

    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter, oldest first."""
        out = []
        for shard in self.keyspace.shards:
            for key, raw in self.client.hgetall(shard.dlq).items():
                out.append(
                    self._dead_letter(int.from_bytes(cast(bytes, key), "big"), cast(bytes, raw))
                )
        return sorted(out, key=lambda d: d.time_ms)

    def dead_letter_log(self, shard: int, after: bytes, count: int) -> list[tuple[bytes, int, int]]:
        """Up to ``count`` entries of a shard's dead-letter log after entry id ``after``
        (b"0": from the start): (entry id, source id, source index), oldest first."""
        key = self.keyspace[shard].dlqlog
        out = []
        entries = cast(list[tuple[bytes, dict[bytes, bytes]]],
                       self.client.xrange(key, b"(" + after, "+", count=count))  # fmt: skip
        for entry_id, fields in entries:
            src, source = fields[b"src"], fields[b"source"]
            out.append((entry_id, int.from_bytes(src, "big"), int(source)))
        return out

    def dead_letter(self, source_id: int) -> DeadLetter | None:
        """One dead letter by its source id (one HGET), or ``None``."""
        raw = self.client.hget(self._shard(source_id).dlq, source_id.to_bytes(8, "big"))
        return None if raw is None else self._dead_letter(source_id, cast(bytes, raw))

    def _dead_letter(self, source_id: int, raw: bytes) -> DeadLetter:
        frame_bytes, hist, when = msgpack.unpackb(raw, raw=True)
        frame, error = None, None
        try:
            frame = decode_frame(frame_bytes, max_payload=self.config.max_record_bytes)
        except FrameError as e:
            error = str(e)
        return DeadLetter(source_id, frame, _failures(hist), int(when), frame_bytes, error)
