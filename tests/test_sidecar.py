"""The sidecar as users run it: real `ftlayer serve` processes against a real Redis,
killed with SIGKILL, doubled, and outliving a Redis restart -- nothing lost, no expiry
replayed twice."""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from collections import Counter

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from ftlayer import FTConfig, FTLayer, FTLayerError, __version__
from ftlayer.connection import connect
from ftlayer.service.metrics import METRIC_TYPES
from tests.serving import LEASE_S, Serve, T
from tests.toolkit import cli, until


def lease_holder(layer: FTLayer) -> str | None:
    v = layer.client.get(layer.keyspace.lease)
    return v.decode() if v else None


class Load:
    """A steady source -> sink workload; sinks drop (never ack) a share of what they get,
    so those records must time out and be replayed by the sidecar."""

    def __init__(self, layer: FTLayer, drop: float = 0.25, seed: int = 1) -> None:
        self.layer = layer
        self.drop = drop
        self.rng = random.Random(seed)
        self.next_id = 0
        self.delivered: Counter[int] = Counter()
        self.claims: Counter[tuple[int, int]] = Counter()  # (record id, attempt)

    def round(self, fresh: int = 40, drop: float | None = None) -> None:
        """One micro-batch: persist fresh records, take replays, sink them. On a Redis
        error the whole round is re-run with the same records, as Spark re-runs a batch."""
        first = self.next_id
        drop = self.drop if drop is None else drop
        for attempt in range(50):
            try:
                self._round(first, fresh, drop)
                self.next_id = first + fresh
                return
            except (redis.RedisError, FTLayerError):
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("Redis did not come back")

    def _round(self, first: int, fresh: int, drop: float) -> None:
        src, sink = self.layer.handler(), self.layer.handler()
        work = []
        for i in range(first, first + fresh):
            rid = src.persist_record({"id": i}, hash_code=i, source=0)
            with src.processing(rid):
                work.append((i, src.emit()))
        src.flush()
        for c in self.layer.claim_replays(0, 10_000):
            i = c.frame.decode()["id"]
            attempt = self.layer.persistence.history(c.record_id.source_id)[-1].attempt
            self.claims[(i, attempt)] += 1
            with sink.processing(c.record_id):
                work.append((i, sink.emit()))
        delivered = []
        for i, rid in work:
            if self.rng.random() < drop:
                continue
            sink.ack(rid)
            delivered.append(i)
        sink.flush()
        self.delivered.update(delivered)

    def drain(self, limit_s: float = 40.0) -> None:
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            self.round(fresh=0, drop=0.0)
            if self.layer.stats().pending == 0:
                return
            time.sleep(0.1)
        raise AssertionError(f"not drained: {self.layer.stats()}")

    def check(self) -> None:
        dead = {d.frame.decode()["id"] for d in self.layer.persistence.dead_letters()}
        missing = [i for i in range(self.next_id) if i not in self.delivered and i not in dead]
        assert not missing, f"lost records: {missing[:10]}"
        twice = {k: n for k, n in self.claims.items() if n > 1}
        assert not twice, f"an expiry was replayed twice: {twice}"
        s = self.layer.stats()
        assert s.pending == 0 and s.queued_replays == 0 and self.layer.acker.size() == 0
        assert s.failed_timeout > 0, "the workload must have exercised timeouts"
        assert s.replayed + s.dead_lettered == s.failed_timeout + s.failed_explicit
        assert s.completed + s.dead_lettered == s.persisted == self.next_id


@pytest.fixture
def ns() -> str:
    return f"side{uuid.uuid4().hex[:8]}"


@pytest.mark.slow
def test_kill_9_at_random_moments_loses_nothing(backend_url, ns, tmp_path) -> None:
    """Invariants 1, 6 and 8: SIGKILL of the sidecar at any moment loses nothing and
    replays no expiry twice."""
    layer = FTLayer(connect(backend_url), FTConfig(namespace=ns, timeout_s=T))
    load = Load(layer)
    rng = random.Random(7)
    sidecar = Serve(backend_url, ns, tmp_path / "serve.log")
    kills = 0
    try:
        end = time.monotonic() + 12
        next_kill = time.monotonic() + rng.uniform(0.2, 1.5)
        while time.monotonic() < end:
            load.round()
            if time.monotonic() >= next_kill:
                sidecar.kill()  # SIGKILL, mid-whatever-it-was-doing
                kills += 1
                sidecar = Serve(backend_url, ns, tmp_path / "serve.log")
                next_kill = time.monotonic() + rng.uniform(0.2, 1.5)
            time.sleep(0.03)
        load.drain()
    finally:
        sidecar.stop()
    assert kills >= 5
    load.check()
    layer.clear()


def test_a_sidecar_killed_in_the_middle_of_an_expiry_loses_nothing(redis_server, ns, tmp_path):
    """Crash test (c): ``kill -9`` of the sidecar while it expires a large batch of due
    records (some chunks done, some not); a second sidecar takes the lease and finishes.
    Every record times out exactly once and waits in the replay queue exactly once."""
    n = 60_000
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, timeout_s=T))
    h = layer.handler()
    for i in range(n):
        rid = h.persist_record({"id": i}, source=0)
        with h.processing(rid):
            h.emit()  # a child no one acks: the record must time out
    h.flush()
    first = Serve(redis_server.url, ns, tmp_path / "a.log", "--expire-batch", "500")
    try:
        done = until(lambda: layer.stats().failed_timeout, "the sidecar to start expiring",
                     30, 0.005)  # fmt: skip
        first.kill()
    finally:
        first.stop()
    at_kill = layer.stats().failed_timeout
    assert 0 < done <= at_kill < n, f"killed mid-expiry: {done}..{at_kill} of {n}"
    second = Serve(redis_server.url, ns, tmp_path / "b.log")
    try:
        until(lambda: layer.stats().queued_replays >= n,
              lambda: f"the second sidecar to finish: {layer.stats()}", LEASE_S + 30)  # fmt: skip
    finally:
        second.stop()
    st = layer.stats()
    assert (st.failed_timeout, st.replayed, st.queued_replays, st.pending) == (n, n, n, n)
    claimed = Counter(c.frame.decode()["id"] for c in layer.claim_replays(0, 2 * n))
    assert set(claimed) == set(range(n)) and max(claimed.values()) == 1
    layer.clear()


def test_two_sidecars_replay_each_expiry_once_and_fail_over(backend_url, ns, tmp_path):
    layer = FTLayer(connect(backend_url), FTConfig(namespace=ns, timeout_s=T))
    load = Load(layer, seed=2)
    a = Serve(backend_url, ns, tmp_path / "a.log")
    b = Serve(backend_url, ns, tmp_path / "b.log")
    try:
        for _ in range(60):
            load.round()
            time.sleep(0.03)
        holder = lease_holder(layer)
        pids = {a.proc.pid: a, b.proc.pid: b}
        assert holder is not None and int(holder.rsplit(":", 1)[1]) in pids
        leader = pids[int(holder.rsplit(":", 1)[1])]
        standby = b if leader is a else a
        held = {s: _lease_held(s) for s in (a, b)}
        assert sorted(held.values()) == [0.0, 1.0], held

        leader.kill()
        t0 = time.monotonic()
        while lease_holder(layer) in (None, holder):
            assert time.monotonic() - t0 < LEASE_S + 2.0, "no take-over within the lease"
            load.round(fresh=10)
            time.sleep(0.02)
        took = time.monotonic() - t0
        assert lease_holder(layer).endswith(f":{standby.proc.pid}")
        assert took <= LEASE_S + 1.0
        for _ in range(30):
            load.round()
        load.drain()
    finally:
        a.stop()
        b.stop()
    load.check()
    layer.clear()


def _lease_held(s: Serve) -> float:
    _, text = s.get("/metrics")
    for fam in text_string_to_metric_families(text):
        if fam.name == "ftlayer_lease_held":
            return fam.samples[0].value
    raise AssertionError("no ftlayer_lease_held")


def test_redis_restart_with_aof_mid_run_loses_nothing(tmp_path, make_redis) -> None:
    """Invariants 1 and 6: Redis down mid-run; batches re-run, nothing lost once it is back."""
    server = make_redis(data_dir=tmp_path / "redis", appendonly=True,
                        extra_args=("--appendfsync", "always"))  # fmt: skip
    layer = FTLayer(server.client(), FTConfig(namespace="restart", timeout_s=T,
                                              flush_retries=8))  # fmt: skip
    load = Load(layer, seed=3)
    sidecar = Serve(server.url, "restart", tmp_path / "serve.log")
    try:
        for _ in range(40):
            load.round()
        server.stop(keep_dir=True)  # SIGTERM: AOF fsynced; down for 2 s, then back
        threading.Timer(2.0, server.start).start()
        for _ in range(40):
            load.round()  # the first rounds fail and are re-run until Redis is back
        load.drain()
        assert sidecar.get("/readyz")[0] == 200, "the sidecar recovered"
        assert "redis unreachable" in (tmp_path / "serve.log").read_text()
        load.check()
    finally:
        sidecar.stop()


def test_metrics_health_and_nothing_else(redis_server, ns, tmp_path) -> None:
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, timeout_s=T, max_replays=0))
    h = layer.handler()
    rids = [h.persist_record(i, source=s) for s, i in ((0, 1), (0, 2), (1, 3))]
    h.flush()
    layer.fail([rids[0]], error="bad row")
    sink = layer.handler()
    sink.ack(rids[1])
    sink.flush()
    sidecar = Serve(redis_server.url, ns, tmp_path / "serve.log")
    try:
        assert sidecar.base.startswith("http://127.0.0.1:")
        time.sleep(T * 1.5 + 0.3)  # rids[2] times out -> dead letter (max_replays=0)
        code, text = sidecar.get("/metrics")
        assert code == 200
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        val = {f"{x.name}:{tuple(sorted(x.labels.items()))}": x.value
               for f in fams.values() for x in f.samples}  # fmt: skip
        s = layer.stats()
        n = (("namespace", ns),)
        assert val[f"ftlayer_persisted_total:{n}"] == s.persisted == 3
        assert val[f"ftlayer_completed_total:{n}"] == s.completed == 1
        assert val[f"ftlayer_failed_total:{(*n, ('reason', 'explicit'))}"] == 1
        assert val[f"ftlayer_failed_total:{(*n, ('reason', 'timeout'))}"] == 1
        assert val[f"ftlayer_dead_lettered_total:{n}"] == 2
        assert val[f"ftlayer_dead_letters:{n}"] == 2
        assert val[f"ftlayer_pending:{(*n, ('source', '0'))}"] == 0
        assert val[f"ftlayer_redis_up:{n}"] == 1
        assert val[f"ftlayer_completion_latency_seconds_count:{n}"] == 1
        assert val[f"ftlayer_rotations_total:{n}"] >= 1
        info = (*n, ("shards", "8"), ("timeout_s", f"{T:g}"), ("buckets", "3"))
        assert val[f"ftlayer_info:{tuple(sorted((*info, ('version', __version__))))}"] == 1
        assert f"ftlayer_oldest_pending_age_seconds:{n}" in val
        assert not [k for k in val if "_created" in k], "no _created series"
        labelled = {dict(x.labels).get("namespace") for f in fams.values() for x in f.samples}
        assert labelled == {ns}, "every series names its namespace"
        exported = {f.name + "_total" if f.type == "counter" else f.name: f.type
                    for f in fams.values()}  # fmt: skip
        assert exported == METRIC_TYPES, "the documented names and types are the exported ones"
        code, body = sidecar.get("/healthz")
        assert code == 200 and body == f"alive id={body[9:].strip()}\n"
        assert body.endswith(f":{sidecar.proc.pid}\n")
        assert sidecar.get("/readyz")[1].startswith("ready leader")
        assert sidecar.get("/")[0] == 200, "the status page (tests/test_status_page.py)"
        assert sidecar.get("/debug")[0] == 404 and sidecar.get("/api/other")[0] == 404
    finally:
        assert sidecar.stop() == 0, "SIGTERM stops it cleanly"
    assert "lease released" in (tmp_path / "serve.log").read_text()
    layer.clear()


def test_a_redis_outage_makes_the_sidecar_unready_never_dead(tmp_path, make_redis) -> None:
    """Liveness does not depend on Redis (a Redis outage must not crash-loop every
    sidecar under Kubernetes); readiness does, and comes back with Redis."""
    server = make_redis(data_dir=tmp_path / "redis", appendonly=True)
    sidecar = Serve(server.url, "outage", tmp_path / "serve.log")
    try:
        until(lambda: sidecar.get("/readyz")[0] == 200, "ready")
        server.stop(keep_dir=True)
        until(lambda: sidecar.get("/readyz")[0] == 503, "unready while Redis is down")
        assert sidecar.get("/healthz")[0] == 200, "alive while Redis is down"
        assert "redis not reached" in sidecar.get("/readyz")[1]
        server.start()
        until(lambda: sidecar.get("/readyz")[0] == 200, "ready again")
    finally:
        sidecar.stop()


def test_stats_and_dlq_round_trips(redis_server, ns) -> None:
    import json

    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, max_replays=0))
    h = layer.handler()
    rids = [h.persist_record({"n": i}, hash_code=i, source=2) for i in range(3)]
    h.flush()
    layer.fail(rids, error="schema v2 rejected")
    common = ["--redis-url", redis_server.url, "--namespace", ns]

    st = json.loads(cli("counters", "--json", *common).stdout)
    assert (st["dead_lettered"], st["dead_letters"], st["pending"]) == (3, 3, 0)

    listed = json.loads(cli("dlq", "list", "--json", *common).stdout)
    assert len(listed) == 3
    first = listed[0]
    assert first["source"] == 2 and first["attempts"] == 1 and first["payload_bytes"] > 0
    assert first["history"][0]["reason"] == "explicit"
    assert first["history"][0]["error"] == "schema v2 rejected"
    table = cli("dlq", "list", *common).stdout
    assert first["id"] in table and "schema v2 rejected" in table

    out = cli("dlq", "replay", first["id"], *common)
    assert out.returncode == 0 and "re-driven: 1" in out.stdout
    [claimed] = layer.claim_replays(2, 10)
    assert claimed.frame.decode() in ({"n": 0}, {"n": 1}, {"n": 2})
    hist = layer.persistence.history(claimed.record_id.source_id)
    assert [f.reason for f in hist] == ["explicit", "redrive"]
    sink = layer.handler()
    sink.ack(claimed.record_id)
    assert sink.flush().completed == 1

    refused = cli("dlq", "purge", *common, stdin="")
    assert refused.returncode == 1 and "without --yes" in refused.stderr  # refused: runtime
    assert len(json.loads(cli("dlq", "list", "--json", *common).stdout)) == 2
    out = cli("dlq", "purge", "--yes", *common)
    assert out.returncode == 0 and "purged: 2" in out.stdout
    assert json.loads(cli("dlq", "list", "--json", *common).stdout) == []
    assert cli("dlq", "replay", *common).returncode == 2  # neither ids nor --all: usage
    layer.clear()


def test_passwords_never_printed(tmp_path, make_redis) -> None:
    server = make_redis(extra_args=("--requirepass", "pa55word"))
    url = f"redis://default:pa55word@127.0.0.1:{server.port}/0"
    s = Serve(url, "pw", tmp_path / "serve.log")
    try:
        until(lambda: s.get("/healthz")[0] == 200, "/healthz to answer 200", 0.5, 0.5)
    finally:
        s.stop()
    out = cli("counters", "--redis-url", url, "--namespace", "pw")  # the one serve opened
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "serve.log").read_text() + out.stdout + out.stderr
    assert "pa55word" not in text and "***" in (tmp_path / "serve.log").read_text()
    env_leak = os.environ.get("CLI_REDIS_URL")
    assert env_leak is None or "pa55word" not in env_leak
