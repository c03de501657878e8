"""The faults of benchmarks.cluster_e2e, injected while micro-batches run, and the Redis work
it measures.

``FaultPlan`` follows the demo's progress (micro-batches done, polled twice a second) and,
in its own thread, injects each fault once the stream has done its share of batches: every
fault is a ``kill -9`` of a real process, and its recovery is timed from outside, the way an
operator would see it:

* ``spark_worker``: a worker with its executor and Python workers. Recovered when the
  next micro-batch completes (its tasks ran again on the other worker).
* ``redis_master``: the master holding the namespace's first shard. Its replica is
  promoted (``failover_s``: every live node says ``cluster_state:ok`` and the victim's slots
  have a new master); then, as a supervisor would, the killed node is started again on its
  own directory and rejoins as a replica (``rejoin_s``: its link to the new master is up).
  Until then ``durability="replicated"`` flushes to that shard fail (no replica) and Spark
  retries those tasks; the driver's writes wait (FTConfig.driver_wait_s). Recovered when
  the next micro-batch completes. Its moment (``master_kill_at``): ``batch`` -- right
  after micro-batch ``at`` is seen done, before the next one settles; ``settle`` -- when
  the driver begins settling the next micro-batch (its log line ``batch settling``),
  after ``master_kill_delay_s``: 0 lands the kill inside the settle's Redis writes.
  ``rejoin_delay_s``: how long the supervisor takes to restart it (meanwhile the promoted
  master has no replica: replicated writes to it fail, the driver's wait).
* ``sidecar``: the ``ftlayer serve`` holding the namespace's lease. Recovered when the
  other one says ``leader`` on its ``/readyz``.

``RedisWork`` samples every node's INFO (commandstats, role, run id) once a second and adds
up the command time (``usec``) and calls each node spent as a master: what the deployment
guide's capacity formula predicts. A node's figures between its last sample and a ``kill -9``
are lost (at most a second's worth); a restarted node counts from zero (a new run id).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from ftlayer.demo import DemoProgress
from ftlayer.embedded import EmbeddedCluster, EmbeddedRedis
from ftlayer.service.process import ServeProcess
from ftlayer.spark.standalone import StandaloneCluster

__all__ = ["KINDS", "Fault", "FaultPlan", "RedisWork"]

KINDS = ("spark_worker", "redis_master", "sidecar")


@dataclass
class Fault:
    kind: str
    target: str
    at_s: float  # since the run started
    at_batch: int  # micro-batches done when it was injected
    recovery_s: float | None = None  # None: never recovered
    detail: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class SettleWatch(logging.Handler):
    """Tells a FaultPlan when the driver (this process) begins settling a micro-batch:
    the driver's own INFO line ``batch settling``, read from ftlayer's log."""

    def __init__(self, plan: FaultPlan) -> None:
        super().__init__(logging.INFO)
        self.plan = plan

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("batch settling"):
            self.plan.settling.set()
        if record.getMessage().startswith("driver write waiting"):
            self.plan.driver_waits += 1
        if record.levelno >= logging.WARNING:  # the watched loggers do not propagate
            logging.getLogger().handle(record)

    def attach(self, names: tuple[str, ...]) -> Callable[[], None]:
        """Watch the loggers ``names`` (INFO on, not propagated: their INFO lines stay
        out of the output); returns the function that detaches it."""
        saved = []
        for name in names:
            logger = logging.getLogger(name)
            saved.append((logger, logger.level, logger.propagate))
            logger.setLevel(logging.INFO)
            logger.propagate = False
            logger.addHandler(self)

        def detach() -> None:
            for logger, level, propagate in saved:
                logger.removeHandler(self)
                logger.setLevel(level)
                logger.propagate = propagate

        return detach


def _wait_for(cond: Callable[[], bool], timeout_s: float, poll_s: float = 0.1) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with contextlib.suppress(redis.RedisError, OSError):
            if cond():
                return True
        time.sleep(poll_s)
    return False


class FaultPlan:
    """Injects ``kinds`` in order, the k-th once ``at_batches[k]`` micro-batches are done."""

    def __init__(
        self,
        started: float,
        spark: StandaloneCluster,
        redis_cluster: EmbeddedCluster,
        sidecars: list[ServeProcess],
        first_shard_key: str,
        kinds: tuple[str, ...],
        at_batches: list[int],
        recovery_timeout_s: float = 120.0,
        master_kill_at: str = "batch",
        master_kill_delay_s: float = 0.0,
        rejoin_delay_s: float = 0.0,
    ) -> None:
        self.started = started
        self.spark, self.redis, self.sidecars = spark, redis_cluster, sidecars
        self.first_shard_key = first_shard_key
        self.plan = list(zip(kinds, at_batches, strict=True))
        self.recovery_timeout_s = recovery_timeout_s
        self.faults: list[Fault] = []
        self.errors: list[str] = []
        self.batches_done = 0
        self.batch_seen: list[float] = []  # monotonic time each micro-batch was seen done
        self.phase = "streaming"
        self.master_kill_at, self.master_kill_delay_s = master_kill_at, master_kill_delay_s
        self.rejoin_delay_s = rejoin_delay_s
        self.driver_waits = 0
        """The driver's writes that met Redis unavailable and waited (``SettleWatch``)."""
        self.settling = threading.Event()
        """Set by ``SettleWatch`` when the driver begins settling a micro-batch."""
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)

    # -- fed by the demo -------------------------------------------------------------------
    def progress(self, p: DemoProgress) -> None:
        with self._cond:
            now = time.monotonic()
            while self.batches_done < p.micro_batches:
                self.batches_done += 1
                self.batch_seen.append(now)
            self.phase = p.phase
            self._cond.notify_all()

    def start(self) -> FaultPlan:
        self._thread.start()
        return self

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    # -- the plan --------------------------------------------------------------------------
    def _run(self) -> None:
        for kind, at in self.plan:
            with self._cond:
                self._cond.wait_for(functools.partial(self._reached, at))
                batch = self.batches_done
            if self.phase != "streaming":
                self.errors.append(f"{kind}: the stream ended before batch {at}")
            try:
                self.faults.append(getattr(self, f"_kill_{kind}")(batch))
            except Exception as e:  # noqa: BLE001 -- reported, the run goes on to its verdict
                self.errors.append(f"{kind}: {type(e).__name__}: {e}")

    def _reached(self, batches: int) -> bool:
        return self.batches_done >= batches or self.phase != "streaming"

    def _since(self, t: float) -> float:
        return round(time.monotonic() - t, 2)

    def _next_batch_after(self, t: float) -> float | None:
        """Seconds from ``t`` to the first micro-batch seen done after it."""
        with self._cond:
            self._cond.wait_for(
                lambda: any(s > t for s in self.batch_seen) or self.phase != "streaming",
                timeout=self.recovery_timeout_s,
            )
            after = [s for s in self.batch_seen if s > t]
        return round(after[0] - t, 2) if after else None

    def _fault(self, kind: str, target: str, t: float, batch: int) -> Fault:
        f = Fault(kind, target, round(t - self.started, 2), batch)
        if kind == "redis_master":
            f.detail.update(kill_at=self.master_kill_at, delay_s=self.master_kill_delay_s)
        return f

    def _kill_spark_worker(self, batch: int) -> Fault:
        i = len(self.spark.workers) - 1
        host = self.spark.workers[i].host
        t = time.monotonic()
        self.spark.kill_worker(i)
        f = self._fault("spark_worker", f"worker {host}", t, batch)
        if _wait_for(lambda: host not in self.spark.alive_hosts(), 60, 0.25):
            f.detail["master_saw_it_s"] = self._since(t)
        f.recovery_s = self._next_batch_after(t)
        return f

    def _kill_redis_master(self, batch: int) -> Fault:
        if self.master_kill_at == "settle":
            self.settling.clear()
            if not self.settling.wait(self.recovery_timeout_s):
                raise RuntimeError("the driver never began settling a micro-batch")
        if self.master_kill_delay_s:
            time.sleep(self.master_kill_delay_s)
        probe = self._any_live_node().client()
        slot = probe.cluster("keyslot", self.first_shard_key)
        victim = self._node_serving(slot)
        t = time.monotonic()
        victim.stop(kill=True, keep_dir=True)  # kill -9; its nodes.conf stays for the restart
        f = self._fault("redis_master", f"redis 127.0.0.1:{victim.port}", t, batch)
        f.detail["failover_s"] = (
            self._since(t) if _wait_for(lambda: self._failed_over(slot, victim), 60) else None
        )
        if self.rejoin_delay_s:  # a slow supervisor: the new master has no replica meanwhile
            time.sleep(self.rejoin_delay_s)
        victim.start()  # a supervisor restarts it: it rejoins as a replica of the new master
        if _wait_for(lambda: _is_synced_replica(victim), 60):
            f.detail["rejoin_s"] = self._since(t)
        f.recovery_s = self._next_batch_after(t)
        return f

    def _kill_sidecar(self, batch: int) -> Fault:
        leader = next((s for s in self.sidecars if s.lease() == "leader"), None)
        if leader is None:
            raise RuntimeError("no sidecar holds the lease")
        standby = [s for s in self.sidecars if s is not leader]
        t = time.monotonic()
        leader.kill()
        f = self._fault("sidecar", f"ftlayer serve pid {leader.pid}", t, batch)
        if _wait_for(lambda: any(s.lease() == "leader" for s in standby), 60, 0.1):
            f.recovery_s = self._since(t)
        return f

    # -- Redis Cluster views ---------------------------------------------------------------
    def _any_live_node(self) -> EmbeddedRedis:
        return next(n for n in self.redis.nodes if n.running)

    def _node_serving(self, slot: int) -> EmbeddedRedis:
        for start, end, master, *_ in (
            self._any_live_node().client().execute_command("CLUSTER", "SLOTS")
        ):
            if start <= slot <= end:
                port = int(master[1])
                return next(n for n in self.redis.nodes if n.port == port)
        raise RuntimeError(f"no master serves slot {slot}")

    def _failed_over(self, slot: int, victim: EmbeddedRedis) -> bool:
        live = [n for n in self.redis.nodes if n.running]
        if any(n.client().cluster("info").get("cluster_state") != "ok" for n in live):
            return False
        return self._node_serving(slot) is not victim


def _is_synced_replica(node: EmbeddedRedis) -> bool:
    info = node.client().info("replication")
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


class RedisWork:
    """Command time and calls of every node while it was a master (see the module doc)."""

    def __init__(self, redis_cluster: EmbeddedCluster, interval_s: float = 1.0) -> None:
        self.redis = redis_cluster
        self.interval_s = interval_s
        self._last: dict[int, tuple[str, int, int]] = {}  # port -> (run_id, usec, calls)
        self.master_usec = 0
        self.master_calls = 0
        self.by_node: dict[str, dict[str, int]] = {}
        self.by_command: dict[str, list[int]] = {}  # name -> [usec, calls] on masters
        self._last_cmds: dict[int, dict[str, tuple[int, int]]] = {}
        self.timeline: list[tuple[float, int]] = []  # (monotonic, master_usec so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="redis-work", daemon=True)

    def __enter__(self) -> RedisWork:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def usec_between(self, t0: float, t1: float) -> int:
        """Master command time between two instants (to the nearest samples)."""

        def at(t: float) -> int:
            before = [u for s, u in self.timeline if s <= t]
            return before[-1] if before else 0

        return at(t1) - at(t0)

    def sample(self) -> None:
        self._sample_nodes()
        self.timeline.append((time.monotonic(), self.master_usec))

    def _sample_nodes(self) -> None:
        for node in list(self.redis.nodes):
            port = node.port
            if not node.running or port is None:
                continue
            with contextlib.suppress(redis.RedisError, OSError):
                client = node.client()
                run_id = client.info("server")["run_id"]
                role = client.info("replication")["role"]
                stats = client.info("commandstats")
                cmds = {k.removeprefix("cmdstat_"): (int(v["usec"]), int(v["calls"]))
                        for k, v in stats.items()}  # fmt: skip
                cmds.pop("info", None)  # this sampler's own calls
                usec = sum(u for u, _ in cmds.values())
                calls = sum(c for _, c in cmds.values())
                prev = self._last.get(port)
                before = self._last_cmds.get(port, {}) if prev and prev[0] == run_id else {}
                self._last_cmds[port] = cmds
                d_usec, d_calls = usec, calls
                if prev is not None and prev[0] == run_id:
                    d_usec, d_calls = usec - prev[1], calls - prev[2]
                self._last[port] = (run_id, usec, calls)
                if prev is not None and role == "master":
                    self.master_usec += d_usec
                    self.master_calls += d_calls
                    name = f"127.0.0.1:{port}"
                    mine = self.by_node.setdefault(name, {"usec": 0, "calls": 0})
                    mine["usec"] += d_usec
                    mine["calls"] += d_calls
                    for name, (u, c) in cmds.items():
                        u0, c0 = before.get(name, (0, 0))
                        acc = self.by_command.setdefault(name, [0, 0])
                        acc[0] += u - u0
                        acc[1] += c - c0
