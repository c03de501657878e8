"""The Redis-backed timeout layer (the seed's TimeoutPersistenceLayer).

A record persisted at time t gets the deadline ``(floor(t/I) + B) * I`` with
``I = T/(B-1)``: the end of the bucket B rotations ahead, so it fails between T and
T*B/(B-1) after t -- the bound of Storm's RotatingMap. Deadlines come from the Redis server clock,
so executors with skewed clocks agree. Each shard keeps one set per deadline and an index
of deadlines; ``expire_due`` fails what is due, in chunks, idempotently: any number of
rotators may run, and one killed mid-way leaves nothing half done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

from ftlayer.ids import shard_of
from ftlayer.scripts import NamespacePart
from ftlayer.tally import Tally

__all__ = ["Tally", "RedisTimeoutLayer", "Rotator"]

log = logging.getLogger(__name__)


class RedisTimeoutLayer(NamespacePart):
    def expire_due(self, max_replays: int | None = None) -> Tally:
        """Fail (reason ``timeout``) every record whose deadline has passed; collect
        orphans. Each record is dead-lettered past its own replay budget unless
        ``max_replays`` overrides it. Returns what was done."""
        override = -1 if max_replays is None else max_replays
        res = Tally()
        for shard in self.keyspace.shards:
            more = 1
            while more:
                processed, timed_out, orphans, more = self.scripts.expire(
                    keys=shard.script_keys,
                    args=[self.config.expire_batch, override],
                )
                res.calls += 1
                res.processed += processed
                res.timed_out += timed_out
                res.orphans += orphans
        return res

    def reset_timeout(self, source_ids: list[int]) -> int:
        """Storm's ``resetTimeout``: pending records get a fresh deadline. Returns how
        many were still pending."""
        by_shard: dict[int, list[bytes]] = {}
        for src in source_ids:
            by_shard.setdefault(shard_of(src, len(self.keyspace)), []).append(
                src.to_bytes(8, "big")
            )
        calls = [(self.keyspace[shard].script_keys,
                  [self.config.interval_ms, self.config.buckets, b"".join(ids)])
                 for shard, ids in by_shard.items()]  # fmt: skip
        return sum(int(n) for n in self.each_shard(self.scripts.reset_timeout, calls))


class Rotator:
    """A thread that runs ``expire_due`` at every bucket boundary (every T/(B-1)).

    Deadlines are multiples of I, so waking just after each multiple of I fails records
    within the promised bound; the sidecar runs one of these.
    """

    def __init__(
        self, timeouts: RedisTimeoutLayer, expire: Callable[[], Tally] | None = None
    ) -> None:
        self.timeouts = timeouts
        self._expire = expire or timeouts.expire_due
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rotations = 0
        self.last: Tally | None = None
        self.errors = 0

    def start(self) -> Rotator:
        self._thread = threading.Thread(target=self._run, name="ftlayer-rotator", daemon=True)
        self._thread.start()
        return self

    def _server_offset_s(self) -> float:
        """Redis clock minus ours: deadlines are on the server's clock."""
        try:
            sec, usec = self.timeouts.client.time()
        except redis.RedisError:
            return 0.0
        return sec + usec / 1e6 - time.time()

    def _run(self) -> None:
        interval = self.timeouts.config.rotation_interval_s
        offset = self._server_offset_s()
        while not self._stop.is_set():
            now = time.time() + offset
            wait = interval - (now % interval) + 0.005
            if self._stop.wait(wait):
                return
            try:
                self.last = self._expire()
                self.rotations += 1
            except redis.RedisError as e:
                self.errors += 1
                log.warning("rotation failed error=%s", e)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
