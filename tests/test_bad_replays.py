"""One bad replay must not strand a whole claim.

``claim.lua`` pops and re-inits every claimed record in one call; a record whose frame no
longer decodes (corrupt bytes, or larger than ``max_record_bytes``) must be dead-lettered
on its own with its error and raw bytes, the others delivered, and ``ftlayer dlq list``
must show it instead of failing."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from ftlayer import FTLayer, RecordError
from serialization import encode_payload
from tests.faults import corrupt_stored_frame, stored_ids
from tests.toolkit import cli


def test_a_corrupt_and_an_oversized_replay_are_dead_lettered_alone(
    make_layer, redis_url: str
) -> None:
    """On one server, on the 3-master cluster and on Redis 7's functions (make_layer is
    parametrized)."""
    layer = make_layer(max_record_bytes=1000, shards=1)
    url = redis_url
    h = layer.handler()
    rids = [h.persist_record({"n": i, "pad": "x" * (600 if i == 3 else 10)}, source=0)
            for i in range(6)]  # fmt: skip
    h.flush()
    layer.fail(rids, error="first attempt")  # all six wait in the replay queue
    queued = stored_ids(layer)
    assert len(queued) == 6
    by_n = {layer.persistence.get(src).decode()["n"]: src for src in queued}  # type: ignore[union-attr]
    corrupt = by_n[1]
    corrupt_stored_frame(layer, corrupt, -1)  # payload bytes no longer match their checksum

    # a claimer whose max_record_bytes shrank since record 3 was persisted
    small = FTLayer(layer.client, replace(layer.config, max_record_bytes=300))
    claimed = small.claim_replays(source=0, limit=100)
    assert sorted(c.frame.decode()["n"] for c in claimed) == [0, 2, 4, 5]
    st = layer.stats()
    assert st.dead_lettered == 2 and st.pending == 4 and st.queued_replays == 0

    dead = {d.source_id: d for d in small.persistence.dead_letters()}
    assert set(dead) == {corrupt, by_n[3]}
    for d in dead.values():
        assert d.frame is None and d.raw and d.frame_error
        assert "undecodable replay frame" in d.history[-1].error
    assert "checksum" in dead[corrupt].frame_error.lower()  # type: ignore[union-attr]
    assert len(dead[by_n[3]].raw) > 600

    out = cli("dlq", "list", "--json", "--redis-url", url, "--namespace",
              layer.config.namespace, "--shards", "1")  # fmt: skip
    assert out.returncode == 0, out.stderr
    listed = {d["id"]: d for d in json.loads(out.stdout)}
    assert set(listed) == {f"{s:016x}" for s in dead}
    assert all(d["attempts"] == 2 for d in listed.values())
    assert "checksum" in listed[f"{corrupt:016x}"]["frame_error"].lower()
    assert listed[f"{by_n[3]:016x}"]["payload_bytes"] > 600  # decodes under the CLI's limit


def test_a_source_record_that_cannot_enter_is_a_dead_letter_with_its_bytes(make_layer) -> None:
    """Rejected rows are dead letters, not log lines: ``FTHandler.reject`` (what the
    ``ack_scope="task"`` source does with a row that does not encode or is too large)
    stores the bytes and dead-letters them in the task's one flush, budget 0, nothing
    else touched; a retried flush does it once."""
    layer = make_layer(max_record_bytes=100, max_replays=3)
    h = layer.handler()
    big = {"id": 7, "pad": "y" * 300}
    payload = encode_payload(big)
    with pytest.raises(RecordError, match="exceeds max_record_bytes=100"):
        h.persist(payload, source=0)
    h.reject(payload, "rejected: too large", hash_code=5, source=0, partition=2)
    h.reject(encode_payload("{'id': 8, 'xs': [Decimal('1.50')]}"), "rejected: no msgpack")
    ok = h.persist_record({"id": 9}, source=0)
    res = h.flush()
    assert res.dead_lettered == 2
    st = layer.stats()
    assert (st.dead_letters, st.pending, st.replayed, st.queued_replays) == (2, 1, 0, 0)
    assert layer.persistence.get(ok.source_id) is not None
    dead = sorted(layer.persistence.dead_letters(), key=lambda d: len(d.raw))
    assert [d.history[0].error for d in dead] == ["rejected: no msgpack", "rejected: too large"]
    assert dead[0].frame is not None and "Decimal" in dead[0].frame.decode()
    # larger than max_record_bytes: kept whole as raw bytes, its frame error says why
    assert dead[1].frame is None and "exceeds the limit" in (dead[1].frame_error or "")
    assert payload in dead[1].raw and all(len(d.history) == 1 for d in dead)
