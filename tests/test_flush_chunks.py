"""Issue 12, defect 4: a flush larger than Redis's largest argument (``proto-max-bulk-len``)
used to fail forever; a shard's records now go in calls of at most ``flush_chunk_bytes``."""

from __future__ import annotations

import numpy as np
import pytest

from ftlayer import EmbeddedRedis, FTConfig, FTLayer, FTLayerError
from ftlayer.acker import ShardBatch, pack_fails


def test_a_flush_past_the_servers_largest_argument_is_sent_in_chunks() -> None:
    """A server that takes arguments of 1 MiB at most, 3.6 MB of records in one shard."""
    with EmbeddedRedis(extra_args=("--proto-max-bulk-len", "1mb")) as server:
        cfg = FTConfig(namespace="chunks", shards=1, flush_chunk_bytes=256 << 10,
                       max_record_bytes=100_000, flush_retries=0)  # fmt: skip
        layer = FTLayer(server.client(), cfg)
        h = layer.handler()
        rids = [h.persist_record({"i": i, "pad": "x" * 60_000}, source=0) for i in range(60)]
        done = [h.persist_record({"i": -i}, source=0) for i in range(1, 4)]
        for rid in done:
            h.ack(rid)  # complete inside the task: counted, never stored
        sink = layer.handler()
        result = h.flush()
        assert result.calls >= 14, result  # 3.6 MB / 256 KiB
        st = layer.stats()
        assert (st.persisted, st.pending, st.completed_local) == (63, 60, 3), st
        for rid in rids:
            sink.emit(rid)
            sink.ack(rid)
        sink.fail(rids[0], "one of them fails")
        assert sink.flush().completed == 0  # their children are pending
        st = layer.stats()
        assert (st.pending, st.queued_replays, st.failed_explicit) == (60, 1, 1), st

        # the same records in one call: the server refuses the argument
        whole = FTLayer(server.client(), FTConfig(namespace="whole", shards=1,
                                                  max_record_bytes=100_000, flush_retries=0))
        h = whole.handler()
        for i in range(60):
            h.persist_record({"i": i, "pad": "x" * 60_000}, source=0)
        with pytest.raises(FTLayerError, match="proto-max-bulk-len; set flush_chunk_bytes"):
            h.flush()


def test_chunks_keep_every_record_whole_and_in_order() -> None:
    b = ShardBatch()
    frames = [bytes([i]) * (100 + i) for i in range(20)]
    for i, f in enumerate(frames):
        b.add_persist(i, f)
    b.fails = [(i, "explicit", "e" * 50) for i in range(7)]
    b.local_completed = 5
    calls = b.calls(max_bytes=600)
    assert all(len(p) <= 600 and len(f) <= 600 for p, _, f, _ in calls)
    assert b"".join(p for p, _, _, _ in calls) == b"".join(b.persists)
    assert b"".join(f for _, _, f, _ in calls) == pack_fails(b.fails)
    assert [c[3] for c in calls] == [5] + [0] * (len(calls) - 1)
    big = ShardBatch()
    big.add_persist(1, b"z" * 5000)  # larger than a chunk: travels alone
    assert [len(p) for p, _, _, _ in big.calls(600)] == [5012]


def test_packed_blocks_and_single_records_share_calls_whole() -> None:
    """Catches: a block cut inside a record, and a block sent in a call of its own when
    it fits beside the single records (their failures ride in the first call)."""
    b = ShardBatch()
    b.add_persist(7, b"s" * 50)
    items = [bytes([i]) * (20 + i) for i in range(30)]
    b.add_persists(b"".join(items), np.array([len(i) for i in items]))
    assert [p for p, _, _, _ in b.calls(10_000)] == [b.persists[0] + b"".join(items)]
    parts = [p for p, _, _, _ in b.calls(200)]
    assert all(len(p) <= 200 for p in parts) and b"".join(parts) == b.persists[0] + b"".join(items)
    starts = {0}
    for p in parts[:-1]:
        starts.add(max(starts) + len(p))
    bounds = np.cumsum([62] + [len(i) for i in items]).tolist()
    assert starts - {0} <= set(bounds), "every cut falls between two records"
