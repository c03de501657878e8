"""RedisAckerTable: completion atomicity, script reload, idempotent retries."""

from __future__ import annotations

import time

import pytest
import redis

from ftlayer import FlushError, FTConfig, FTLayer
from ftlayer.acker import ShardBatch
from ftlayer.ids import shard_of


def test_completion_deletes_entry_record_and_timeout_in_one_call(layer: FTLayer) -> None:
    """Invariant 4: the call that brings the value to 0 removes the ack entry and counts
    the completion; the bucket's last entry takes the bucket's frames with it."""
    src_task, sink = layer.handler(), layer.handler()
    rid = src_task.persist_record({"v": 1}, hash_code=3, source=0)
    src_task.flush()
    shard = layer.keyspace[shard_of(rid.source_id, layer.config.shards)]
    bucket, frames, slot = shard.bucket(rid.source_id)
    entry = layer.acker.entry(rid.source_id)
    assert entry is not None and entry.inited and entry.value == rid.current_id
    tmo = shard.tmo(int(entry.deadline_ms))
    assert layer.client.sismember(tmo, bucket)
    assert layer.persistence.get(rid.source_id).decode() == {"v": 1}
    assert layer.client.exists(bucket) and layer.client.exists(frames)

    sink.ack(rid)
    batches = sink.pending_batches()
    assert list(batches) == [shard_of(rid.source_id, layer.config.shards)]
    result = layer.acker.apply(batches, token="t1")  # exactly one script call
    assert result.calls == 1 and result.completed == 1
    assert not layer.client.exists(bucket) and not layer.client.exists(frames)
    assert layer.acker.entry(rid.source_id) is None and layer.persistence.get(rid.source_id) is None
    s = layer.stats()
    assert (s.completed, s.pending, s.latency_count) == (1, 0, 1)
    # it completed within a second: every histogram bucket from 1 s up holds it
    buckets = s.latency_buckets
    assert buckets["1000"] == buckets["300000"] == buckets["+Inf"] == 1


def test_scripts_reload_after_script_flush(make_layer) -> None:
    """Every script call survives SCRIPT FLUSH (a Redis restart without its script cache)
    and does its work: a flush completes, an expiry times a record out, a fail retires."""
    layer = make_layer(timeout_s=0.3)
    h = layer.handler()
    rid, _late, failing = (h.persist_record(x, source=0) for x in ("a", "b", "c"))
    h.flush()
    layer.client.script_flush()
    sink = layer.handler()
    sink.ack(rid)
    assert sink.flush().completed == 1  # EVALSHA -> NoScriptError -> reloaded
    layer.client.script_flush()
    assert layer.fail([failing]) == (1, 0, 0)
    time.sleep(0.6)
    layer.client.script_flush()
    assert layer.expire_due().timed_out == 1  # ``late`` timed out
    s = layer.stats()
    assert (s.completed, s.failed_explicit, s.failed_timeout, s.queued_replays) == (1, 1, 1, 2)
    assert {c.frame.decode() for c in layer.claim_replays(0, 10)} == {"b", "c"}


def test_a_retried_flush_is_applied_once(layer: FTLayer) -> None:
    """Invariant 12: the same call sent twice (a retry after a lost reply) changes nothing.
    This is the script's half; that ``FTHandler.flush`` resends the same work under the
    same token after a FlushError is tests/test_flush_retry.py."""
    h = layer.handler()
    rid = h.persist_record("a", source=0)
    h.flush()
    sink = layer.handler()
    child = sink.emit(rid)
    sink.ack(rid)
    shard = shard_of(rid.source_id, layer.config.shards)
    batch = sink.pending_batches()[shard]
    keys = layer.keyspace[shard].script_keys
    cfg = layer.config
    args = ["tok-1", cfg.interval_ms, cfg.buckets, cfg.max_replays, b"", batch.pack_xors(), b"", 0,
            b""]
    assert layer.scripts.flush(keys=keys, args=args)[0] == 0
    assert layer.scripts.flush(keys=keys, args=args)[0] == -1  # seen token: not re-applied
    entry = layer.acker.entry(rid.source_id)
    assert entry is not None and entry.value == child.current_id


@pytest.mark.slow
def test_flush_raises_a_clear_error_when_redis_is_unreachable(make_redis) -> None:
    server = make_redis()  # killed (SIGKILL) between the open and the flush
    client = redis.Redis(host="127.0.0.1", port=server.port, socket_connect_timeout=0.2)
    layer = FTLayer(client, FTConfig(flush_retries=2, flush_backoff_s=0.01))
    h = layer.handler()
    h.persist_record("x", source=0)
    server.stop(kill=True)
    with pytest.raises(FlushError, match="flush: Redis unreachable after 3 attempts"):
        h.flush()
    assert h.pending_sources == 1, "the buffered work is kept for a retry"


def test_empty_flush_sends_nothing(layer: FTLayer) -> None:
    assert layer.handler().flush().calls == 0
    assert ShardBatch().empty
