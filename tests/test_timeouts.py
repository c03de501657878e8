"""Timeouts: a record that is not complete fails between T and T*B/(B-1) after it was
persisted; resetTimeout; orphan collection; several rotators at once."""

from __future__ import annotations

import threading
import time

from ftlayer import FTLayer
from tests.toolkit import until

T, B = 0.6, 3
SLACK_MS = 250  # how late our polling loop may notice a due deadline (a loaded CI box)


def _timed_out(layer: FTLayer) -> int:
    """Rotate once (what is due fails now), then count the records failed by timeout and
    the orphans collected: a poll's check, what a sidecar does on its clock."""
    layer.expire_due()
    s = layer.stats()
    return s.failed_timeout + s.orphans


def test_timeout_within_rotating_bound(make_layer) -> None:
    layer = make_layer(timeout_s=T, buckets=B, max_replays=0)
    h = layer.handler()
    rids = []
    for i in range(12):  # persisted at different phases of the bucket interval
        rids.append(h.persist_record(i, source=0))
        h.flush()
        time.sleep(T / (B - 1) / 6)
    inited = {r.source_id: layer.acker.entry(r.source_id).inited_ms for r in rids}
    until(lambda: _timed_out(layer) >= len(rids), "the records to time out", 5.0, 0.01)
    lo, hi = T * 1000, T * B / (B - 1) * 1000
    for dl in layer.persistence.dead_letters():
        age = dl.history[-1].time_ms - inited[dl.source_id]
        assert lo <= age <= hi + SLACK_MS, f"failed {age} ms after persist, not in [{lo}, {hi}]"
        assert dl.history[-1].reason == "timeout"
    assert layer.stats().failed_timeout == len(rids)


def test_reset_timeout_postpones_expiry(make_layer) -> None:
    layer = make_layer(timeout_s=T, buckets=B)
    h = layer.handler()
    keep, lose = h.persist_record("keep", source=0), h.persist_record("lose", source=0)
    h.flush()
    end = time.monotonic() + T * B / (B - 1) + 0.3
    while time.monotonic() < end:  # long-running work on `keep`
        assert layer.reset_timeout([keep]) == 1
        layer.expire_due()
        time.sleep(0.05)
    assert layer.stats().failed_timeout == 1
    assert layer.persistence.get(keep.source_id) is not None
    assert layer.persistence.get(lose.source_id) is None  # retired: replayed under a new id


def test_reset_timeout_reaches_every_shard(make_layer) -> None:
    """Records on every shard (the reset's calls pipelined on one server, one per shard on
    a cluster): each gets a later deadline, and the count leaves out a completed record.
    Catches: a shard's call dropped or its reply not counted."""
    from ftlayer.ids import shard_of

    layer = make_layer(timeout_s=T, buckets=B)
    rids, shards = [], set(range(layer.config.shards))
    for _ in range(200):  # a handler's records share a shard: handlers until all are hit
        h = layer.handler()
        rids += [h.persist_record(i, source=0) for i in range(3)]
        h.flush()
        if {shard_of(r.source_id, len(shards)) for r in rids} == shards:
            break
    assert {shard_of(r.source_id, len(shards)) for r in rids} == shards
    before = {r.source_id: layer.acker.entry(r.source_id).deadline_ms for r in rids}
    h.ack(rids[0])
    h.flush()
    time.sleep(T / (B - 1) + 0.05)  # a bucket later: a reset deadline is a later one
    assert layer.reset_timeout(rids) == len(rids) - 1
    for r in rids[1:]:
        assert layer.acker.entry(r.source_id).deadline_ms > before[r.source_id]


def test_orphans_are_collected_without_replay(make_layer) -> None:
    layer = make_layer(timeout_s=T, buckets=B)
    ghost = layer.handler()
    from ftlayer import RecordId

    ghost.ack(RecordId(0xDEAD_BEEF, 0x1234))  # an id nobody persisted
    ghost.flush()
    assert layer.acker.size() == 1
    until(lambda: _timed_out(layer) >= 1, "the orphan to be collected", 5.0, 0.01)
    s = layer.stats()
    assert (s.orphans, s.replayed, s.failed_timeout, s.pending) == (1, 0, 0, 0)
    assert layer.acker.size() == 0


def test_concurrent_rotators_fail_each_record_once(make_layer) -> None:
    layer = make_layer(timeout_s=T, buckets=B, expire_batch=7)
    h = layer.handler()
    for i in range(300):
        h.persist_record(i, source=0)
    h.flush()
    time.sleep(T * B / (B - 1) + 0.05)
    threads = [threading.Thread(target=layer.expire_due) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = layer.stats()
    assert (s.failed_timeout, s.replayed, s.pending, s.queued_replays) == (300, 300, 300, 300)


def test_rotator_thread_fails_on_schedule(make_layer) -> None:
    layer = make_layer(timeout_s=T, buckets=B)
    h = layer.handler()
    h.persist_record("x", source=0)
    h.flush()
    rotator = layer.start_rotator()
    try:
        time.sleep(T * B / (B - 1) + 0.3)
    finally:
        rotator.stop()
    assert rotator.rotations >= 2 and rotator.errors == 0
    assert layer.stats().failed_timeout == 1


def test_handler_reset_timeout_from_a_task(make_layer) -> None:
    layer = make_layer(timeout_s=T, buckets=B)
    src = layer.handler()
    rid = src.persist_record("long job", source=0)
    assert src.reset_timeout(rid) is True  # not flushed yet: nothing to reset
    src.flush()
    before = layer.acker.entry(rid.source_id).deadline_ms
    time.sleep(T / (B - 1) + 0.05)
    task = layer.handler()
    assert task.reset_timeout(rid) is True
    assert layer.acker.entry(rid.source_id).deadline_ms > before
    task.ack(rid)
    task.flush()
    assert task.reset_timeout(rid) is False  # complete: nothing left to reset


def test_backpressure_waits_for_pending_to_drop(make_layer) -> None:
    layer = make_layer(max_pending=5)
    h = layer.handler()
    rids = [h.persist_record(i, source=3) for i in range(8)]
    h.flush()
    assert layer.pending_by_source() == {3: 8}
    t0 = time.monotonic()
    assert layer.wait_for_capacity(3, timeout_s=0.3) is False
    assert time.monotonic() - t0 >= 0.3
    assert layer.wait_for_capacity(4, timeout_s=0.3) is True  # another source is free

    def drain() -> None:
        time.sleep(0.2)
        sink = layer.handler()
        for r in rids[:4]:
            sink.ack(r)
        sink.flush()

    threading.Thread(target=drain).start()
    assert layer.wait_for_capacity(3, timeout_s=5) is True
    assert layer.pending_by_source()[3] == 4
