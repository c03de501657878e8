"""Source ids come in buckets (docs/storage-layout.md): what the Lua scripts and the key
names rely on, checked on the ids themselves and on what Redis ends up holding."""

from __future__ import annotations

import os

from ftlayer import FTLayer
from ftlayer.ids import LOCAL_BIT, SourceIds, persisted_ids, shard_of
from ftlayer.limits import BUCKET_MAX_BYTES, BUCKET_SLOTS

SLOT = 0xFF << 16


def test_a_bucket_is_128_ids_that_differ_only_in_their_slot() -> None:
    ids = SourceIds()
    got = [ids.next(100) for _ in range(3 * BUCKET_SLOTS)]
    buckets = [got[i : i + BUCKET_SLOTS] for i in range(0, len(got), BUCKET_SLOTS)]
    for bucket in buckets:
        assert {i & ~SLOT for i in bucket} == {bucket[0] & ~SLOT}
        assert [(i & SLOT) >> 16 for i in bucket] == list(range(BUCKET_SLOTS))
    assert len({b[0] & ~SLOT for b in buckets}) == 3, "each bucket is new"
    assert all(i and not i & int(LOCAL_BIT) for i in got), "non-zero, bit 63 clear"


def test_a_bucket_closes_at_a_flush_and_at_its_byte_limit() -> None:
    ids = SourceIds()
    a = ids.next(10)
    ids.close()
    b = ids.next(10)
    assert a & ~SLOT != b & ~SLOT and (b & SLOT) == 0
    big = BUCKET_MAX_BYTES // 3 + 1
    c = [ids.next(big) for _ in range(4)]
    assert [(i & SLOT) >> 16 for i in c] == [1, 2, 0, 1], "the third would pass 1 MB"
    alone = ids.next(2 * BUCKET_MAX_BYTES)
    assert (alone & SLOT) == 0, "a record larger than the limit gets a bucket of its own"


def test_persisted_ids_stay_in_their_shard_and_share_buckets() -> None:
    got = persisted_ids([200] * 300, shard=5).tolist()
    assert all(shard_of(i, 8) == 5 % 8 and (i & 0xFFFF) == 5 for i in got)
    assert len({i & ~SLOT for i in got}) == 3  # 128 + 128 + 44


def test_a_forked_child_never_continues_its_parents_bucket() -> None:
    ids = SourceIds()
    first = ids.next()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next id must open a new bucket
        os.write(w, ids.next().to_bytes(8, "big"))
        os._exit(0)
    os.waitpid(pid, 0)
    child = int.from_bytes(os.read(r, 8), "big")
    parent = ids.next()
    assert parent & ~SLOT == first & ~SLOT and (parent & SLOT) >> 16 == 1
    assert child & ~SLOT != first & ~SLOT


def test_one_flush_writes_one_bucket_and_its_frames(layer: FTLayer) -> None:
    """A handler's records share buckets (one entries string, one frames string each) and
    a replay goes to a fresh bucket of the same shard; completing them all leaves no key."""
    h = layer.handler()
    rids = [h.persist_record({"i": i}, source=0) for i in range(200)]
    h.flush()
    client, shards = layer.client, layer.config.shards
    keys = {layer.keyspace[shard_of(r.source_id, shards)].bucket(r.source_id)[:2] for r in rids}
    assert len(keys) == 2 and all(client.exists(k) and client.exists(f) for k, f in keys)
    assert layer.fail([rids[0]]) == (1, 0, 0)
    [claimed] = layer.claim_replays(0, 10)
    new = claimed.record_id.source_id
    assert shard_of(new, shards) == shard_of(rids[0].source_id, shards)
    assert new & ~SLOT not in {r.source_id & ~SLOT for r in rids}, "a fresh bucket"
    assert layer.persistence.get(new) is not None and layer.persistence.get(new).source_id == new
    sink = layer.handler()
    for r in [claimed.record_id, *rids[1:]]:
        sink.ack(r)
    assert sink.flush().completed == 200
    assert not list(client.scan_iter(match=layer.keyspace.pattern.replace("*", "*:[bf]:*")))


def test_persisted_ids_of_large_records_close_buckets_at_the_byte_limit() -> None:
    """Catches: the array path used for records whose 128 frames pass BUCKET_MAX_BYTES
    (a bucket's frames string would pass what one call may write)."""
    big = BUCKET_MAX_BYTES // 3 + 1
    got = persisted_ids([10, big, big, big, 10]).tolist()
    assert [(i & SLOT) >> 16 for i in got] == [0, 1, 2, 0, 1]
    small = persisted_ids([100] * (2 * BUCKET_SLOTS + 1)).tolist()
    assert [(i & SLOT) >> 16 for i in small] == [*range(BUCKET_SLOTS)] * 2 + [0]
    assert len({i & ~SLOT for i in small}) == 3 and len(set(small)) == len(small)
    assert all(i and not i & int(LOCAL_BIT) for i in small), "non-zero, bit 63 clear"
    assert len({i & 0xFFFF for i in small}) == 3, "random low bits (shard) per bucket"
