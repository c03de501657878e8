"""The acker sidecar (``ftlayer serve``): owns the clock of one namespace.

It rotates the timeout buckets every T/(B-1) -- failing what expired and collecting
orphans -- while it holds the namespace's lease (its metrics and health are served by
ftlayer.service.http). It keeps no state that matters: everything is in Redis, so it
may be killed at any moment and a restarted (or standby) sidecar carries on. Expiry is
idempotent (see lua/expire.lua), so even two sidecars rotating at once would fail each
record once; the lease only saves the work.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import redis

from ftlayer.backoff import jittered
from ftlayer.history import SAMPLE_S, record_sample
from ftlayer.layer import LATENCY_BOUNDS_MS, FTLayer
from ftlayer.service.metrics import SidecarMetrics
from ftlayer.settings import eviction_policy, eviction_warning

__all__ = ["Sidecar"]

log = logging.getLogger(__name__)


class Sidecar:
    """Run with ``run(stop_event)`` (blocking) or ``start()``/``stop()`` (a thread)."""

    def __init__(
        self,
        layer: FTLayer,
        *,
        lease_s: float = 10.0,
        sidecar_id: str | None = None,
        max_replays: int | None = None,
    ) -> None:
        self.layer = layer
        self.max_replays = max_replays  # None: each record's own budget
        self.lease_s = lease_s
        self.id = sidecar_id or f"{socket.gethostname()}:{os.getpid()}"
        self.metrics = SidecarMetrics(layer, self.id)
        self.leader = False
        self.last_ok = 0.0  # monotonic time of the last loop pass that reached Redis
        self.last_pass = time.monotonic()  # ... of the last loop pass, whatever Redis did
        self.last_error = ""
        self.eviction_policy: str | None = layer.eviction_policy  # re-read every POLICY_S
        self._policy_read = time.monotonic()
        self.sample_s = SAMPLE_S
        self._sampled = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- health ---------------------------------------------------------------------------
    LIVENESS_S = 120.0
    """The loop is dead when a pass is older than this (a Redis call may block for its
    socket timeout, 30 s in ``ftlayer serve``, and back off 5 s after)."""

    POLICY_S = 10.0
    """How often the loop re-reads Redis' ``maxmemory-policy`` (an operator may change it)."""

    def warnings(self) -> list[str]:
        """What an operator must fix though the sidecar works: an evicting Redis."""
        warning = eviction_warning(self.eviction_policy)
        return [warning] if warning else []

    def alive(self) -> tuple[bool, str]:
        """Liveness: the loop ran a pass (reaching Redis or not) within LIVENESS_S."""
        age = time.monotonic() - self.last_pass
        if age < self.LIVENESS_S:
            return True, f"alive id={self.id}\n"
        return False, f"dead: no loop pass for {age:.0f}s id={self.id}\n"

    def ready(self) -> tuple[bool, str]:
        """Readiness: the loop reached Redis within the last few ticks; says whether this
        sidecar holds the lease."""
        age = time.monotonic() - self.last_ok
        if self.last_ok and age < 3 * self._tick_s() + 1:
            role = "leader" if self.leader else "standby"
            warned = "".join(f"warning: {w}\n" for w in self.warnings())
            return True, f"ready {role} id={self.id}\n{warned}"
        return False, f"not ready: redis not reached for {age:.1f}s {self.last_error}\n"

    def _tick_s(self) -> float:
        return min(self.layer.config.rotation_interval_s, self.lease_s / 3)

    # -- the loop --------------------------------------------------------------------------
    def _hold_lease(self) -> bool:
        keys = [self.layer.keyspace.lease]
        held = bool(
            self.layer.scripts.lease_acquire(keys=keys, args=[self.id, int(self.lease_s * 1000)])
        )
        if held != self.leader:
            log.info(
                "lease %s sidecar=%s namespace=%s",
                "taken" if held else "lost",
                self.id,
                self.layer.config.namespace,
            )
        self.leader = held
        self.metrics.lease.set(1 if held else 0)
        return held

    def _rotate(self) -> None:
        t0 = time.perf_counter()
        res = self.layer.expire_due(self.max_replays)
        took = time.perf_counter() - t0
        self.metrics.rotations.inc()
        self.metrics.rotation_seconds.observe(took)
        self.metrics.expired.inc(res.processed)
        if res.processed:
            log.info(
                "rotation expired=%d timed_out=%d orphans=%d took_ms=%.1f",
                res.processed,
                res.timed_out,
                res.orphans,
                took * 1000,
            )

    def _sample(self) -> None:
        """The leader's sample of the counters for the status page's charts."""
        st = self.layer.stats()
        latency = [st.latency_buckets[str(b)] for b in LATENCY_BOUNDS_MS] + [st.latency_count]
        record_sample(self.layer.client, self.layer.keyspace, completed=st.completed,
                      failed=st.failed_explicit + st.failed_timeout, pending=st.pending,
                      latency=latency)  # fmt: skip
        self._sampled = time.monotonic()

    def run(self, stop: threading.Event | None = None) -> None:
        """Loop until ``stop`` (or ``self.stop()``) is set. Redis errors are logged and
        retried with backoff; leadership is re-checked on every pass."""
        stop = stop or self._stop
        cfg = self.layer.config
        interval = cfg.rotation_interval_s
        log.info("sidecar starting id=%s lease_s=%g %s", self.id, self.lease_s, cfg.summary())
        backoff, failures = jittered(0.1), 0
        offset = 0.0
        next_rotation = 0.0
        while not stop.is_set():
            self.last_pass = time.monotonic()
            try:
                if not self.last_ok:
                    sec, usec = self.layer.client.time()
                    offset = sec + usec / 1e6 - time.time()  # deadlines use Redis's clock
                if time.monotonic() - self._policy_read > self.POLICY_S:
                    self.eviction_policy = eviction_policy(self.layer.client)
                    self._policy_read = time.monotonic()
                if self._hold_lease():
                    if time.monotonic() - self._sampled >= self.sample_s:
                        self._sample()
                    now = time.time() + offset
                    if now >= next_rotation:
                        self._rotate()
                        # just after the next multiple of I: every deadline is one
                        next_rotation = (now // interval + 1) * interval + 0.005
                self.last_ok = time.monotonic()
                self.last_error = ""
                failures = 0
                now = time.time() + offset
                wait = (
                    min(self._tick_s(), max(0.0, next_rotation - now))
                    if self.leader
                    else self._tick_s()
                )
                stop.wait(max(wait, 0.001))
            except redis.RedisError as e:
                self.leader = False
                self.metrics.lease.set(0)
                self.last_error = str(e)
                failures += 1
                wait = backoff.compute(failures)
                log.warning("redis unreachable, retrying retry_in_s=%.2f error=%s", wait, e)
                stop.wait(wait)
        self._release()

    def _release(self) -> None:
        if not self.leader:
            return
        try:
            self.layer.scripts.lease_release(keys=[self.layer.keyspace.lease], args=[self.id])
            log.info("lease released sidecar=%s", self.id)
        except redis.RedisError as e:
            log.warning("could not release the lease (it expires by itself) error=%s", e)
        self.leader = False

    def start(self) -> Sidecar:
        self._thread = threading.Thread(target=self.run, name="ftlayer-sidecar", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
