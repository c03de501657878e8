"""RedisAckerTable: source id -> ack value, kept in Redis and changed only by Lua.

A flush carries, per shard, one script call with the whole batch packed into a few byte
strings: records to persist with their init, one combined XOR delta per source id, and
explicit failures. The script applies them atomically (invariant 3), completes entries
whose value returns to 0 after their init (invariants 2 and 4), and counts everything.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import redis
import xxhash
from redis.cluster import RedisCluster

from ftlayer.connection import is_cluster
from ftlayer.errors import FlushError, FTLayerError, RedisUnavailableError
from ftlayer.ids import shard_of
from ftlayer.keys import ShardKeys
from ftlayer.limits import MAX_ERROR_BYTES
from ftlayer.scripts import NamespacePart
from ftlayer.tally import Tally
from ftlayer.wire import (
    ENTRY_BYTES,
    FAIL_HEAD,
    FAIL_PAYLOAD,
    NEW_PAYLOAD,
    NOFRAME,
    PERSIST_HEAD,
    REASON_CODES,
    XOR_BYTES,
)

__all__ = ["AckEntry", "Fail", "RedisAckerTable", "ShardBatch", "pack_fails"]

Fail = tuple[int, str, str] | tuple[int, str, str, bytes | None]
"""A failure a flush carries: (source id, reason, error), and optionally the payload the
record is stored with from now on (None: its own; wire.NEW_PAYLOAD)."""

_ENTRY_HEAD = struct.Struct(">Q")
_ENTRY_TAIL = struct.Struct(">IH")


@dataclass(frozen=True, slots=True)
class AckEntry:
    """One decoded ack entry of a bucket (wire.ENTRY_LUA)."""

    value: int
    deadline_ms: int
    """0: none (a replay waiting in its queue)."""
    inited_ms: int
    frame_offset: int
    """Where its frame starts in the bucket's frames; NOFRAME: none (made by an XOR)."""
    source: int

    @property
    def inited(self) -> bool:
        return self.inited_ms > 0

    @classmethod
    def decode(cls, raw: bytes, at: int = 0) -> AckEntry | None:
        """The entry at byte ``at`` of a bucket's entries, or None (none there)."""
        e = raw[at : at + ENTRY_BYTES]
        if len(e) < ENTRY_BYTES or not any(e):
            return None
        (value,) = _ENTRY_HEAD.unpack_from(e)
        off1, source = _ENTRY_TAIL.unpack_from(e, 20)
        return cls(value, int.from_bytes(e[8:14], "big"), int.from_bytes(e[14:20], "big"),
                   off1 - 1 if off1 else NOFRAME, source)  # fmt: skip

    @classmethod
    def read(cls, client: Any, shard: ShardKeys, source_id: int) -> AckEntry | None:
        """The entry of ``source_id`` in Redis (one GETRANGE), or None."""
        key, _, slot = shard.bucket(source_id)
        at = slot * ENTRY_BYTES
        return cls.decode(cast(bytes, client.getrange(key, at, at + ENTRY_BYTES - 1)))


@dataclass(slots=True)
class ShardBatch:
    """What one flush sends to one shard."""

    persists: list[tuple[int, int, bytes]] = field(default_factory=list)
    """Records born in the task: (delta, source id, stored record) each (lua/flush.lua,
    serialization/stored.py)."""
    persist_blocks: list[tuple[bytes, bytes, np.ndarray]] = field(default_factory=list)
    """Records packed already: their heads (PERSIST_HEAD each), their stored records end
    to end, and each stored record's size in bytes."""
    xor_srcs: np.ndarray | None = None
    xor_deltas: np.ndarray | None = None
    fails: list[Fail] = field(default_factory=list)
    local_completed: int = 0

    def add_persist(self, delta: int, source_id: int, stored: bytes) -> None:
        self.persists.append((delta, source_id, stored))

    def add_persists(self, heads: bytes, records: bytes, sizes: np.ndarray) -> None:
        """Records packed already (see ``persist_blocks``)."""
        self.persist_blocks.append((heads, records, sizes))

    def persist_parts(self, max_bytes: int) -> list[tuple[bytes, bytes]]:
        """The records as (heads, stored records) argument pairs of whole records, each
        pair under ``max_bytes`` together (a record larger than that travels alone)."""
        heads = [PERSIST_HEAD.pack(d, s, len(r)) for d, s, r in self.persists]
        records = [r for _, _, r in self.persists]
        sizes = [np.fromiter(map(len, records), np.int64, len(records))]
        for h, r, sz in self.persist_blocks:
            heads.append(h)
            records.append(r)
            sizes.append(sz.astype(np.int64))
        size = np.concatenate(sizes)
        if not len(size):
            return []
        head, rec = b"".join(heads), b"".join(records)
        ends = np.cumsum(size)
        through = ends + PERSIST_HEAD.size * np.arange(1, len(size) + 1)
        out, i = [], 0
        while i < len(size):
            before = int(through[i - 1]) if i else 0
            j = max(int(np.searchsorted(through, before + max_bytes, "right")), i + 1)
            start = int(ends[i - 1]) if i else 0
            out.append((head[i * PERSIST_HEAD.size : j * PERSIST_HEAD.size],
                        rec[start : int(ends[j - 1])]))  # fmt: skip
            i = j
        return out

    def pack_xors(self) -> bytes:
        if self.xor_srcs is None or not len(self.xor_srcs):
            return b""
        out = np.empty((len(self.xor_srcs), 2), dtype=">u8")
        out[:, 0] = self.xor_srcs
        out[:, 1] = self.xor_deltas
        return out.tobytes()

    def calls(self, max_bytes: int) -> list[tuple[bytes, bytes, bytes, int, bytes]]:
        """The batch as (persists, xors, fails, local_completed, records) script
        arguments, each under ``max_bytes`` (a record larger than that travels alone). A
        record never spans two calls, so each call stays atomic for the records it
        carries; the local completions ride in the first. The failures start in the call
        of the last persists (a call applies its persists before its failures): a record
        born and failed in this task is stored before its failure arrives, so it is
        replayed at once, not found missing (an orphan) and replayed only at its timeout."""
        persists = self.persist_parts(max_bytes)
        packed = self.pack_xors()
        step = max(XOR_BYTES, max_bytes // XOR_BYTES * XOR_BYTES)
        xors = [packed[i : i + step] for i in range(0, len(packed), step)]
        fails = _group(_packed_fails(self.fails), max_bytes)
        first_fail = max(0, len(persists) - 1)
        n = max(1, len(persists), len(xors), first_fail + len(fails))

        def at(parts: list[Any], i: int, empty: Any = b"") -> Any:
            return parts[i] if 0 <= i < len(parts) else empty

        return [(at(persists, i, (b"", b""))[0], at(xors, i), at(fails, i - first_fail),
                 self.local_completed if i == 0 else 0, at(persists, i, (b"", b""))[1])
                for i in range(n)]  # fmt: skip

    @property
    def empty(self) -> bool:
        return not (
            self.persists
            or self.persist_blocks
            or self.fails
            or self.local_completed
            or (self.xor_srcs is not None and len(self.xor_srcs))
        )


def _check_replicated(acked: int) -> None:
    if int(acked) < 1:
        raise FlushError(
            "flush applied on the master but no replica acknowledged it in time "
            "(durability='replicated'): failing the task so Spark re-runs it"
        )


def _packed_fails(fails: Sequence[Fail]) -> list[bytes]:
    out = []
    for src, reason, error, *payload in fails:
        err = error.encode("utf-8", "replace")[:MAX_ERROR_BYTES]
        if payload and payload[0] is not None:  # stored with this payload from now on
            new = payload[0]
            out.append(FAIL_HEAD.pack(src, REASON_CODES[reason] | NEW_PAYLOAD, len(err)) + err
                       + FAIL_PAYLOAD.pack(len(new), xxhash.xxh32_intdigest(new)) + new)
        else:
            out.append(FAIL_HEAD.pack(src, REASON_CODES[reason], len(err)) + err)
    return out


def pack_fails(fails: Sequence[Fail]) -> bytes:
    return b"".join(_packed_fails(fails))


def _group(items: list[bytes], max_bytes: int) -> list[bytes]:
    """Consecutive items joined into parts of at most ``max_bytes`` (an item larger than
    that is a part of its own)."""
    out: list[bytes] = []
    part: list[bytes] = []
    size = 0
    for item in items:
        if part and size + len(item) > max_bytes:
            out.append(b"".join(part))
            part, size = [], 0
        part.append(item)
        size += len(item)
    if part:
        out.append(b"".join(part))
    return out


class RedisAckerTable(NamespacePart):
    """The acker table of one namespace."""

    def apply(self, batches: dict[int, ShardBatch], token: str, hold_until: float = 0.0) -> Tally:
        """Send one script call per non-empty shard (more when its arguments would pass
        ``flush_chunk_bytes``), pipelined in one round trip.

        Retried with backoff on connection errors; every call carries a token so a retry
        of a call that did apply is a no-op (never a double XOR). ``token`` names the work,
        not the call (``<token>:<shard>`` per shard call): the caller owns it and passes
        the same one whenever the same work is sent again after a FlushError (see
        FTHandler.flush); different work needs a different token. Raises FlushError when
        Redis stays unreachable: the caller's task must fail so Spark re-runs it.
        ``hold_until`` (epoch seconds): when fails with reason ``held`` may be claimed.
        """
        cfg = self.config
        calls = []
        for shard, batch in sorted(batches.items()):
            if batch.empty:
                continue
            for i, (persists, xors, fails, local, records) in enumerate(
                batch.calls(cfg.flush_chunk_bytes)
            ):
                call_token = f"{token}:{shard}" + (f":{i}" if i else "")
                args = [call_token, cfg.interval_ms, cfg.buckets, -1, persists, xors, fails, local,
                        records, int(hold_until * 1000)]  # fmt: skip
                calls.append((self.keyspace[shard].script_keys, args))
        result = Tally()
        if not calls:
            return result

        replicated = cfg.durability == "replicated"
        wait_ms = int(cfg.replica_wait_s * 1000)

        def run() -> list[Any]:
            if is_cluster(self.client):
                if replicated:
                    return [self._on_node_with_wait(keys, args, wait_ms) for keys, args in calls]
                # redis-py refuses scripts in cluster pipelines: one call per shard
                return [self.scripts.flush(keys=keys, args=args) for keys, args in calls]

            def fill(pipe: Any) -> None:
                for keys, args in calls:
                    self.scripts.flush(keys=keys, args=args, client=pipe)
                if replicated:  # WAIT counts this connection's writes: same pipeline
                    pipe.execute_command("WAIT", 1, wait_ms)

            replies = self.scripts.execute(fill)
            if replicated:
                _check_replicated(replies.pop())
            return replies

        try:
            replies = self.retried(run, "flush")
        except RedisUnavailableError as e:
            raise FlushError(str(e)) from e
        except redis.RedisError as e:
            if "invalid bulk length" in str(e):
                raise FTLayerError(
                    f"flush refused by Redis: an argument passed the server's "
                    f"proto-max-bulk-len; set flush_chunk_bytes (now {cfg.flush_chunk_bytes}) "
                    f"below it ({e})"
                ) from e
            raise FTLayerError(f"flush script failed: {e}") from e
        for reply in replies:
            result.add_flush(reply)
        return result

    def _on_node_with_wait(self, keys: list[str], args: list[Any], wait_ms: int) -> Any:
        """One shard's flush and a WAIT on one connection to the master of its slot."""
        cluster = cast(RedisCluster, self.client)
        node = cluster.get_node_from_key(keys[0])

        def fill(pipe: Any) -> None:
            self.scripts.flush(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", 1, wait_ms)

        try:
            reply, acked = self.scripts.execute(fill, cluster.get_redis_connection(node))
        except redis.ConnectionError:
            cluster.nodes_manager.initialize()  # the master may have failed over
            raise
        _check_replicated(acked)
        return reply

    def entry(self, source_id: int) -> AckEntry | None:
        """The decoded entry of a source id (``None``: complete, retired or unknown)."""
        shard = self.keyspace[shard_of(source_id, len(self.keyspace))]
        return AckEntry.read(self.client, shard, source_id)

    def size(self) -> int:
        """Entries in the table (pending records, queued replays, orphans not yet
        collected), counted bucket by bucket (a SCAN: for tests and tools)."""
        n = 0
        for shard in self.keyspace.shards:
            keys = list(self.client.scan_iter(match=shard.buckets_pattern, count=1000))
            if keys:
                with self.client.pipeline(transaction=False) as pipe:
                    for key in keys:
                        pipe.get(key)
                    for raw in pipe.execute():
                        n += sum(AckEntry.decode(raw or b"", at) is not None
                                 for at in range(0, len(raw or b""), ENTRY_BYTES))  # fmt: skip
        return n
