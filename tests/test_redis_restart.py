"""A Redis restart with AOF on keeps pending records, their timeouts and counters."""

from __future__ import annotations

import threading
import time

import pytest
import redis

from ftlayer import FlushError, FTConfig, FTLayer
from ftlayer.ids import RecordId


def test_pending_records_survive_a_restart_with_aof(tmp_path, make_redis) -> None:
    server = make_redis(data_dir=tmp_path / "data", appendonly=True)
    layer = FTLayer(server.client(), FTConfig(namespace="aof", shards=4))
    h = layer.handler()
    rids = [h.persist_record({"i": i}, hash_code=i, source=0) for i in range(200)]
    h.flush()
    half = layer.handler()
    for r in rids[:100]:
        half.ack(r)
    half.flush()
    layer.client.close()

    server.restart(kill=False)  # SIGTERM: redis fsyncs the AOF and exits

    layer = FTLayer(server.client(), FTConfig(namespace="aof", shards=4))
    s = layer.stats()
    assert (s.persisted, s.completed, s.pending) == (200, 100, 100)
    rest = layer.handler()
    for r in rids[100:]:
        assert layer.persistence.get(r.source_id).decode() == {"i": r and rids.index(r)}
        rest.ack(r)
    assert rest.flush().completed == 100
    assert layer.stats().pending == 0 and layer.acker.size() == 0
    layer.client.close()


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_kill_9_of_redis_loses_no_record_a_source_was_told_is_persisted(
    tmp_path, fsync, make_redis
) -> None:
    """Crash test (d). A source writes batches of records; a flush that returned told it
    they are persisted. Redis is killed with SIGKILL mid-stream and restarted from its
    AOF: every record a source was told is persisted is there, payload intact.

    What this proves and what it cannot: Redis appends a write to the AOF (``write(2)``)
    before it replies, so a crash of the Redis *process* loses no acknowledged write with
    either fsync policy (measured here: 0). ``everysec`` fsyncs once a second, so a crash
    of the *machine* (power, kernel) can lose the last second or two of acknowledged
    writes; ``always`` (fsync before the reply) or ``durability="replicated"`` (a replica
    has it before the reply, tests/test_durability.py) lose none. A machine crash cannot
    be injected honestly on this machine; docs/failure-scenarios.md states the bound."""
    server = make_redis(
        data_dir=tmp_path / "data", appendonly=True, extra_args=("--appendfsync", fsync)
    )
    config = FTConfig(namespace="k9", shards=4, flush_retries=0, flush_backoff_s=0.01)
    told: list[tuple[int, RecordId]] = []
    errors: list[BaseException] = []

    def source() -> None:
        layer = FTLayer(server.client(socket_timeout=2), config)
        i = 0
        while True:
            h = layer.handler()
            rids = [h.persist_record({"i": j}, hash_code=j, source=0) for j in range(i, i + 50)]
            try:
                h.flush()
            except (FlushError, redis.RedisError) as e:  # Redis died under this flush
                errors.append(e)
                return
            told.extend(zip(range(i, i + 50), rids, strict=True))
            i += 50

    writer = threading.Thread(target=source)
    writer.start()
    while len(told) < 2000 and writer.is_alive():
        time.sleep(0.01)
    server.stop(kill=True, keep_dir=True)  # SIGKILL, mid-stream
    writer.join(timeout=30)
    assert errors, "the source was writing when Redis died"
    server.start()  # same port and directory: loads the AOF
    layer = FTLayer(server.client(), config)
    missing = [j for j, rid in told if layer.persistence.get(rid.source_id) is None]
    assert not missing, f"{len(missing)} of {len(told)} told-persisted records lost"
    wrong = [j for j, rid in told[:: max(1, len(told) // 500)]
             if layer.persistence.get(rid.source_id).decode() != {"i": j}]  # fmt: skip
    assert not wrong
    st = layer.stats()
    assert st.pending >= len(told)  # (plus any whose flush applied but never replied)
    print(f"appendfsync {fsync}: {len(told)} told persisted, 0 lost, {st.pending} pending")
