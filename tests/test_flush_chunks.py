"""A flush larger than Redis's largest argument (``proto-max-bulk-len``)
used to fail forever; a shard's records now go in calls of at most ``flush_chunk_bytes``."""

from __future__ import annotations

import numpy as np
import pytest

from ftlayer import EmbeddedRedis, FTConfig, FTLayer, FTLayerError
from ftlayer.acker import ShardBatch, pack_fails
from ftlayer.wire import PERSIST_HEAD


def test_a_flush_past_the_servers_largest_argument_is_sent_in_chunks(make_redis) -> None:
    """A server that takes arguments of 1 MiB at most, 3.6 MB of records in one shard."""
    server = make_redis(extra_args=("--proto-max-bulk-len", "1mb"))
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
        b.add_persist(i, 1000 + i, f)
    b.fails = [(i, "explicit", "e" * 50) for i in range(7)]
    b.local_completed = 5
    calls = b.calls(max_bytes=600)
    assert all(len(p) + len(r) <= 600 and len(f) <= 600 for p, _, f, _, r in calls)
    assert b"".join(r for *_, r in calls) == b"".join(frames)
    heads = b"".join(p for p, *_ in calls)
    assert heads == b"".join(PERSIST_HEAD.pack(i, 1000 + i, len(f)) for i, f in enumerate(frames))
    for p, *_, r in calls:  # each call's heads name exactly its records
        assert sum(PERSIST_HEAD.unpack_from(p, at)[2] for at in range(0, len(p), 20)) == len(r)
    assert b"".join(f for _, _, f, _, _ in calls) == pack_fails(b.fails)
    assert [c[3] for c in calls] == [5] + [0] * (len(calls) - 1)
    big = ShardBatch()
    big.add_persist(1, 2, b"z" * 5000)  # larger than a chunk: travels alone
    assert [(len(p), len(r)) for p, *_, r in big.calls(600)] == [(20, 5000)]


def test_packed_blocks_and_single_records_share_calls_whole() -> None:
    """Catches: a block cut inside a record, and a block sent in a call of its own when
    it fits beside the single records (their failures ride in the first call)."""
    b = ShardBatch()
    b.add_persist(7, 8, b"s" * 50)
    items = [bytes([i]) * (20 + i) for i in range(30)]
    heads = b"".join(PERSIST_HEAD.pack(i, i, len(x)) for i, x in enumerate(items))
    b.add_persists(heads, b"".join(items), np.array([len(i) for i in items]))
    [(p, _, _, _, r)] = b.calls(10_000)
    assert (p, r) == (PERSIST_HEAD.pack(7, 8, 50) + heads, b"s" * 50 + b"".join(items))
    calls = b.calls(200)
    assert len(calls) > 2 and all(len(p) + len(r) <= 200 for p, *_, r in calls)
    assert b"".join(r for *_, r in calls) == b"s" * 50 + b"".join(items)
    for p, *_, r in calls:  # cut between records: each call's heads name exactly its records
        assert sum(PERSIST_HEAD.unpack_from(p, at)[2] for at in range(0, len(p), 20)) == len(r)


def test_records_born_and_failed_in_a_task_of_many_calls_replay_at_once(
    redis_server: EmbeddedRedis,
) -> None:
    """A flush in several calls: every failure travels in or after the call that stores
    its record. Catches: a failure sent in an earlier call than its record's persist (it
    found nothing, counted an orphan, and the record replayed only at its timeout)."""
    cfg = FTConfig(namespace="chunkfail", shards=1, flush_chunk_bytes=4096, max_record_bytes=4000)
    layer = FTLayer(redis_server.client(), cfg)
    try:
        h = layer.handler()
        rids = [h.persist_record({"i": i, "pad": "x" * 500}, source=0) for i in range(40)]
        h.fail_many(np.array([r.source_id for r in rids]), error="bad input")
        result = h.flush()
        assert result.calls >= 5, result
        st = layer.stats()
        assert (st.orphans, st.queued_replays, st.pending) == (0, 40, 40), st
    finally:
        layer.clear()
