"""Bad input gets a clear error naming the record; nothing else in the batch is lost."""

from __future__ import annotations

import pytest

from ftlayer import FTLayer, FTLayerError, RecordError
from serialization import ChecksumMismatchError, PayloadEncodeError
from tests.faults import corrupt_stored_frame


def test_oversized_record_is_refused_and_its_batch_goes_on(make_layer) -> None:
    layer = make_layer(max_record_bytes=100)
    h = layer.handler(partition=3)
    ok = h.persist_record("small", source=0)
    with pytest.raises(RecordError, match=r"record of \d+ bytes from source 1 .*partition=3"):
        h.persist(b"\xc5" + b"x" * 200, hash_code=5, source=1)
    h.flush()
    assert layer.persistence.get(ok.source_id) is not None
    assert layer.stats().persisted == 1


def test_unencodable_record(layer: FTLayer) -> None:
    with pytest.raises(PayloadEncodeError, match="set"):
        layer.handler().persist_record({1, 2}, source=0)


def test_wrong_payload_type_and_key_hash(layer: FTLayer) -> None:
    h = layer.handler()
    with pytest.raises(RecordError, match="payload must be msgpack bytes, not str"):
        h.persist("text", source=0)  # type: ignore[arg-type]
    with pytest.raises(RecordError, match="not int32"):
        h.persist(b"\x01", hash_code=2**40, source=0)


def test_unknown_source_index(layer: FTLayer) -> None:
    with pytest.raises(RecordError, match="source index 70000"):
        layer.handler().persist(b"\x01", source=70000)


def test_emit_without_anchor_and_unknown_reason(layer: FTLayer) -> None:
    h = layer.handler()
    with pytest.raises(FTLayerError, match="without an anchor"):
        h.emit()
    with pytest.raises(FTLayerError, match="reason"):
        h.fail(h.persist_record(1, source=0), reason="bored")


def test_corrupted_persisted_record_is_reported_not_dropped(layer: FTLayer) -> None:
    h = layer.handler()
    rid = h.persist_record({"payload": "x" * 20}, source=0)
    h.flush()
    raw = corrupt_stored_frame(layer, rid.source_id, -3)
    with pytest.raises(ChecksumMismatchError, match=f"src={rid.source_id:016x}"):
        layer.persistence.get(rid.source_id)
    assert layer.stats().pending == 1, "still pending: it will be failed, not acked"
    # failed (as its timeout would), then claimed: dead-lettered with its corrupt bytes
    assert layer.fail([rid], error="timed out") == (1, 0, 0)
    assert layer.claim_replays(0, 10) == []
    st = layer.stats()
    assert (st.pending, st.queued_replays, st.dead_letters) == (0, 0, 1)
    [dead] = layer.persistence.dead_letters()
    assert dead.frame is None and "checksum" in (dead.frame_error or "").lower()
    assert dead.raw == bytes(raw)  # the same bytes
    assert [f.error for f in dead.history][0] == "timed out"
