"""FTLayer: the fault-tolerance layer of one namespace, over one Redis.

It ties together the acker table, the persistence layer and the timeout layer, makes task
handlers, fails records, hands replays to sources and reports ``stats()``. All state is in
Redis: any number of FTLayer objects (executors, sidecars, the CLI) may share a namespace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import redis

from ftlayer.acker import RedisAckerTable, pack_fails
from ftlayer.backoff import jittered
from ftlayer.config import FTConfig
from ftlayer.connection import connect
from ftlayer.dlq_merge import merge_dead_letters
from ftlayer.embedded import EmbeddedRedis
from ftlayer.handler import AbstractFTHandler, FTHandler, NonFTHandler
from ftlayer.ids import RecordId, shard_of
from ftlayer.keys import Keyspace
from ftlayer.limits import LATENCY_BOUNDS_MS
from ftlayer.persistence import ClaimedRecord, RedisPersistenceLayer
from ftlayer.scripts import Scripts
from ftlayer.segments import SegmentStore
from ftlayer.settings import check_eviction, check_settings
from ftlayer.tally import Tally
from ftlayer.timeouts import RedisTimeoutLayer, Rotator

__all__ = ["FTLayer", "FTStats", "LATENCY_BOUNDS_MS"]

log = logging.getLogger(__name__)


@dataclass
class FTStats:
    """Counters of a namespace, summed over its shards.

    ``persisted`` counts every source record, including those completed inside their
    task (``completed_local``, never stored). ``failed_*`` count failures by reason;
    ``replayed`` the replays scheduled; ``pending`` the records stored and not yet
    complete or dead-lettered (``queued_replays`` of them wait for a source task).
    """

    persisted: int = 0
    completed: int = 0
    completed_local: int = 0
    failed_explicit: int = 0
    failed_timeout: int = 0
    replayed: int = 0
    replays_claimed: int = 0
    replays_vanished: int = 0
    """Queued replays whose stored record was gone when a source task claimed them (a key
    deleted or evicted behind ftlayer's back: ``maxmemory-policy`` must be ``noeviction``).
    They cannot replay and stay in ``pending``: any non-zero value needs an operator."""
    dead_lettered: int = 0
    """Records moved to the dead letters, each once (invariant 13)."""
    dead_lettered_again: int = 0
    """Records dead-lettered again (a re-run batch) that joined their dead letter."""
    held: int = 0
    """Records a stage's open breaker held (not attempted: what it calls was down): queued
    again, not before the breaker's next probe, no attempt of their budget spent."""
    orphans: int = 0
    pending: int = 0
    queued_replays: int = 0
    redriven: int = 0
    dead_letters: int = 0
    """Dead letters held now (``dead_lettered`` counts every one ever; re-drive and purge
    remove them from here)."""
    unsettled_segments: int = 0
    """Segments of vectorized batches not settled yet: their batch is running, or died
    and the segment waits for its timeout (its rows are not in ``pending`` until then)."""
    oldest_pending_age_s: float | None = None
    """Upper bound on the age of the oldest record with a live timeout, from the earliest
    deadline (exact to within T/(B-1)); None when nothing has a timeout."""
    pending_by_source: dict[int, int] = field(default_factory=dict)
    queued_by_source: dict[int, int] = field(default_factory=dict)
    latency_count: int = 0
    latency_sum_ms: int = 0
    latency_buckets: dict[str, int] = field(default_factory=dict)  # cumulative, "le" -> n

    @property
    def mean_latency_ms(self) -> float | None:
        return self.latency_sum_ms / self.latency_count if self.latency_count else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mean_latency_ms"] = self.mean_latency_ms
        return d


_warned: list[bool] = []


def _warn_volatile() -> None:
    """Once per process: an embedded Redis without a data directory keeps nothing."""
    if not _warned:
        _warned.append(True)
        log.warning(
            "embedded redis runs without persistence: a restart of this process loses every "
            "pending record; set FTConfig(embedded_data_dir=...) or redis_url"
        )


class FTLayer:
    """The FT layer of ``config.namespace`` on ``client``.

    ``FTLayer.open(config)`` connects to ``config.redis_url`` or starts an embedded Redis
    (stopped by ``close()``); ``FTLayer(client, config)`` uses a client you own.
    """

    def __init__(
        self, client: redis.Redis, config: FTConfig | None = None, create: bool = True
    ) -> None:
        """Checks the namespace's stored settings (ftlayer.settings): the first open
        stores them; a later one with other shards, timeout, buckets or frame format is
        refused (ConfigError). ``create=False``: the namespace must exist already.

        A server that may evict keys (``maxmemory-policy`` not ``noeviction``) is refused
        unless ``config.allow_eviction``; ``create=False`` (an operator's look) only warns.
        ``eviction_policy`` keeps what the server said (None: it does not say)."""
        self.config = config or FTConfig()
        self.client = client
        self.eviction_policy: str | None = None
        if self.config.enabled:
            self.eviction_policy = check_eviction(client, self.config, refuse=create)
            check_settings(client, self.config, create)
        self.keyspace = Keyspace(self.config.namespace, self.config.shards)
        self.scripts = Scripts(client, self.config.script_mode)
        self.acker = RedisAckerTable(client, self.keyspace, self.scripts, self.config)
        self.persistence = RedisPersistenceLayer(client, self.keyspace, self.scripts, self.config)
        self.timeouts = RedisTimeoutLayer(client, self.keyspace, self.scripts, self.config)
        self.segments = SegmentStore(client, self.keyspace, self.scripts, self.config)
        self.embedded: EmbeddedRedis | None = None

    def be_patient(self, wait_s: float) -> FTLayer:
        """Make this layer's idempotent writes wait out an unavailable Redis (or a master
        with no replica) up to ``wait_s`` before failing: the driver's layer
        (FTConfig.driver_wait_s), whose failed write no one would run again."""
        for part in (self.acker, self.persistence, self.timeouts, self.segments):
            part.patience_s = wait_s
        return self

    @classmethod
    def open(cls, config: FTConfig | None = None, create: bool = True) -> FTLayer:
        config = config or FTConfig()
        if config.redis_url:
            client = connect(config.redis_url)
            try:
                return cls(client, config, create)
            except Exception:
                client.close()
                raise
        data_dir = config.embedded_data_dir
        embedded = EmbeddedRedis(data_dir=data_dir, appendonly=data_dir is not None).start()
        log.info("no redis_url given: started embedded redis url=%s dir=%s", embedded.url,
                 data_dir or "(temporary, in memory only)")  # fmt: skip
        if data_dir is None:
            _warn_volatile()
        layer = cls(embedded.client(), config)
        layer.embedded = embedded
        return layer

    def close(self) -> None:
        self.client.close()
        if self.embedded is not None:
            self.embedded.stop()
            self.embedded = None

    def __enter__(self) -> FTLayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tasks ---------------------------------------------------------------------------
    def handler(self, partition: int = -1) -> AbstractFTHandler:
        """A handler for one task attempt (NonFTHandler when FT status is OFF)."""
        if not self.config.enabled:
            return NonFTHandler()
        return FTHandler(self.acker, self.config, partition, self.timeouts.reset_timeout)

    def claim_replays(self, source: int, limit: int) -> list[ClaimedRecord]:
        """Replays of ``source`` for a source task to emit (see RedisPersistenceLayer)."""
        return self.persistence.claim(source, limit)

    # -- failing and timeouts ------------------------------------------------------------
    def fail(
        self,
        record_ids: Iterable[RecordId | int],
        error: str = "",
        reason: str = "explicit",
        max_replays: int | None = None,
        hold_until: float = 0.0,
    ) -> tuple[int, int, int]:
        """Fail source records now: each is retired and replayed under a new source id in
        its shard, or dead-lettered past its replay budget (the ``max_replays`` of the
        pipeline that persisted it, unless ``max_replays`` overrides it: 0 dead-letters
        at once, for records no replay can fix). ``reason="held"``: they were not
        attempted (a stage's breaker held them): queued again without spending an attempt,
        not claimed before ``hold_until`` (epoch seconds). Returns (replayed,
        dead_lettered, orphans) where orphans were not pending. Retried on a lost
        connection: a retry finds the records it already failed retired (orphans), so
        nothing is failed twice."""
        by_shard: dict[int, list[tuple[int, str, str]]] = {}
        for rid in record_ids:
            src = rid if isinstance(rid, int) else rid[0]
            by_shard.setdefault(shard_of(src, self.config.shards), []).append((src, reason, error))
        totals = [0, 0, 0]
        for shard, fails in by_shard.items():
            budget = -1 if max_replays is None else max_replays
            keys = self.keyspace[shard].script_keys
            args = [budget, pack_fails(fails), int(hold_until * 1000)]
            reply = self.persistence.retried(
                partial(self.scripts.fail, keys=keys, args=args), "fail"
            )
            totals = [a + int(b) for a, b in zip(totals, reply, strict=True)]
        return totals[0], totals[1], totals[2]

    def expire_due(self, max_replays: int | None = None) -> Tally:
        """One rotation: fail what timed out, collect orphans (see RedisTimeoutLayer),
        settle segments whose batch never settled them (see SegmentStore.expire_due).
        ``max_replays`` overrides the records' own replay budgets."""
        res = self.timeouts.expire_due(max_replays)
        seg = self.segments.expire_due()
        res.segments, res.calls = seg.segments, res.calls + seg.calls + 1
        res.timed_out += seg.replayed + seg.dead_lettered
        merge_dead_letters(self.persistence)  # one dead letter per record, across shards
        return res

    def reset_timeout(self, record_ids: Iterable[RecordId | int]) -> int:
        return self.timeouts.reset_timeout([r if isinstance(r, int) else r[0] for r in record_ids])

    def start_rotator(self) -> Rotator:
        """Rotate in a background thread of this process (the sidecar's job)."""
        return Rotator(self.timeouts, self.expire_due).start()

    # -- backpressure --------------------------------------------------------------------
    def pending_by_source(self) -> dict[int, int]:
        """Pending records per source index (stored, not complete, not dead-lettered)."""
        return self.stats().pending_by_source

    def wait_for_capacity(
        self, source: int, max_pending: int | None = None, timeout_s: float = 30.0
    ) -> bool:
        """Block while ``source`` has more than ``max_pending`` (default: config) records
        in flight, up to ``timeout_s``. True when there is room; False on timeout (logged:
        the caller decides whether to go on).

        In flight = pending minus the replays queued for this source: those wait for the
        claim that only the caller's next batch makes, so counting them would make the
        wait block the very work that frees capacity."""
        limit = max_pending if max_pending is not None else self.config.max_pending
        if limit is None:
            return True
        deadline = time.monotonic() + timeout_s
        backoff, polls, logged = jittered(0.05, cap_s=1.0), 0, False
        while True:
            st = self.stats()
            pending = st.pending_by_source.get(source, 0) - st.queued_by_source.get(source, 0)
            if pending <= limit:
                return True
            if not logged:
                log.info(
                    "backpressure source=%d in_flight=%d max_pending=%d", source, pending, limit
                )
                logged = True
            if time.monotonic() >= deadline:
                log.warning(
                    "backpressure timeout source=%d in_flight=%d max_pending=%d waited_s=%.1f",
                    source,
                    pending,
                    limit,
                    timeout_s,
                )
                return False
            polls += 1
            time.sleep(backoff.compute(polls))

    # -- reporting -----------------------------------------------------------------------
    def stats(self) -> FTStats:
        with self.client.pipeline(transaction=False) as pipe:
            for shard in self.keyspace.shards:
                pipe.hgetall(shard.stats)
                pipe.hlen(shard.dlq)
                pipe.zrange(shard.tmoidx, 0, 0, withscores=True)
                pipe.zcard(shard.segidx)
            replies = pipe.execute()
        st, earliest = _summed(replies)
        if earliest is not None:
            now = self.client.time()  # not pipelined: Redis Cluster pipelines refuse TIME
            sec, usec = next(iter(now.values())) if isinstance(now, dict) else now
            span_ms = self.config.buckets * self.config.interval_ms
            st.oldest_pending_age_s = max(
                0.0, (sec * 1000 + usec / 1000 - earliest + span_ms) / 1000
            )
        st.queued_by_source = {s: self.persistence.queued(s) for s in st.pending_by_source}
        st.queued_replays = sum(st.queued_by_source.values())
        return st

    # -- dead letters ----------------------------------------------------------------------
    def dlq_replay(self, source_ids: Iterable[int] | None = None) -> int:
        """Re-drive dead letters (all of them with ``None``) to their replay queues under
        new ids; attempts count afresh, the history is kept. Returns how many (a retry
        after a lost reply finds them re-driven already and counts 0). Retried on a lost
        connection: a dead letter leaves the hash when it is re-driven, so none twice;
        a record's dead letters held in two shards are joined first (ftlayer.dlq_merge)."""
        merge_dead_letters(self.persistence)
        if source_ids is None:
            calls = [(shard.script_keys, b"") for shard in self.keyspace.shards]
        else:
            by_shard: dict[int, list[bytes]] = {}
            for src in source_ids:
                k = shard_of(src, self.config.shards)
                by_shard.setdefault(k, []).append(src.to_bytes(8, "big"))
            calls = [(self.keyspace[k].script_keys, b"".join(ids)) for k, ids in by_shard.items()]
        return sum(
            int(self.persistence.retried(
                partial(self.scripts.dlq_replay, keys=keys, args=[ids]), "dlq replay"
            ))  # fmt: skip
            for keys, ids in calls
        )

    def dlq_purge(self) -> int:
        """Delete every dead letter (deliberate loss: the CLI asks first). Returns how
        many were deleted; they stay counted in ``dead_lettered``."""
        n = 0
        for shard in self.keyspace.shards:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.hlen(shard.dlq)
                pipe.delete(shard.dlq, shard.dlqlin)
                n += int(pipe.execute()[0])
        if n:
            log.warning("dead letters purged namespace=%s purged=%d", self.config.namespace, n)
        return n

    def clear(self) -> int:
        """Delete every key of this namespace (tests, or a deliberate reset). Returns how
        many keys were deleted."""
        ks = self.keyspace
        n = int(self.client.delete(ks.lease, ks.settings, ks.sources, ks.batches, ks.samples,
                                   ks.unreplayed))  # fmt: skip
        for pattern in (ks.pattern, ks.stream_claims_pattern, ks.breakers_pattern):
            for key in self.client.scan_iter(match=pattern, count=1000):
                n += int(self.client.delete(key))
        return n


def _summed(replies: list[Any]) -> tuple[FTStats, float | None]:
    """The counters of every shard summed into FTStats (``replies``: per shard, its stats
    hash, dead-letter count, earliest timeout and unsettled segments, as FTLayer.stats
    reads them), and the earliest deadline of a live timeout (ms; None: none)."""
    st = FTStats()
    raw: dict[str, int] = {}
    earliest = None
    for i in range(0, len(replies), 4):
        for k, v in replies[i].items():
            name = k.decode()
            raw[name] = raw.get(name, 0) + int(v)
            if name.startswith("pending:"):
                st.pending += int(v)
        st.dead_letters += int(replies[i + 1])
        st.unsettled_segments += int(replies[i + 3])
        if replies[i + 2]:
            d = float(replies[i + 2][0][1])
            earliest = d if earliest is None else min(earliest, d)
    for name, value in raw.items():
        if name.startswith("pending:"):
            st.pending_by_source[int(name.split(":", 1)[1])] = value
        elif hasattr(st, name) and not name.startswith("latency_le_"):
            setattr(st, name, value)
    st.completed += st.completed_local
    running = 0
    for bound in LATENCY_BOUNDS_MS:
        running += raw.get(f"latency_le_{bound}", 0)
        st.latency_buckets[str(bound)] = running
    st.latency_buckets["+Inf"] = st.latency_count
    return st, earliest
