"""Held records and the delayed replay queue (real Redis): a record a stage's breaker held
is queued again without spending an attempt and is not claimed before its due time; due
ones are claimed before the queue's head; they count as queued and pending meanwhile."""

from __future__ import annotations

import time

from ftlayer import FTLayer


def _persisted(layer: FTLayer, n: int, source: int = 0) -> list:
    src = layer.handler()
    rids = [src.persist_record({"i": i}, source=source) for i in range(n)]
    src.flush()
    return rids


def test_a_held_record_waits_without_spending_an_attempt(make_layer) -> None:
    """Catches: a hold counted as a failure (budget spent: with max_replays=1 two holds
    and a failure would dead-letter), a held record claimed before its due time, its
    history losing the hold or its attempt number, a delayed record not counted as queued
    and pending (drain() and the status page would think the source idle)."""
    layer: FTLayer = make_layer(max_replays=1)
    [rid] = _persisted(layer, 1)
    due = time.time() + 0.6
    assert layer.fail([rid], "stage s: breaker open", reason="held", hold_until=due) == (1, 0, 0)
    st = layer.stats()
    assert (st.held, st.failed_explicit, st.pending, st.queued_replays) == (1, 0, 1, 1), st
    assert layer.persistence.delayed(0)[0] == 1
    assert layer.claim_replays(0, 10) == [], "claimed before it was due"
    time.sleep(max(0.0, due - time.time()) + 0.1)
    [claimed] = layer.claim_replays(0, 10)
    assert claimed.frame.decode() == {"i": 0}
    [hold] = layer.persistence.history(claimed.record_id.source_id)
    assert (hold.reason, hold.attempt, hold.error) == ("held", 0, "stage s: breaker open")
    # held again (a second outage), then it fails for real: still within max_replays=1
    layer.fail([claimed.record_id], "still down", reason="held", hold_until=time.time())
    [again] = layer.claim_replays(0, 10)
    layer.fail([again.record_id], "a real failure")
    [last] = layer.claim_replays(0, 10)
    history = layer.persistence.history(last.record_id.source_id)
    assert [(f.reason, f.attempt) for f in history] == [("held", 0), ("held", 0),
                                                        ("explicit", 1)]  # fmt: skip
    st = layer.stats()
    assert (st.held, st.failed_explicit, st.dead_lettered, st.pending) == (2, 1, 0, 1), st


def test_due_replays_are_claimed_before_the_queue_head(make_layer) -> None:
    """Catches: delayed replays starved behind the queue (claimed only once it is empty),
    a claim taking more than asked across both, a not-yet-due replay handed out."""
    layer: FTLayer = make_layer()
    rids = _persisted(layer, 6)
    layer.fail(rids[:2], "held", reason="held", hold_until=time.time() + 0.3)
    layer.fail(rids[2:4], "held long", reason="held", hold_until=time.time() + 60)
    layer.fail(rids[4:], "a failure")  # straight to the queue
    time.sleep(0.4)
    first = layer.claim_replays(0, 3)
    assert [c.frame.decode()["i"] for c in first] == [0, 1, 4]
    assert [c.frame.decode()["i"] for c in layer.claim_replays(0, 10)] == [5]
    assert layer.stats().queued_replays == 2 and layer.persistence.delayed(0)[0] == 2
    _, next_due = layer.persistence.delayed(0)
    assert next_due is not None and next_due > time.time() + 50


def test_a_breaker_opens_for_longer_while_its_probes_fail_and_closes(make_layer) -> None:
    """Catches: a breaker that does not open on a batch that mostly failed, one opening on
    a few failures, reopening no longer after a failed probe (or past its cap), not
    closing when a probe passes, rows of a stage open for the batch counted as a probe."""
    from ftlayer.spark.breakers import Breakers
    from ftlayer.spark.policy import ErrorPolicy
    from ftlayer.spark.results import StageCounts

    layer: FTLayer = make_layer()
    policy = {"s": ErrorPolicy(breaker_open_s=2.0, breaker_max_open_s=5.0)}
    b = Breakers(layer, 3)
    assert b.read() == ()
    assert b.after({"s": StageCounts(100, 95, 5)}, policy, ()) == 0.0  # 5 %: stays closed
    assert b.read() == ()
    b.after({"s": StageCounts(100, 0, 100)}, policy, ())
    assert b.read() == ("s",) and b.states["s"].open_s == 2.0
    until = b.states["s"].until
    # a batch while it is open: its rows held until its probe, nothing learnt
    assert b.after({"s": StageCounts(40, 0, 40, held=40)}, policy, ("s",)) == until
    for want in (4.0, 5.0, 5.0):  # failed probes: twice as long, at most breaker_max_open_s
        b.after({"s": StageCounts(100, 0, 100)}, policy, ())
        assert b.states["s"].open_s == want
    b.after({"s": StageCounts(100, 100, 0)}, policy, ())  # a probe that passes
    assert b.read() == () and layer.client.hgetall(layer.keyspace.breakers(3)) == {}
    assert b.after({"other": StageCounts(100, 0, 100)}, policy, ()) == 0.0  # not a Python stage
