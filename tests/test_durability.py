"""durability="replicated": a flush returns only once a replica has its writes, so a
failover loses no record that a task counted as persisted."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
import redis
from redis.exceptions import ClusterDownError

from ftlayer import EmbeddedRedis, FlushError, FTConfig, FTLayer, FTLayerError, FTStats
from ftlayer.connection import connect
from ftlayer.embedded import EmbeddedCluster
from ftlayer.ids import shard_of
from tests.toolkit import replica_linked, until


def test_replicated_flush_on_a_server_with_a_replica(make_redis) -> None:
    master = make_redis()
    rep = make_redis(extra_args=("--replicaof", "127.0.0.1", str(master.port)))
    until(lambda: replica_linked(rep), "the replica's link to its master", 15, 0.05)
    layer = FTLayer(master.client(), FTConfig(namespace="dur", durability="replicated"))
    h = layer.handler()
    rids = [h.persist_record(i, source=0) for i in range(100)]
    h.flush()
    replica = FTLayer(rep.client(), FTConfig(namespace="dur"))
    assert replica.stats().pending == 100, "the replica has every persisted record"
    sink = layer.handler()
    for r in rids:
        sink.ack(r)
    assert sink.flush().completed == 100


def test_replicated_flush_without_a_replica_fails_clearly(make_redis) -> None:
    lonely = make_redis()
    cfg = FTConfig(namespace="dur", durability="replicated", replica_wait_s=0.2)
    h = FTLayer(lonely.client(), cfg).handler()
    h.persist_record("x", source=0)
    with pytest.raises(FlushError, match="no replica acknowledged"):
        h.flush()


def test_a_killed_master_is_replaced_and_nothing_is_lost() -> None:
    with EmbeddedCluster(masters=3, replicas=1) as cluster:
        cfg = FTConfig(namespace="fo", redis_url=cluster.url, durability="replicated",
                       shards=6, flush_retries=8, flush_backoff_s=0.25)  # fmt: skip
        layer = FTLayer(connect(cluster.url), cfg)
        h = layer.handler()
        rids = [h.persist_record({"i": i}, source=0) for i in range(600)]
        h.flush()
        # the master of the first record's shard: records persisted together share a
        # bucket (docs/storage-layout.md), so 600 of them sit in 5 shards and may all miss
        # a given master
        first = layer.keyspace[shard_of(rids[0].source_id, cfg.shards)]
        victim_name = layer.client.get_node_from_key(first.stats).name
        victim = next(n for n in cluster.nodes if f"127.0.0.1:{n.port}" == victim_name)
        victim.stop(kill=True)  # SIGKILL of a master holding shards

        def cluster_ok() -> bool:
            infos = [n.client().cluster("info") for n in cluster.nodes if n.running]
            return all(i.get("cluster_state") == "ok" for i in infos)

        # its replica is promoted (cluster-node-timeout 2 s)
        until(cluster_ok, "a failover (cluster_state ok on every live node)", 30, 0.2)
        layer.client.nodes_manager.initialize()

        def stats() -> FTStats | None:
            try:
                return layer.stats()
            except (redis.ConnectionError, ClusterDownError):
                return None

        st = until(stats, "the cluster to answer after the failover", 10, 0.2)
        assert st.pending == 600, "every persisted record survived"
        # the promoted replica has no replica of its own: replicated flushes to its
        # shards fail clearly (the task fails and Spark re-runs it) until one is back
        strict = layer.handler()
        for r in rids:
            strict.ack(r)
        with pytest.raises(FlushError, match="no replica acknowledged"):
            strict.flush()
        relaxed = FTLayer(layer.client, replace(cfg, durability="local"))
        sink = relaxed.handler()
        for r in rids:
            sink.ack(r)
        sink.flush()
        assert relaxed.stats().pending == 0 and relaxed.stats().completed == 600


def test_a_command_to_a_killed_master_waits_for_its_replica() -> None:
    """redis-py alone gives up within a second (its retries do not wait); ftlayer's
    cluster client (ftlayer.cluster) waits until the replica is promoted."""
    with EmbeddedCluster(masters=3, replicas=1) as cluster:
        client = connect(cluster.url)
        client.set("k", "before")
        victim_name = client.get_node_from_key("k").name
        node_client = client.get_redis_connection(client.get_node_from_key("k"))
        assert node_client.wait(1, 5000) == 1, "the replica has the key"
        victim = next(n for n in cluster.nodes if f"127.0.0.1:{n.port}" == victim_name)
        victim.stop(kill=True)
        started = time.monotonic()
        assert client.get("k") == b"before", "read from the promoted replica"
        client.set("k", "after")
        waited = time.monotonic() - started
        assert client.get_node_from_key("k").name != victim_name
        assert waited > 1.0, f"answered after {waited:.1f} s: the failover was not waited for"


def test_the_drivers_write_waits_for_a_replica_to_attach(make_redis) -> None:
    """The driver's layer (``be_patient``) settling a batch on a master with no replica
    yet (a failover's promoted replica): its replicated write is retried until a replica
    attaches (started 1.5 s later, a real ``redis-server --replicaof``), then lands once.
    Catches: the driver's FlushError ending the streaming query in a failover."""
    master = make_redis()
    cfg = FTConfig(namespace="dur", durability="replicated", replica_wait_s=0.2)
    driver = FTLayer(master.client(), cfg).be_patient(30)
    h = driver.handler()
    rids = [h.persist_record(i, source=0) for i in range(50)]
    extra = ("--replicaof", "127.0.0.1", str(master.port))
    late = EmbeddedRedis(extra_args=extra)  # started by a timer, 1.5 s into the flush
    timer = threading.Timer(1.5, late.start)
    timer.start()
    try:
        t0 = time.monotonic()
        h.flush()  # waits for the replica
        assert time.monotonic() - t0 >= 1.0, "it did not wait"
        until(lambda: replica_linked(late), "the late replica's link to its master", 15, 0.05)
        assert FTLayer(late.client(), FTConfig(namespace="dur")).stats().pending == 50
        sink = driver.handler()
        for r in rids:
            sink.ack(r)
        assert sink.flush().completed == 50, "applied once: every record completes"
    finally:
        timer.join()
        late.stop()


def test_the_drivers_write_gives_up_after_driver_wait_s_naming_what_to_check(
    make_redis,
) -> None:
    """No replica ever: past its bound the driver's write fails with one line saying what
    to check. Catches: a driver that waits forever, or fails with a task's message."""
    lonely = make_redis()
    cfg = FTConfig(namespace="dur", durability="replicated", replica_wait_s=0.1)
    h = FTLayer(lonely.client(), cfg).be_patient(1.0).handler()
    h.persist_record("x", source=0)
    t0 = time.monotonic()
    with pytest.raises(FTLayerError, match="driver_wait_s=1s.*has a replica attached"):
        h.flush()
    assert 1.0 <= time.monotonic() - t0 < 10
