"""A Redis restart with AOF on keeps pending records, their timeouts and counters."""

from __future__ import annotations

from ftlayer import EmbeddedRedis, FTConfig, FTLayer


def test_pending_records_survive_a_restart_with_aof(tmp_path) -> None:
    server = EmbeddedRedis(data_dir=tmp_path / "data", appendonly=True).start()
    try:
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
    finally:
        server.stop()
