"""The persistence layer: source records kept in Redis until they complete.

Each pending record is stored in its frame's stored form (serialization.stored) in its
bucket's frames,
found through its ack entry (docs/storage-layout.md), with its failure history (if it ever
failed) in ``hist``.
Failed records wait in per-source replay queues until a source task claims them; records
that failed more than ``max_replays`` times sit in the dead-letter hash with their history.
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, cast

import msgpack
import numpy as np
import xxhash

from ftlayer.acker import AckEntry, pack_fails
from ftlayer.dlq_merge import merge_dead_letters
from ftlayer.ids import RecordId, mix64, new_ids, shard_of
from ftlayer.keys import ShardKeys
from ftlayer.limits import STREAM_TOKEN_TTL_MS
from ftlayer.scripts import NamespacePart
from ftlayer.wire import NOFRAME, QUEUE_ENTRY
from serialization import Frame, FrameError
from serialization.stored import STORED_HEADER_SIZE, decode_stored, decode_stored_many

__all__ = ["ClaimedRecord", "DeadLetter", "Failure", "RedisPersistenceLayer"]

log = logging.getLogger(__name__)



_CLAIM_CALL = 2_000
"""Records per claim call: small enough that decoding one call's reply overlaps the next
call, large enough that a call's fixed cost is small beside it (benchmarks/claim.py)."""


def _claimed(
    reply: list[Any], curs: bytes, max_payload: int
) -> tuple[list[ClaimedRecord], list[tuple[RecordId, FrameError]]]:
    """The records of a claim's reply (lua/claim.lua) that decode, and (record id, why)
    of those that do not."""
    if not reply:
        return [], []
    items, blob, vanished = reply[0], reply[1], int(reply[2])
    q = np.frombuffer(items, QUEUE_ENTRY)
    n = len(q)
    cur = np.frombuffer(curs, ">u8")
    if vanished:  # the k-th claimed took the current id of its place among those popped
        cur = cur[np.array(reply[3 + n : 3 + 2 * n], np.int64) - 1]
    srcs, curs_ = q["source_id"].tolist(), cur[:n].tolist()
    frames = decode_stored_many(blob, reply[3 : 3 + n], srcs, curs_, max_payload=max_payload)
    good: list[ClaimedRecord] = []
    bad: list[tuple[RecordId, FrameError]] = []
    new = tuple.__new__  # named tuples built without their __new__'s keyword handling
    for src, c, frame, part, attempts in zip(
        srcs, curs_, frames, q["partition"].tolist(), q["attempts"].tolist(), strict=True
    ):
        rid = new(RecordId, (src, c))
        if type(frame) is Frame:
            good.append(new(ClaimedRecord, (rid, frame, part, attempts)))
        else:
            bad.append((rid, cast(FrameError, frame)))
    return good, bad


def _claimed_count(reply: list[Any], popped: bool = False) -> int:
    """How many records a claim's reply holds (``popped``: how many entries the claim
    popped, those whose records vanished since included, as far as the reply tells)."""
    if not reply:
        return 0
    n = len(reply[0]) // QUEUE_ENTRY.itemsize
    if popped and int(reply[2]):
        return max((int(i) for i in reply[3 + n : 3 + 2 * n]), default=0)
    return n


def stream_ids(token: str, shard: int, n: int) -> np.ndarray:
    """The current ids the replay stream's claim ``token`` gives the records it takes on
    ``shard``: a function of (token, shard, position), so every reader of the claim (a
    task retried, a batch re-run) emits a record under the id its claim inited."""
    seed = int.from_bytes(xxhash.xxh64_digest(f"{token}:{shard}".encode()), "big")
    ids = mix64(np.arange(1, n + 1, dtype=np.uint64) + np.uint64(seed))
    ids[ids == 0] = 1
    return ids


MARKS = ("redrive", "again")
"""History entries that mark a new count of attempts, not an attempt: ``redrive`` (the
dead letter was re-driven) and ``again`` (the record was dead-lettered again, a re-run
batch, and joined its dead letter; its error names the id it came under)."""


@dataclass(frozen=True, slots=True)
class Failure:
    reason: str  # "explicit", "timeout", "held", or one of MARKS
    time_ms: int
    attempt: int
    error: str


class ClaimedRecord(NamedTuple):
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
        attempts since the last mark (one entry may stand for several attempts
        replayed at the source), so the total sums the last number before each mark."""
        h = self.history
        ends = [i for i, f in enumerate(h) if i + 1 == len(h) or h[i + 1].reason in MARKS]
        return sum(h[i].attempt for i in ends if h[i].reason not in MARKS)


def _failures(raw: list[Any]) -> tuple[Failure, ...]:
    def text(v: Any) -> str:
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)

    return tuple(Failure(text(r), int(t), int(a), text(e)) for r, t, a, e in raw)


class RedisPersistenceLayer(NamespacePart):
    def _shard(self, source_id: int) -> Any:
        return self.keyspace[shard_of(source_id, len(self.keyspace))]

    def stored(self, source_id: int) -> bytes | None:
        """The stored form of a pending record (serialization.stored), or ``None`` (three
        reads: its entry, the stored header, the record; for tools and tests)."""
        shard = self._shard(source_id)
        entry = AckEntry.read(self.client, shard, source_id)
        if entry is None or entry.frame_offset == NOFRAME:
            return None
        off, fkey = entry.frame_offset, shard.bucket(source_id)[1]
        head = cast(bytes, self.client.getrange(fkey, off, off + STORED_HEADER_SIZE - 1))
        if len(head) < STORED_HEADER_SIZE:
            return head
        length = STORED_HEADER_SIZE + int.from_bytes(head[:4], "big")
        return cast(bytes, self.client.getrange(fkey, off, off + length - 1))

    def get(self, source_id: int) -> Frame | None:
        """The persisted frame of a pending record (current id 0: a record at rest has
        none of its own), or ``None``."""
        raw = self.stored(source_id)
        if raw is None:
            return None
        return decode_stored(raw, source_id, max_payload=self.config.max_record_bytes)

    def history(self, source_id: int) -> tuple[Failure, ...]:
        raw = self.client.hget(*self._shard(source_id).history(source_id))
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
        """Replays of ``source`` waiting to be claimed (delayed ones included)."""
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.llen(shard.replay(source))
                pipe.zcard(shard.replay_later(source))
            return sum(pipe.execute())

    def delayed(self, source: int) -> tuple[int, float | None]:
        """Replays of ``source`` not to be claimed yet, and the first time (epoch seconds)
        one of them is due (None: none waits)."""
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.zcard(shard.replay_later(source))
                pipe.zrange(shard.replay_later(source), 0, 0, withscores=True)
            got = pipe.execute()
        firsts = [first[0][1] for first in got[1::2] if first]
        return sum(got[0::2]), (min(firsts) / 1000.0 if firsts else None)

    def claim(self, source: int, limit: int) -> list[ClaimedRecord]:
        """Take up to ``limit`` queued replays of ``source``, each with a fresh current id
        that its init already covers, and a fresh timeout (see lua/claim.lua). The queue
        lengths are read first (one round trip), so a shard is asked for no more than it
        holds and the current ids drawn match what can be claimed. A call takes at most
        ``_CLAIM_CALL`` records; with several calls to make, one thread makes them in order
        while this one decodes the replies that came back, so Redis runs one call while the
        client decodes the records of the one before (each call has its own token and
        retries)."""
        queued = self.claimable(source)
        asks: list[tuple[ShardKeys, list[Any]]] = []
        left = limit
        for shard, n in zip(self.keyspace.shards, queued, strict=True):
            want = min(left, n)
            left -= want
            for size in [_CLAIM_CALL] * (want // _CLAIM_CALL) + [want % _CLAIM_CALL]:
                if size:
                    token = os.urandom(12).hex()  # this call's: every retry of it sends it
                    curs = new_ids(size).astype(">u8").tobytes()
                    cfg = self.config
                    asks.append((shard, [source, size, curs, cfg.interval_ms, cfg.buckets, token]))
        if len(asks) < 2:
            return [
                r
                for shard, args in asks
                for r in self._claimed(shard, args[2], self._call(shard, args))
            ]
        with ThreadPoolExecutor(1, thread_name_prefix="ftlayer-claim") as calls:
            replies = [calls.submit(self._call, shard, args) for shard, args in asks]
            return [r for (shard, args), reply in zip(asks, replies, strict=True)
                    for r in self._claimed(shard, args[2], reply.result())]  # fmt: skip

    def claim_stream(self, source: int, token: str, limit: int) -> dict[int, int]:
        """The replay stream's claim (ftlayer.spark.replay_stream): up to ``limit`` queued
        replays of ``source`` taken under ``token`` on each shard, inited with the current
        ids ``stream_ids(token, shard, n)`` and a fresh timeout. Idempotent: a shard whose
        ``token`` claimed already answers the same records again and pops nothing more (a
        driver that crashed before Spark logged the offset claims the same records when it
        asks again). Returns how many each shard holds under ``token`` (shards with none
        left out)."""
        queued = self.claimable(source)
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.exists(shard.claim(token))
            seen = pipe.execute()
        out: dict[int, int] = {}
        left = limit
        for k, (shard, n) in enumerate(zip(self.keyspace.shards, queued, strict=True)):
            want = min(left, int(n))
            if not want and not seen[k]:  # nothing to claim, nothing claimed: no call
                continue
            curs = stream_ids(token, k, want).astype(">u8").tobytes()
            cfg = self.config
            args = [source, want, curs, cfg.interval_ms, cfg.buckets, token,
                    STREAM_TOKEN_TTL_MS, "stream"]  # fmt: skip
            reply = self._call(shard, args)
            got = _claimed_count(reply)
            if got:
                out[k] = got
                left -= got
        return out

    def claimable(self, source: int) -> list[int]:
        """Per shard, the replays of ``source`` a claim could take now: its queue, and its
        delayed replays that are due (by this host's clock; the claim goes by Redis', and
        takes what it finds)."""
        now_ms = int(time.time() * 1000)
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.llen(shard.replay(source))
                pipe.zcount(shard.replay_later(source), "-inf", now_ms)
            got = pipe.execute()
        return [int(a) + int(b) for a, b in zip(got[0::2], got[1::2], strict=True)]

    def read_stream(self, source: int, token: str, shard: int) -> list[ClaimedRecord]:
        """The records ``token`` claimed on ``shard`` that are still pending (those that
        completed or failed since are gone), each with the current id it was inited with;
        records that no longer decode are dead-lettered alone. Pops nothing."""
        return self._read_reply(token, shard, self._call(self.keyspace[shard],
                                                         self._read_args(source, token)))

    def _read_args(self, source: int, token: str) -> list[Any]:
        return [source, 0, b"", self.config.interval_ms, self.config.buckets, token, 0, "read"]

    def _read_reply(self, token: str, shard: int, reply: list[Any]) -> list[ClaimedRecord]:
        """The records of a read of ``token``'s claim on ``shard`` (``read_stream``)."""
        if not reply:
            return []
        curs = stream_ids(token, shard, _claimed_count(reply, popped=True))
        return self._claimed(self.keyspace[shard], curs.astype(">u8").tobytes(), reply)

    def read_open_streams(self, source: int) -> list[ClaimedRecord]:
        """``read_stream`` of every open claim of ``source`` on every shard: the replays
        of the micro-batch being run. Spark commits a batch, which releases its claims,
        before it runs the next one: the open claims are the running batch's (or, after a
        driver crash, the re-run batch's), plus any whose release failed or that an
        earlier query run left, which hold only what no batch settled since (a record
        settled or failed again is gone from its claim)."""
        members = cast(set[bytes], self.client.smembers(self.keyspace.stream_claims(source)))
        reads = [(t, k) for t in sorted(m.decode() for m in members)
                 for k in range(len(self.keyspace.shards))]  # fmt: skip
        calls = [(self.keyspace[k].script_keys, self._read_args(source, t)) for t, k in reads]
        replies = self.retried(lambda: self.each_shard(self.scripts.claim, calls), "claim")
        return [c for (t, k), reply in zip(reads, replies, strict=True)
                for c in self._read_reply(t, k, reply)]  # fmt: skip

    def open_stream(self, source: int, token: str) -> None:
        """Note ``token`` as claimed and not yet committed (``stream_claimed``)."""
        self.client.sadd(self.keyspace.stream_claims(source), token)

    def stream_claimed(self, source: int) -> list[int]:
        """The source ids every open claim of ``source``'s replay stream took (a batch
        running them keeps them alive with them; some may have settled since)."""
        members = cast(set[bytes], self.client.smembers(self.keyspace.stream_claims(source)))
        tokens = [t.decode() for t in members]
        if not tokens:
            return []
        with self.client.pipeline(transaction=False) as pipe:
            for t in tokens:
                for shard in self.keyspace.shards:
                    pipe.get(shard.claim(t))
            entries = b"".join(e for e in pipe.execute() if e)
        return np.frombuffer(entries, QUEUE_ENTRY)["source_id"].tolist()

    def forget_stream(self, source: int, keep: str = "") -> None:
        """Stop keeping the open claims of ``source`` alive, but those whose token starts
        with ``keep`` (a query run's, ``rs:<run>:``)."""
        key = self.keyspace.stream_claims(source)
        members = cast(set[bytes], self.client.smembers(key))
        gone = [m for m in members if not (keep and m.decode().startswith(keep))]
        if gone:
            self.client.srem(key, *gone)

    def release_stream(self, source: int, tokens: list[str]) -> None:
        """Forget what ``tokens`` claimed (Spark committed their batches)."""
        if tokens:
            self.client.delete(*[s.claim(t) for s in self.keyspace.shards for t in tokens])
            self.client.srem(self.keyspace.stream_claims(source), *tokens)

    def _call(self, shard: ShardKeys, args: list[Any]) -> list[Any]:
        return cast(list[Any], self.retried(partial(self.scripts.claim, keys=shard.script_keys,
                                                    args=args), "claim"))  # fmt: skip

    def _claimed(self, shard: ShardKeys, curs: bytes, reply: list[Any]) -> list[ClaimedRecord]:
        """The records of one shard's claim reply; those that no longer decode are
        dead-lettered (budget 0: straight to the dead letters, raw bytes and error kept)."""
        out, undecodable = _claimed(reply, curs, self.config.max_record_bytes)
        bad: list[tuple[int, str, str]] = []
        for rid, error in undecodable:  # dead-lettered alone; the rest delivered
            bad.append((rid.source_id, "explicit", f"undecodable replay frame: {error}"))
            log.error("replay dead-lettered source_id=%016x error=%s", rid.source_id, error)
        if bad:
            self.scripts.fail(keys=shard.script_keys, args=[0, pack_fails(bad)])
        return out

    def dead_letters(self) -> list[DeadLetter]:
        """Every dead letter, oldest first: one per record (those of a record held in two
        shards are joined first, ftlayer.dlq_merge)."""
        merge_dead_letters(self)
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
            frame = decode_stored(frame_bytes, source_id, max_payload=self.config.max_record_bytes)
        except FrameError as e:
            error = str(e)
        return DeadLetter(source_id, frame, _failures(hist), int(when), frame_bytes, error)
