"""fail -> retire, new id in the same shard, replay queue; orphans; dead letters."""

from __future__ import annotations

import msgpack

from ftlayer import FailRecord, FTLayer, RecordId
from ftlayer.ids import shard_of
from ftlayer.limits import FLUSH_TOKEN_TTL_MS
from serialization.stored import decode_stored


def test_explicit_fail_replays_under_a_new_id_in_the_same_shard(make_layer) -> None:
    """Invariants 5 and 8: a failure retires the old id, the record comes back under a new one."""
    layer = make_layer(shards=16)
    src = layer.handler(partition=5)
    rid = src.persist_record({"user": 7}, hash_code=-42, source=2)
    src.flush()
    task = layer.handler()
    with task.processing(rid):
        raise FailRecord("rejected by validation")
    task.flush()

    s = layer.stats()
    assert (s.failed_explicit, s.replayed, s.pending, s.queued_replays) == (1, 1, 1, 1)
    assert layer.persistence.get(rid.source_id) is None, "old id retired"
    assert layer.acker.entry(rid.source_id) is None
    [claimed] = layer.claim_replays(source=2, limit=10)
    new = claimed.record_id.source_id
    assert new != rid.source_id
    assert shard_of(new, 16) == shard_of(rid.source_id, 16)
    assert new & 0xFFFF == rid.source_id & 0xFFFF
    assert claimed.frame.hash_code == -42 and claimed.original_partition == 5
    assert claimed.frame.decode() == {"user": 7}
    [failure] = layer.persistence.history(new)
    assert (failure.reason, failure.attempt, failure.error) == (
        "explicit",
        1,
        "rejected by validation",
    )
    # the replayed record completes like any other
    sink = layer.handler()
    sink.ack(claimed.record_id)
    assert sink.flush().completed == 1
    assert layer.stats().pending == 0


def test_late_xor_for_a_retired_id_is_an_orphan(make_layer) -> None:
    """Invariant 5: late XORs of a retired id cannot touch the new one; rotation collects them."""
    layer = make_layer(timeout_s=0.4, buckets=2)
    src = layer.handler()
    rid = src.persist_record("x", source=0)
    src.flush()
    layer.fail([rid], error="boom")
    [claimed] = layer.claim_replays(0, 10)
    late = layer.handler()
    late.ack(rid)  # a straggler's ack for the retired id
    late.flush()
    new_entry = layer.acker.entry(claimed.record_id.source_id)
    assert new_entry is not None and new_entry.value == claimed.record_id.current_id
    old = layer.acker.entry(rid.source_id)
    assert old is not None and not old.inited
    import time

    time.sleep(0.85)
    layer.expire_due()
    s = layer.stats()
    assert s.orphans >= 1 and layer.acker.entry(rid.source_id) is None
    assert s.replayed == 2 and s.failed_timeout == 1  # only the new id timed out


def test_dead_letter_after_max_replays_with_history(make_layer) -> None:
    """Invariant 8: bounded replays, then a dead letter with its history; never acked."""
    layer = make_layer(max_replays=2)
    src = layer.handler()
    rid = src.persist_record(b"payload", hash_code=9, source=1)
    src.flush()
    current = rid
    for attempt in range(3):
        layer.fail([current], error=f"attempt {attempt}")
        claimed = layer.claim_replays(1, 10)
        if attempt < 2:
            assert len(claimed) == 1
            current = claimed[0].record_id
        else:
            assert claimed == []
    s = layer.stats()
    assert (s.failed_explicit, s.replayed, s.dead_lettered, s.pending) == (3, 2, 1, 0)
    assert s.completed == 0, "never acked to make the problem go away"
    [dl] = layer.persistence.dead_letters()
    assert dl.frame.decode() == b"payload" and dl.frame.source == 1
    assert [f.attempt for f in dl.history] == [1, 2, 3]
    assert [f.error for f in dl.history] == ["attempt 0", "attempt 1", "attempt 2"]
    assert all(f.reason == "explicit" for f in dl.history)


def test_fail_of_a_record_born_in_the_same_task(layer: FTLayer) -> None:
    """Invariant 1: source and task chained in one task: the record is persisted and
    failed in the same flush -- never lost, even though it never reached Redis before."""
    h = layer.handler()
    rid = h.persist_record({"a": 1}, source=0)
    with h.processing(rid):
        h.emit()
        raise FailRecord("no")
    h.flush()
    s = layer.stats()
    assert (s.persisted, s.failed_explicit, s.replayed, s.pending) == (1, 1, 1, 1)
    assert len(layer.claim_replays(0, 5)) == 1


def test_fail_unknown_id_is_an_orphan_not_an_error(layer: FTLayer) -> None:
    assert layer.fail([RecordId(99, 1)]) == (0, 0, 1)


def test_records_complete_inside_one_task_cost_no_redis_state(layer: FTLayer) -> None:
    """Invariant 1: a record complete at flush needs nothing stored."""
    h = layer.handler()
    for i in range(100):
        rid = h.persist_record(i, source=0)
        with h.processing(rid):
            h.ack(h.emit())
    result = h.flush()
    s = layer.stats()
    assert (s.persisted, s.completed, s.completed_local, s.pending) == (100, 100, 100, 0)
    assert result.calls == 1 and layer.acker.size() == 0
    # nothing but counters in Redis (and the flush's idempotency token, which expires):
    # no frame, history, timeout or queue entry
    ns = layer.config.namespace
    keys = {k.decode() for k in layer.client.scan_iter(match=f"*{ns}*")}
    tokens = {k for k in keys if ":flush:" in k}
    assert all(0 < layer.client.pttl(k) <= FLUSH_TOKEN_TTL_MS for k in tokens)
    assert all(k.endswith((":stats", ":settings")) for k in keys - tokens), sorted(keys)


def test_dead_letter_entries_are_msgpack_only(make_layer) -> None:
    """Invariant 9: what sits in Redis is msgpack (and frames), never pickle."""
    layer = make_layer(max_replays=0)
    h = layer.handler()
    rid = h.persist_record({"k": "v"}, source=0)
    h.flush()
    layer.fail([rid], error="x")
    shard = layer.keyspace[shard_of(rid.source_id, layer.config.shards)]
    [raw] = layer.client.hvals(shard.dlq)
    frame, hist, _when = msgpack.unpackb(raw, raw=True)
    f = decode_stored(frame, rid.source_id)  # the record's stored form (its payload msgpack)
    assert f.decode() == {"k": "v"} and hist[0][0] == b"explicit"


def test_each_record_carries_its_own_replay_budget(redis_client) -> None:
    """A record persisted by a pipeline with max_replays=0 is dead-lettered at its first
    failure, whatever the config of whoever fails it (another layer, a sidecar)."""
    import uuid

    from ftlayer import FTConfig

    ns = f"budget{uuid.uuid4().hex[:6]}"
    strict = FTLayer(redis_client, FTConfig(namespace=ns, max_replays=0))
    lenient = FTLayer(redis_client, FTConfig(namespace=ns, max_replays=5))
    h = strict.handler()
    a, b = h.persist_record("a", source=0), h.persist_record("b", source=0)
    h.flush()
    assert lenient.fail([a]) == (0, 1, 0)  # the record's budget (0), not lenient's (5)
    assert lenient.fail([b]) == (0, 1, 0)
    [dl, _] = strict.persistence.dead_letters()
    assert dl.frame.max_replays == 0
    h = lenient.handler()
    c = h.persist_record("c", source=0)
    h.flush()
    assert strict.fail([c]) == (1, 0, 0)  # the record's budget (5) allows a replay
    [claimed] = strict.claim_replays(0, 5)
    assert claimed.frame.max_replays == 5
    strict.clear()


def test_a_dead_letter_before_a_replay_in_one_bucket_does_not_move_the_replay(
    layer: FTLayer,
) -> None:
    """A segment's residues get ids in shared buckets, in row order; one dead-lettered at
    settlement never takes its slot. Catches: the bucket's entries written without the
    empty slots before a replay's (found by a keyed pipeline: a row with a bad key, then
    a failed row, in one segment), so the replay's entry sits in another slot, its claim
    finds nothing there ("vanished") and the record stays pending for ever."""
    import numpy as np
    import pyarrow as pa

    from ftlayer.limits import DEAD_NOW
    from ftlayer.lineage import LINEAGE_META
    from ftlayer.segments import frames_of_rows

    store, cfg = layer.segments, layer.config
    shard = store.shard_of_partition(0)
    token = store.new_token(shard)
    member = store.member(0, "b1", 0, token)
    table = pa.table({"id": [1, 2, 3, 4]}, metadata={LINEAGE_META: b"seed:7"})
    store.put(0, member, b"segment", token, b"", 7, store.batch_prefix(0, "b1"))
    frames = frames_of_rows(table, np.arange(4), shard=shard, source=0, partition=0,
                            max_replays=3, max_payload=cfg.max_record_bytes)  # fmt: skip
    fails = [(frames[0], "bad key", 1 | DEAD_NOW), (frames[1], "no key", 1 | DEAD_NOW),
             (frames[2], "failed once", 1), (frames[3], "failed once", 1)]  # fmt: skip
    tally = store.settle(shard, [(member, 4, fails, [], 0)], [], salt=7)
    assert (tally.segments, tally.completed, tally.replayed, tally.dead_lettered) == (1, 0, 2, 2)
    assert sorted(tally.dead_ids) == sorted(int.from_bytes(f[:8], "big") for f in frames[:2])
    # each row keeps its own error (a segment sends each distinct text once)
    errors = {d.source_id: d.history[-1].error for d in layer.persistence.dead_letters()}
    assert errors == {int.from_bytes(frames[0][:8], "big"): "bad key",
                      int.from_bytes(frames[1][:8], "big"): "no key"}
    again = store.settle(shard, [(member, 4, fails, [], 0)], [], salt=7)
    assert again.skipped == 1 and again.skipped_members == [member] and not again.dead_ids
    claimed = layer.claim_replays(0, 10)
    assert sorted(c.frame.decode()["id"] for c in claimed) == [3, 4]
    assert layer.stats().replays_claimed == 2


def test_a_replay_whose_record_was_evicted_is_counted_as_vanished(layer: FTLayer) -> None:
    """A queued replay whose bucket was deleted behind ftlayer's back (an eviction under a
    maxmemory policy other than noeviction, a stray DEL) cannot replay. Catches: the loss
    left visible only as a raw counter in Redis -- FTStats, ``ftlayer counters`` and the
    sidecar's metrics and status page must show it; the record stays pending (never
    counted as done)."""
    h = layer.handler()
    rid = h.persist_record({"x": 1}, source=0)
    h.flush()
    assert layer.fail([rid], error="once") == (1, 0, 0)
    for shard in layer.keyspace.shards:  # the record's bucket, entries and frames, gone
        for key in [*layer.client.scan_iter(match=shard.buckets_pattern),
                    *layer.client.scan_iter(match=f"{shard.prefix}:f:*")]:  # fmt: skip
            layer.client.delete(key)
    assert layer.claim_replays(0, 10) == []
    st = layer.stats()
    assert st.replays_vanished == 1 and st.replays_claimed == 0 and st.pending == 1


def test_claims_in_many_calls_hand_each_record_the_id_it_was_inited_with(make_layer) -> None:
    """A claim of thousands of replays over two shards is made in several calls (one
    thread calls while the other decodes), and a bucket of queued replays vanished behind
    ftlayer's back. Catches: a record handed out with another current id than the one its
    claim inited it with (records after a vanished one shifted onto their neighbour's id,
    or a call's ids paired with another call's reply): acking them would not complete
    them; and a record claimed twice or not at all."""
    import numpy as np

    layer = make_layer(shards=2, max_replays=3)
    h = layer.handler()
    src, cur = h.persist_many([b"\xc0"] * 6_000)
    h.flush()
    assert layer.fail([RecordId(s, c) for s, c in zip(src.tolist(), cur.tolist(), strict=True)],
                      error="once") == (6_000, 0, 0)  # fmt: skip
    shard = layer.keyspace.shards[0]
    gone = sorted(layer.client.scan_iter(match=shard.buckets_pattern))[0]
    lost = sum(1 for at in range(0, len(layer.client.get(gone)), 26))  # its slots: 128
    layer.client.delete(gone, gone.replace(b":b:", b":f:"))
    first = layer.claim_replays(0, 4_500)
    rest = layer.claim_replays(0, 10_000)
    claimed = first + rest
    assert len(claimed) == 6_000 - lost and len({c.record_id for c in claimed}) == len(claimed)
    sink = layer.handler()
    sink.ack_many(np.array([c.record_id[0] for c in claimed], np.uint64),
                  np.array([c.record_id[1] for c in claimed], np.uint64))  # fmt: skip
    sink.flush()
    st = layer.stats()
    assert st.completed == len(claimed) and st.replays_vanished == lost and st.pending == lost


def test_a_claim_hands_out_the_records_of_its_source_from_a_bucket_shared_with_another(
    make_layer,
) -> None:
    """Records of two sources failed together are requeued into the same fresh buckets,
    interleaved: a claim of one source finds its records' stored bytes with the other's in
    between (claim.lua copies runs of adjacent records; a run must end at a gap), and a
    partial claim leaves a run that starts mid-bucket for the next one."""
    layer = make_layer(shards=1)
    h = layer.handler()
    rids = [h.persist_record({"n": i, "pad": "x" * (i % 7)}, source=i % 2) for i in range(300)]
    h.flush()
    layer.fail(rids, error="first")
    first = layer.claim_replays(source=0, limit=40)
    rest = layer.claim_replays(source=0, limit=1000)
    other = layer.claim_replays(source=1, limit=1000)
    for claimed, want in ((first + rest, range(0, 300, 2)), (other, range(1, 300, 2))):
        assert [c.frame.decode() for c in claimed] == [{"n": i, "pad": "x" * (i % 7)} for i in want]
    assert len(first) == 40 and layer.stats().dead_lettered == 0


def test_a_replayed_record_that_completes_leaves_nothing_in_redis(make_layer) -> None:
    """A record's failure history lives in its bucket's histories hash and goes with the
    bucket's last entry. Catches: histories kept after their records completed (they were,
    in one shard-wide hash: memory growing with every replay that ever succeeded)."""
    layer = make_layer(shards=2)
    h = layer.handler()
    rids = [h.persist_record({"n": i}, source=0) for i in range(300)]
    h.flush()
    layer.fail(rids, error="first")
    claimed = layer.claim_replays(source=0, limit=1000)
    layer.fail([c.record_id for c in claimed[:100]], error="second")  # histories of two
    again = layer.claim_replays(source=0, limit=1000)
    assert [f.error for f in layer.persistence.history(again[0].record_id.source_id)] == [
        "first", "second"]  # fmt: skip
    assert len(layer.persistence.history(claimed[150].record_id.source_id)) == 1
    assert "h" in _kinds(layer)
    task = layer.handler()
    for c in claimed[100:] + again:
        task.ack(c.record_id)
    task.flush()
    st = layer.stats()
    assert st.pending == 0 and st.completed == 300
    assert _kinds(layer) & {"b", "f", "h"} == set()  # tokens and timeout sets expire


def _kinds(layer: FTLayer) -> set[str]:
    """The kinds of key the namespace holds (``b`` buckets, ``h`` histories, ...)."""
    keys = layer.client.scan_iter(match=layer.keyspace.pattern)
    return {k.decode().split("}:")[1].split(":")[0] for k in keys}


def test_a_records_lineage_id_survives_replays_dead_letters_and_redrives(make_layer) -> None:
    """A record persisted by a handler (``persist_record`` and ``persist_many``) gets its
    first source id as lineage id; every replay, the dead letter and its re-drive carry
    it, while the source id changes each time. Catches: a script that rebuilds a stored
    record without its lineage (the idempotent sinks would take a replay for a new
    record)."""
    layer = make_layer(max_replays=1)
    src = layer.handler()
    one = src.persist_record({"a": 1}, source=3)
    many, _ = src.persist_many([b"\x01", b"\x02"], source=3)
    src.flush()
    born = {one.source_id, *many.tolist()}
    current = [one, *(RecordId(int(s), 0) for s in many)]
    lineages = set()
    for _ in range(2):  # one replay each, then the dead letters
        layer.fail(current, error="boom")
        claimed = layer.claim_replays(3, 10)
        lineages |= {c.frame.lineage for c in claimed}
        current = [c.record_id for c in claimed]
    assert lineages == born, "each replay carries its record's first source id"
    letters = layer.persistence.dead_letters()
    assert {d.frame.lineage for d in letters} == born and len(letters) == 3
    assert layer.dlq_replay() == 3
    redriven = layer.claim_replays(3, 10)
    assert {c.frame.lineage for c in redriven} == born
    assert not born & {c.record_id.source_id for c in redriven}, "new ids, same lineage"


def test_a_failure_may_store_the_record_with_a_new_payload(make_layer) -> None:
    """A replay read back from its source that fails again is kept as its stage's input
    (wire.NEW_PAYLOAD): the record is requeued with the new payload, under the checksum
    of that payload, its hash code, partition, budget and lineage id kept, its history
    grown; past its budget its dead letter holds the new payload. Catches: the new
    payload ignored, a header field or the lineage id lost on the way, a checksum left
    from the old payload (the claim would reject the record as corrupt)."""
    from ftlayer.acker import ShardBatch

    layer = make_layer(shards=4, max_replays=2)
    src = layer.handler(partition=5)
    rid = src.persist(b"a reference", hash_code=-42, source=2)
    src.flush()
    layer.fail([rid], error="first")
    [claimed] = layer.claim_replays(2, 10)
    lineage = claimed.frame.lineage
    kept = b"the stage's input" * 3
    sid = claimed.record_id.source_id

    def fail(rid_: int, payload: bytes | None, token: str) -> None:
        batch = ShardBatch(fails=[(rid_, "explicit", "again", payload)])
        layer.acker.apply({shard_of(rid_, 4): batch}, token=token)

    fail(sid, kept, "t1")
    [again] = layer.claim_replays(2, 10)
    f = again.frame
    assert f.payload == kept, f
    assert (f.hash_code, again.original_partition, f.lineage) == (-42, 5, lineage)
    assert [h.error for h in layer.persistence.history(again.record_id.source_id)] == \
        ["first", "again"]
    fail(again.record_id.source_id, None, "t2")  # its own payload (the new one) from now on
    st = layer.stats()
    assert st.dead_lettered == 1 and st.pending == 0, st
    [dead] = layer.persistence.dead_letters()
    assert dead.frame is not None and dead.frame.payload == kept
    assert dead.frame.lineage == lineage
