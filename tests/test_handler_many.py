"""The handler's numpy APIs (``emit_many``, ``ack_many``, ``fail_many``) against the
per-record ones, on a real Redis (single server and the 3-master cluster): the same events
give the same outcome, record by record."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer import FTLayer, FTLayerError, RecordId
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
