"""The replay stream's claims (lua/claim.lua modes ``stream`` and ``read``, through
RedisPersistenceLayer.claim_stream / read_stream / release_stream), on every backend: a
claim is fixed by its token, read back under the ids it inited, and what its batch
settled is gone from it."""

from __future__ import annotations

import numpy as np

from ftlayer.persistence import stream_ids


def _queue(layer, n: int) -> list:
    src = layer.handler(partition=1)
    ids = [src.persist_record({"i": i}, hash_code=i, source=3) for i in range(n)]
    src.flush()
    layer.fail(ids, error="first try")
    return ids


def test_a_token_claims_once_and_is_read_back_under_its_ids(make_layer) -> None:
    """Catches: a token claiming twice (a driver asking again after a crash would take
    more records and strand the first), a reread under other current ids (its completion
    would not zero the record: pending for ever), a reread popping records, completed or
    failed records coming back in a re-run, an empty claim blocking later claims."""
    layer = make_layer(shards=4, timeout_s=30)
    assert layer.persistence.claim_stream(3, "rs:a:1", 100) == {}  # nothing queued yet
    _queue(layer, 40)
    got = layer.persistence.claim_stream(3, "rs:a:1", 25)  # the empty claim blocked nothing
    assert sum(got.values()) == 25
    again = layer.persistence.claim_stream(3, "rs:a:1", 25)  # asked again: the same ones
    assert again == got and layer.stats().queued_replays == 15
    records = {k: layer.persistence.read_stream(3, "rs:a:1", k) for k in got}
    for k, recs in records.items():
        assert len(recs) == got[k]
        cur = stream_ids("rs:a:1", k, len(recs))
        assert [r.record_id[1] for r in recs] == cur.tolist()
        assert layer.persistence.read_stream(3, "rs:a:1", k) == recs  # a task retried
        assert {r.frame.decode()["i"] for r in recs} <= set(range(40))
    assert layer.stats().queued_replays == 15, "reading popped nothing"
    flat = [r for recs in records.values() for r in recs]
    done, failed = flat[:10], flat[10:12]
    sink = layer.handler()
    sink.ack_many(np.array([r.record_id[0] for r in done], np.uint64),
                  np.array([r.record_id[1] for r in done], np.uint64))  # fmt: skip
    sink.flush()
    layer.fail([r.record_id for r in failed], error="second try")
    left = {r.record_id for k in got for r in layer.persistence.read_stream(3, "rs:a:1", k)}
    assert left == {r.record_id for r in flat[12:]}, "a re-run reads only what is unsettled"
    st = layer.stats()
    assert st.completed == 10 and st.queued_replays == 17  # 15 + the two failed again
    other = layer.persistence.claim_stream(3, "rs:a:2", 100)  # the next offset
    assert sum(other.values()) == 17
    layer.persistence.open_stream(3, "rs:a:1")
    layer.persistence.open_stream(3, "rs:a:2")
    open_ids = set(layer.persistence.stream_claimed(3))
    assert {r.record_id[0] for r in flat[12:]} <= open_ids  # what a batch keeps alive
    # what a batch kept by reference reads: every open claim's unsettled records, once each
    second = [r for k in other for r in layer.persistence.read_stream(3, "rs:a:2", k)]
    batch = layer.persistence.read_open_streams(3)
    assert sorted(r.record_id for r in batch) == sorted(
        [r.record_id for r in flat[12:]] + [r.record_id for r in second])
    layer.persistence.release_stream(3, ["rs:a:1", "rs:a:2"])
    assert layer.persistence.stream_claimed(3) == []
    assert layer.persistence.read_open_streams(3) == []
    layer.persistence.open_stream(3, "rs:old:9")  # a run whose checkpoint is gone
    layer.persistence.open_stream(3, "rs:new:1")
    layer.persistence.forget_stream(3, keep="rs:new:")  # the new run's first commit
    assert layer.client.smembers(layer.keyspace.stream_claims(3)) == {b"rs:new:1"}
    layer.persistence.release_stream(3, ["rs:new:1"])
    assert layer.persistence.stream_claimed(3) == []
    assert all(layer.persistence.read_stream(3, "rs:a:1", k) == [] for k in range(4))
    assert layer.stats().pending == 40 - 10  # released claims stay pending: they time out
