"""Redis bytes per pending record of candidate storage layouts, at N pending records.

Each candidate is filled directly (pipelined writes of random ids, 26-byte ack entries
and frames of a 48-byte header + a 100-byte payload, 8 shards, one deadline) into an
empty database, and measured by INFO ``used_memory`` before/after and by the sum of
``MEMORY USAGE`` of its keys; the database is flushed between candidates, so run it on a
server of its own (the default: an embedded one). The table of results is kept in
docs/storage-layout.md; ``benchmarks.pending_memory`` measures the layout ftlayer uses,
through its real write path.

    python -m benchmarks.layout_candidates [--records 1000000] [--redis-url URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import redis

from benchmarks._common import machine, parse_args, redis_for_benchmark, save

PAYLOAD = b"\xc4\x62" + b"p" * 98  # msgpack bin8 of 98 bytes: 100 bytes in all
ENTRY, HEADER, SHARDS, SLOTS = 26, 48, 8, 128


def _ids(n: int) -> list[bytes]:
    raw = os.urandom(8 * n)
    return [raw[i : i + 8] for i in range(0, 8 * n, 8)]


def per_record_hashes(r: redis.Redis, n: int) -> None:
    """ftlayer <= 0.1: an acks hash (id -> entry), a rec hash (id -> frame) and a timeout
    set (of ids), each per shard: three hash-table entries per record."""
    for first in range(0, n, 1000):
        pipe = r.pipeline(transaction=False)
        ids = _ids(min(1000, n - first))
        for k in range(SHARDS):
            part = ids[k::SHARDS]
            pipe.hset(f"acks:{k}", mapping={i: os.urandom(ENTRY) for i in part})
            pipe.hset(f"rec:{k}", mapping={i: os.urandom(HEADER) + PAYLOAD for i in part})
            pipe.sadd(f"tmo:{k}", *part)
        pipe.execute()


def one_entry_per_record(r: redis.Redis, n: int) -> None:
    """Entry and frame in one value of one hash per shard; a timeout set of ids."""
    for first in range(0, n, 1000):
        pipe = r.pipeline(transaction=False)
        ids = _ids(min(1000, n - first))
        for k in range(SHARDS):
            part = ids[k::SHARDS]
            pipe.hset(f"rec:{k}", mapping={i: os.urandom(ENTRY + HEADER) + PAYLOAD for i in part})
            pipe.sadd(f"tmo:{k}", *part)
        pipe.execute()


def _buckets(r: redis.Redis, n: int, inline: bool, entries_string: bool = False) -> None:
    pipe = r.pipeline(transaction=False)
    for first in range(0, n, SLOTS):
        key = f"b:{os.urandom(7).hex()}"
        rows = range(min(SLOTS, n - first))
        if entries_string:
            pipe.set(key, os.urandom(ENTRY * len(rows)))
            pipe.set(f"f:{key[2:]}", b"".join(os.urandom(HEADER) + PAYLOAD for _ in rows))
        elif inline:
            pipe.hset(key, mapping={s: os.urandom(ENTRY + HEADER) + PAYLOAD for s in rows})
        else:
            pipe.hset(key, mapping={s: os.urandom(ENTRY) for s in rows})
            pipe.set(f"f:{key[2:]}", b"".join(os.urandom(HEADER) + PAYLOAD for _ in rows))
        pipe.sadd(f"t:{first // SLOTS % SHARDS}", key)
        if len(pipe) >= 3000:
            pipe.execute()
    pipe.execute()


def buckets(r: redis.Redis, n: int) -> None:
    """Ids persisted together share a bucket of up to 128 slots; a small hash of slot ->
    entry (a listpack), the bucket's frames as one string, timeout sets of bucket keys."""
    _buckets(r, n, inline=False)


def buckets_entries_string(r: redis.Redis, n: int) -> None:
    """ftlayer now: buckets as above, their entries one string of 26 bytes a slot."""
    _buckets(r, n, inline=False, entries_string=True)


def buckets_inline(r: redis.Redis, n: int) -> None:
    """Buckets holding entry + frame per slot: a listpack only if the server's
    hash-max-listpack-value is raised above the frame size (set here to 512)."""
    r.config_set("hash-max-ziplist-value", 512)  # the 6.2 name; 7.x takes it as an alias
    try:
        _buckets(r, n, inline=True)
    finally:
        r.config_set("hash-max-ziplist-value", 64)


CANDIDATES: dict[str, Callable[[redis.Redis, int], None]] = {
    "per-record hashes (before)": per_record_hashes,
    "one hash entry per record": one_entry_per_record,
    "buckets: listpack entries + frames string": buckets,
    "buckets: entries string + frames string (now)": buckets_entries_string,
    "buckets, frames inline (hash-max-listpack-value 512)": buckets_inline,
}


def measure(r: redis.Redis, n: int, fill: Callable[[redis.Redis, int], None]) -> dict[str, Any]:
    r.flushdb()
    mem0 = int(r.info("memory")["used_memory"])
    t0 = time.perf_counter()
    fill(r, n)
    seconds = time.perf_counter() - t0
    mem1 = int(r.info("memory")["used_memory"])
    usage = keys = 0
    encodings: dict[str, int] = {}
    for key in r.scan_iter(count=1000):
        usage += int(r.memory_usage(key, samples=0) or 0)
        enc = r.object("encoding", key)
        enc = enc.decode() if isinstance(enc, bytes) else str(enc)
        encodings[enc] = encodings.get(enc, 0) + 1
        keys += 1
    r.flushdb()
    return {
        "bytes_per_pending_beyond_payload": round((mem1 - mem0) / n - len(PAYLOAD), 1),
        "memory_usage_beyond_payload": round(usage / n - len(PAYLOAD), 1),
        "keys": keys,
        "encodings": encodings,
        "fill_s": round(seconds, 1),
    }


def run(records: int, url: str | None) -> dict[str, Any]:
    with redis_for_benchmark(url) as r:
        info = {**r.info("server"), **r.info("memory")}
        results = {name: measure(r, records, fill) for name, fill in CANDIDATES.items()}
    return {
        "records": records,
        "payload_bytes": len(PAYLOAD),
        "entry_bytes": ENTRY,
        "frame_header_bytes": HEADER,
        "candidates": results,
        "redis": info.get("redis_version"),
        "mem_allocator": info.get("mem_allocator", "?"),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--redis-url", default=None, help="a server of its own: it is FLUSHDBed")
    args = parse_args(ap)
    result = run(args.records, args.redis_url)
    save("layout_candidates", result)
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['records']:,} pending records, {result['payload_bytes']}-byte payloads "
          f"(Redis {result['redis']}, {result['mem_allocator']})")  # fmt: skip
    print(f"  {'candidate':<55} {'INFO B/rec':>10} {'MEMORY B/rec':>12}  encodings")
    for name, c in result["candidates"].items():
        print(f"  {name:<55} {c['bytes_per_pending_beyond_payload']:>10} "
              f"{c['memory_usage_beyond_payload']:>12}  {c['encodings']}")  # fmt: skip


if __name__ == "__main__":
    main()
