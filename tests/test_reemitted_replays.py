"""Suspected: "a re-run or speculative source task re-emits claimed replays under
the same RecordIds, so the first attempt's ids never complete (or complete early)".

A claimed replay is inited with the current id it must be emitted with, so every attempt
of the source task that emits it (Spark's retry after a crash, a speculative copy) acks
the SAME RecordId. Half confirmed, half refuted, against Redis: when two attempts both
flushed, the record's value keeps ``cur`` (XORed by the init and by each attempt) plus any
unacked child, so it never completes from those attempts -- confirmed, but harmless: it
times out and is replayed (a duplicate, never a loss); and it never completes early --
refuted. The vectorized path counts one attempt only
(tests/spark/test_speculation.py); this is the ``ack_scope="task"`` / core handler path.
"""

from __future__ import annotations

import time

from ftlayer import FTLayer


def _claimed(layer: FTLayer):
    h = layer.handler()
    rid = h.persist_record({"id": 1}, source=0)
    h.flush()
    layer.fail([rid], error="first attempt")
    (claim,) = layer.claim_replays(0, 10)
    return claim.record_id


def _attempt(layer: FTLayer, rid):
    h = layer.handler()
    with h.processing(rid):  # emit one child, ack the claimed id
        child = h.emit()
    h.flush()
    return child


def _sink(layer: FTLayer, *children) -> int:
    h = layer.handler()
    for c in children:
        h.ack(c)
    return h.flush().completed


def test_two_attempts_of_a_replay_never_complete_it_early_and_it_replays(make_layer) -> None:
    layer = make_layer(timeout_s=0.5)
    rid = _claimed(layer)
    _attempt(layer, rid)  # attempt A flushed, then died (its shuffle output discarded)
    child_b = _attempt(layer, rid)  # the retry, same RecordId
    assert _sink(layer, child_b) == 0, "completed although attempt A's child is unacked"
    st = layer.stats()
    assert (st.completed, st.pending, st.queued_replays) == (0, 1, 0)
    time.sleep(1.0)
    assert layer.expire_due().timed_out == 1  # not lost: it times out ...
    (again,) = layer.claim_replays(0, 10)  # ... and is replayed
    assert again.frame.decode() == {"id": 1}
    assert _sink(layer, _attempt(layer, again.record_id)) == 1
    st = layer.stats()
    assert (st.completed, st.pending, st.dead_letters) == (1, 0, 0)


def test_one_attempt_completes_a_replay_two_that_both_flushed_never_do(make_layer) -> None:
    """The claimed id is XORed by its init and by each attempt's ack: an odd count
    (init + one attempt) cancels, an even one (init + two attempts) leaves it in, so
    even when both copies' children were written and acked the record is not complete:
    it times out and replays. Two attempts may duplicate a record, never lose it."""
    layer = make_layer(timeout_s=0.5)
    rid = _claimed(layer)
    assert _sink(layer, _attempt(layer, rid)) == 1  # one attempt: complete, once
    rid2 = _claimed(layer)
    a, b = _attempt(layer, rid2), _attempt(layer, rid2)
    assert _sink(layer, a, b) == 0  # both copies' outputs written and acked
    time.sleep(1.0)
    assert layer.expire_due().timed_out == 1
    st = layer.stats()
    assert (st.completed, st.pending, st.queued_replays, st.dead_letters) == (1, 1, 1, 0)
