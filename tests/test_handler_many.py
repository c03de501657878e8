"""The handler's numpy APIs (``emit_many``, ``ack_many``, ``fail_many``) against the
per-record ones, on a real Redis (single server and the 3-master cluster): the same events
give the same outcome, record by record."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer import FTLayer, FTLayerError, RecordError, RecordId
from ftlayer.ids import xor_fold
from tests.faults import stored_ids


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 2**64 - 1)), max_size=40))
def test_xor_fold_is_the_per_source_xor(events: list[tuple[int, int]]) -> None:
    """Catches: a fold that drops the first or last group, or sums instead of XORs."""
    want: dict[int, int] = {}
    for s, v in events:
        want[s] = want.get(s, 0) ^ v
    src = np.array([s for s, _ in events], np.uint64)
    val = np.array([v for _, v in events], np.uint64)
    got_s, got_v = xor_fold(src, val)
    assert dict(zip(got_s.tolist(), got_v.tolist(), strict=True)) == want


def _persisted(layer: FTLayer, n: int) -> list[RecordId]:
    h = layer.handler()
    rids = [h.persist_record({"n": i}, source=0) for i in range(n)]
    h.flush()
    return rids


def test_a_hop_of_numpy_calls_completes_what_per_record_calls_would(make_layer) -> None:
    """Catches: numpy events not folded with the per-record ones of the same handler,
    int64 ids (a Spark column) read as other ids, events sent twice across flushes, and a
    partial ack completing records it did not touch."""
    layer = make_layer()
    rids = _persisted(layer, 400)
    src = np.array([r[0] for r in rids], np.uint64)
    cur = np.array([r[1] for r in rids], np.uint64)

    hop = layer.handler()  # half per record, half with numpy; children per input: 1
    children: list[tuple[int, int]] = []
    for r in rids[:200]:
        children.append(tuple(hop.emit(anchor=r)))  # type: ignore[arg-type]
        hop.ack(r)
    kid = hop.emit_many(src[200:].view(np.int64))  # an int64 column, as Spark hands it
    hop.ack_many(src[200:].view(np.int64), cur[200:].view(np.int64))
    children += list(zip(src[200:].tolist(), kid.tolist(), strict=True))
    hop.flush()
    hop.flush()  # nothing left: a second flush sends nothing again
    assert layer.stats().pending == 400

    sink = layer.handler()
    done = np.array(children[:300], np.uint64)
    sink.ack_many(done[:, 0], done[:, 1])
    sink.flush()
    st_ = layer.stats()
    assert st_.completed == 300 and st_.pending == 100
    left = {s for s, _ in children[300:]}
    assert set(stored_ids(layer)) == left


def test_fail_many_replays_and_bad_shapes_are_refused(make_layer) -> None:
    """Catches: fail_many acking instead of failing, and mismatched arrays accepted (the
    XORs would pair the wrong ids)."""
    layer = make_layer(max_replays=2)
    rids = _persisted(layer, 50)
    h = layer.handler()
    with pytest.raises(FTLayerError, match="ack_many"):
        h.ack_many(np.zeros(3, np.uint64), np.zeros(2, np.uint64))
    h.fail_many(np.array([r[0] for r in rids[:10]], np.uint64), error="bad batch")
    with pytest.raises(TypeError, match="uint64 or int64"):  # big ints made float64
        h.ack_many(np.array([r[0] for r in rids[10:]]), np.array([r[1] for r in rids[10:]]))
    h.ack_many(np.array([r[0] for r in rids[10:]], np.uint64),
               np.array([r[1] for r in rids[10:]], np.uint64))  # fmt: skip
    h.flush()
    st_ = layer.stats()
    assert st_.completed == 40 and st_.replayed == 10 and st_.queued_replays == 10


def test_persist_many_stores_what_persist_would(make_layer) -> None:
    """Catches: frames stored with other fields than per-record persist's, records that
    completed inside the task stored anyway (or counted as pending), a failed record of
    the block acked instead of replayed, block ids mixed up with the plain XORs, and a
    block sent in another call than the failures of the same shard (one shard here)."""
    layer = make_layer(max_replays=2, shards=1)
    h = layer.handler(partition=3)
    one = h.persist(msgpack.packb({"one": 1}), hash_code=-5, source=1)
    payloads = [msgpack.packb({"i": i}) for i in range(300)]
    src, cur = h.persist_many(payloads, hash_codes=np.arange(300) - 150, source=1)
    h.ack_many(src[:20], cur[:20])  # complete inside the task: never stored
    h.fail_many(src[20:30], error="bad batch")  # stored, then failed by the same call
    kids = h.emit_many(src[30:])  # a child each, the input acked: pending on the child
    h.ack_many(src[30:], cur[30:])
    h.flush()
    st_ = layer.stats()
    assert (st_.persisted, st_.completed_local, st_.replayed, st_.pending) == (301, 20, 10, 281)
    for i in (30, 299):
        f = layer.persistence.get(int(src[i]))
        assert f is not None and (f.payload, f.hash_code, f.source) == (payloads[i], i - 150, 1)
        assert (f.partition, f.max_replays, f.source_id) == (3, 2, int(src[i]))
    assert set(stored_ids(layer)) >= {int(s) for s in src[30:]} | {one.source_id}

    sink = layer.handler()
    sink.ack_many(src[30:], kids)
    sink.ack(one)
    sink.flush()
    st_ = layer.stats()
    assert st_.completed == 20 + 270 + 1 and st_.pending == st_.queued_replays == 10


def test_persist_many_in_chunks_and_on_many_flushes(make_layer) -> None:
    """Catches: a block cut inside a record when a flush needs several calls, and a
    record persisted twice (or a block forgotten) across flushes."""
    layer = make_layer(flush_chunk_bytes=4096, shards=2)
    h = layer.handler()
    a = h.persist_many([b"\xc4\x64" + bytes(100)] * 500)
    h.flush()
    b = h.persist_many([b"\xc0"] * 10)
    assert layer.stats().pending == 500
    h.flush()
    assert layer.stats().pending == 510 and h.flush().calls == 0
    sink = layer.handler()
    sink.ack_many(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    sink.flush()
    st_ = layer.stats()
    assert st_.completed == 510 and st_.pending == 0


def test_persist_many_refuses_a_bad_record_by_its_index(make_layer) -> None:
    """Catches: a bad record stored, or its block half registered."""
    layer = make_layer(max_record_bytes=50)
    h = layer.handler()
    with pytest.raises(RecordError, match="payload 2 must be msgpack bytes, not str"):
        h.persist_many([b"\xc0", b"\xc0", "text"])
    with pytest.raises(RecordError, match=r"persist_many: record 1 \(51 bytes.*limit of 50"):
        h.persist_many([b"\xc0", b"x" * 51])
    with pytest.raises(RecordError, match="record 0 .* hash_code that is not int32"):
        h.persist_many([b"\xc0"], hash_codes=2**31)
    src, _ = h.persist_many([bytearray(b"\xc0")])
    assert h.pending_sources == 1 and len(src) == 1
    h.flush()
    assert layer.stats().persisted == 1
