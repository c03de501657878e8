"""Source ids come in buckets (docs/storage-layout.md): what the Lua scripts and the key
names rely on, checked on the ids themselves and on what Redis ends up holding."""

from __future__ import annotations

import os

import numpy as np

from ftlayer import FTLayer
from ftlayer.ids import LOCAL_BIT, SourceIds, bucket_starts, persisted_ids, shard_of
from ftlayer.limits import (
    BUCKET_MAX_BYTES,
    BUCKET_SLOTS,
    STRING_OVERHEAD,
    bucket_bytes,
    size_class_floor,
)

SLOT = 0xFF << 16


def test_a_bucket_is_128_ids_that_differ_only_in_their_slot() -> None:
    ids = SourceIds()
    got = [ids.next(127) for _ in range(3 * BUCKET_SLOTS)]  # 128 fit a 16 KB class
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
    assert [(i & SLOT) >> 16 for i in c] == [0, 1, 0, 1], "a third would pass 1 MB's class"
    alone = ids.next(2 * BUCKET_MAX_BYTES)
    assert (alone & SLOT) == 0, "a record larger than the limit gets a bucket of its own"


def test_size_class_floor_is_jemallocs_class_at_or_below() -> None:
    """jemalloc's classes (64 bytes up): four per doubling, a quarter of it apart."""
    classes = [c for k in range(6, 21) for c in range(1 << k, 2 << k, 1 << (k - 2))]
    assert classes[:8] == [64, 80, 96, 112, 128, 160, 192, 224]
    assert {16384, 20480, 14336, 917504, 1 << 20} <= set(classes)
    for c, above in zip(classes, classes[1:], strict=False):
        assert size_class_floor(c) == c and size_class_floor(above - 1) == c


def test_a_bucket_of_uniform_records_fills_the_size_class_just_below_its_slots() -> None:
    """Catches: 128 frames of 128 bytes (100-byte payloads) in one string of 16,384 bytes
    plus its sds header, which jemalloc (Redis 7 on Debian) allocates 20 KB for: 32 bytes a
    record of nothing. A bucket stops before its frames string passes the class below."""
    for size in (28, 29, 100, 127, 128, 129, 200, 1000, 10_000, 100_000):
        ids = SourceIds()
        got = [ids.next(size) for _ in range(300)]
        per = next(j for j, i in enumerate(got) if j and (i & SLOT) == 0)
        frames = per * size + STRING_OVERHEAD
        cls = size_class_floor(bucket_bytes(size) + STRING_OVERHEAD)
        assert frames <= cls < frames + size, (size, per)  # fills it, less one record
        assert per >= min(BUCKET_SLOTS, BUCKET_MAX_BYTES // size) * 4 // 5, (size, per)
    ids = SourceIds()
    got = [ids.next(128) for _ in range(128)]
    assert [(i & SLOT) >> 16 for i in got] == [*range(127), 0], "127 frames: 16,256 bytes"


def test_persisted_ids_take_the_buckets_source_ids_would() -> None:
    """The array path (one step per bucket) and the one-by-one path agree on records of
    mixed sizes: the same slots, bucket for bucket."""
    rng = np.random.default_rng(7)
    sizes = np.concatenate([rng.integers(28, 400, 3000), [28] * 200, [5000] * 50,
                            rng.integers(28, 300_000, 40), [128] * 300])  # fmt: skip
    for sz in (sizes, np.full(1000, 128), np.full(5, 2 * BUCKET_MAX_BYTES), sizes[:1]):
        ids = SourceIds()
        one_by_one = [ids.next(int(s)) for s in sz]
        arrays = persisted_ids(sz).tolist()
        assert [(i & SLOT) >> 16 for i in arrays] == [(i & SLOT) >> 16 for i in one_by_one]
        starts = [j for j, i in enumerate(arrays) if (i & SLOT) == 0]
        assert bucket_starts(np.asarray(sz, np.int64)).tolist() == starts
        bases = [arrays[j] & ~SLOT for j in starts]
        assert len(set(bases)) == len(bases), "every bucket new"
        for j, i in enumerate(arrays):
            assert i & ~SLOT == arrays[max(s for s in starts if s <= j)] & ~SLOT
    assert persisted_ids([]).tolist() == []


def test_persisted_ids_stay_in_their_shard_and_share_buckets() -> None:
    got = persisted_ids([200] * 300, shard=5).tolist()
    assert all(shard_of(i, 8) == 5 % 8 and (i & 0xFFFF) == 5 for i in got)
    assert len({i & ~SLOT for i in got}) == 3  # 122 + 122 + 56: 24,400 bytes of a 24 KB class


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
    assert [(i & SLOT) >> 16 for i in got] == [0, 0, 1, 0, 1]
    small = persisted_ids([127] * (2 * BUCKET_SLOTS + 1)).tolist()
    assert [(i & SLOT) >> 16 for i in small] == [*range(BUCKET_SLOTS)] * 2 + [0]
    assert len({i & ~SLOT for i in small}) == 3 and len(set(small)) == len(small)
    assert all(i and not i & int(LOCAL_BIT) for i in small), "non-zero, bit 63 clear"
    assert len({i & 0xFFFF for i in small}) == 3, "random low bits (shard) per bucket"


def test_replays_fill_buckets_as_the_handler_does(layer: FTLayer) -> None:
    """lua/core/ids.lua's bucket_bytes is ftlayer.limits': records of 100-byte payloads
    (128-byte frames) failed together take their new buckets 127 at a time (16,256 bytes
    of frames, in a 16 KB class), as the handler's do, not 128 (16,390 bytes: 20 KB)."""
    h = layer.handler()
    payload = b"\xc4\x62" + b"p" * 98
    rids = [h.persist(payload, i, 0) for i in range(300)]
    h.flush()
    assert layer.fail(rids) == (300, 0, 0)
    claimed = layer.claim_replays(0, 1000)
    assert len(claimed) == 300
    per_bucket: dict[int, int] = {}
    for c in claimed:
        base = c.record_id.source_id & ~SLOT
        per_bucket[base] = per_bucket.get(base, 0) + 1
    assert bucket_bytes(128) // 128 == 127
    assert max(per_bucket.values()) == 127, per_bucket  # a bucket of 127 failed in one call
