"""Redis Cluster: one slot per script call, cluster URLs, and the sidecar on a cluster."""

from __future__ import annotations

import subprocess
import sys

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from ftlayer import FTConfig, FTLayer
from ftlayer.connection import connect
from ftlayer.embedded import free_port
from ftlayer.errors import ConfigError, RedisUnavailableError
from ftlayer.keys import Keyspace
from tests.toolkit import until


def test_every_key_of_a_shard_is_in_one_slot() -> None:
    for shard in Keyspace("orders", 16).shards:
        keys = [*shard.script_keys, shard.tmo(1795341700000), shard.replay(3)]
        keys.append(f"{shard.prefix}:flush:abc")
        assert len({key_slot(k.encode()) for k in keys}) == 1, shard.prefix


def test_cluster_url_opens_a_cluster_client(redis_cluster) -> None:
    with FTLayer.open(FTConfig(redis_url=redis_cluster.url, namespace="clurl")) as layer:
        assert isinstance(layer.client, RedisCluster)
        assert layer.embedded is None and layer.stats().pending == 0


def test_a_cluster_url_names_several_seeds_and_a_dead_first_one_is_skipped(redis_cluster) -> None:
    live = redis_cluster.url.removeprefix("redis+cluster://")
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    client = connect(f"redis+cluster://{dead},{live}")
    assert isinstance(client, RedisCluster) and len(client.get_primaries()) == 3
    with pytest.raises(RedisUnavailableError):
        connect(f"redis+cluster://{dead}/0")
    with pytest.raises(ConfigError, match="bad node 'nohost'"):
        connect(f"redis+cluster://{live.split(',')[0]},nohost/0")


def test_sidecar_rotates_on_a_cluster(redis_cluster, tmp_path) -> None:
    layer = FTLayer.open(FTConfig(redis_url=redis_cluster.url, namespace="clside",
                                  timeout_s=0.5))  # fmt: skip
    h = layer.handler()
    for i in range(50):
        h.persist_record(i, source=0)
    h.flush()
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115
    serve = subprocess.Popen(
        [sys.executable, "-m", "ftlayer.cli", "serve", "--redis-url", redis_cluster.url,
         "--namespace", "clside", "--timeout-s", "0.5", "--metrics-port", "-1"],
        stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    try:
        until(lambda: layer.stats().failed_timeout >= 50,
              lambda: "50 timeouts; serve.log: " + (tmp_path / "serve.log").read_text()[-2000:],
              20)  # fmt: skip
        assert layer.client.get(layer.keyspace.lease) is not None
    finally:
        serve.terminate()
        assert serve.wait(timeout=30) == 0
        log.close()
    s = layer.stats()
    assert (s.replayed, s.queued_replays, s.pending) == (50, 50, 50)
    layer.clear()
    layer.close()


def test_shards_spread_evenly_over_the_masters(redis_cluster) -> None:
    from collections import Counter

    from ftlayer.connection import connect

    client = connect(redis_cluster.url)
    try:
        for shards in (3, 6, 12):
            ks = Keyspace("spread", shards)
            owners = Counter(client.get_node_from_key(s.stats).name for s in ks.shards)
            assert sorted(owners.values()) == [shards // 3] * 3, (shards, owners)
    finally:
        client.close()
