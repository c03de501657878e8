"""What one task flush of 10,000 XORs costs against a real Redis.

A task acks 10,000 pending source records and emits one child under each (the
ack-and-emit of a task after a shuffle): its flush carries 10,000 combined deltas, one
per source id, split over the shards. Measured per flush: client time to fold and pack
(``pack_ms``), wall time of the pipelined script calls (``redis_wall_ms``), and the
server's own time for them from INFO commandstats (``redis_server_ms``). Beside it, in
the same run on the same server, the ceiling: 10,000 pipelined HSETs of 8-byte values.

    python -m benchmarks.flush_cost [--xors 10000] [--repeat 15] [--redis-url URL] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from benchmarks._common import machine, median, parse_args, redis_for_benchmark, save, script_usec
from ftlayer import FTConfig, FTHandler, FTLayer


def run(xors: int, repeat: int, url: str | None) -> dict[str, float | int | str]:
    pack, wall, server, ceiling = [], [], [], []
    with redis_for_benchmark(url) as client:
        layer = FTLayer(client, FTConfig(namespace=f"bench-{uuid.uuid4().hex[:6]}"))
        try:
            for _ in range(repeat):
                source = layer.handler()
                roots = [source.persist(b"\xa1x", hash_code=i, source=0) for i in range(xors)]
                source.flush()
                task = layer.handler()
                assert isinstance(task, FTHandler)
                t0 = time.perf_counter()
                for rid in roots:
                    task.emit(rid)
                    task.ack(rid)
                batches = task.pending_batches()
                t1 = time.perf_counter()
                calls0, usec0 = script_usec(client)
                result = layer.acker.apply(batches, token=os.urandom(12).hex())
                t2 = time.perf_counter()
                calls1, usec1 = script_usec(client)
                assert result.completed == 0 and calls1 - calls0 == result.calls
                pack.append((t1 - t0) * 1e3)
                wall.append((t2 - t1) * 1e3)
                server.append((usec1 - usec0) / 1e3)
                ceiling.append(_hset_ceiling(client, xors))
                layer.clear()
        finally:
            layer.clear()
    return {
        "xors": xors,
        "repeat": repeat,
        "shards": layer.config.shards,
        "pack_ms": round(median(pack), 2),
        "redis_wall_ms": round(median(wall), 2),
        "redis_server_ms": round(median(server), 2),
        "flush_total_ms": round(median([p + w for p, w in zip(pack, wall, strict=True)]), 2),
        "server_usec_per_xor": round(median(server) * 1e3 / xors, 3),
        "ceiling_hset_pipeline_ms": round(median(ceiling), 2),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }


def _hset_ceiling(client, n: int) -> float:
    key = f"bench-ceiling-{uuid.uuid4().hex}"
    vals = [os.urandom(8) for _ in range(n)]
    t0 = time.perf_counter()
    with client.pipeline(transaction=False) as pipe:
        for i, v in enumerate(vals):
            pipe.hset(key, i.to_bytes(8, "big"), v)
        pipe.execute()
    took = (time.perf_counter() - t0) * 1e3
    client.delete(key)
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xors", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--redis-url", default=None)
    args = parse_args(ap)
    result = run(args.xors, args.repeat, args.redis_url)
    save("flush_cost", result)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"one flush of {result['xors']} XORs ({result['shards']} shards), "
        f"median of {result['repeat']}"
    )
    for k in (
        "pack_ms",
        "redis_wall_ms",
        "redis_server_ms",
        "flush_total_ms",
        "server_usec_per_xor",
        "ceiling_hset_pipeline_ms",
    ):
        print(f"  {k:<26} {result[k]:>10}")


if __name__ == "__main__":
    main()
