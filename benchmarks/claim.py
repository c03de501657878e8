"""Replays handed to source tasks: how fast the replay queue drains (lua/claim.lua).

Persists N records (100-byte payloads) through the real handler into a real Redis
(embedded unless --redis-url), lets them time out, and fails them with the sidecar's own
call (``expire_due``; its rate is reported as ``expiry_records_per_s``), so all N wait in
their source's replay queue. Then it claims them as a driver does, ``--limit`` per call
(``FaultTolerance(replay_limit=...)``): each claim pops the queue, reads the frames, gives
each record a fresh current id, an acker entry and a timeout. Reported:

- ``claim_records_per_s``: records handed out per second of wall time (goal >= 250,000);
- ``claim_redis_usec_per_record``: Redis's own time per claimed record (INFO commandstats);
- ``expiry_redis_usec_per_record``: the same for the expiry (copy, history, queue entry);
- ``ceiling_lpop_records_per_s``: in the same run, the queue alone -- the same number of
  18-byte entries popped ``--limit`` at a time with LPOP count, nothing else.

    python -m benchmarks.claim [--records 200000] [--limit 10000] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from benchmarks._common import (
    machine,
    parse_args,
    persist_pending,
    redis_for_benchmark,
    save,
    script_usec,
)
from ftlayer import FTConfig, FTLayer

PAYLOAD = b"\xc4\x62" + b"p" * 98  # msgpack bin8 of 98 bytes: 100 bytes in all
GOAL = 250_000


def _evalsha_usec(client: object) -> int:
    return script_usec(client)[1]  # type: ignore[arg-type]


def run(records: int, limit: int, url: str | None, script_mode: str = "auto") -> dict:
    ns = f"claim-{uuid.uuid4().hex[:6]}"
    with redis_for_benchmark(url) as client:
        cfg = FTConfig(namespace=ns, timeout_s=1.0, buckets=2,
                       script_mode=script_mode)  # type: ignore[arg-type]  # fmt: skip
        layer = FTLayer(client, cfg)
        try:
            persist_pending(layer, records, PAYLOAD)
            time.sleep(layer.config.timeout_s * 2 + 0.2)  # every deadline has passed
            usec0, t0 = _evalsha_usec(client), time.perf_counter()
            expired = layer.expire_due()
            expire_s, expire_usec = time.perf_counter() - t0, _evalsha_usec(client) - usec0
            assert expired.timed_out == records, expired
            queued = layer.stats().queued_replays
            assert queued == records, queued

            usec0 = _evalsha_usec(client)
            t0, claimed, calls = time.perf_counter(), 0, 0
            while True:
                got = layer.claim_replays(0, limit)
                calls += 1
                if not got:
                    break
                claimed += len(got)
            claim_s = time.perf_counter() - t0
            claim_usec = _evalsha_usec(client) - usec0
            assert claimed == records, claimed
        finally:
            layer.clear()
        scripts = "functions" if layer.scripts.functions else "eval"
        key = f"claim-ceiling-{uuid.uuid4().hex[:6]}"
        entry = b"x" * 18
        for first in range(0, records, 50_000):
            client.rpush(key, *([entry] * min(50_000, records - first)))
        t0 = time.perf_counter()
        popped = 0
        while batch := client.lpop(key, limit):
            popped += len(batch)  # type: ignore[arg-type]
        lpop_s = time.perf_counter() - t0
        client.delete(key)
    rate = records / claim_s
    return {
        "records": records,
        "limit": limit,
        "claim_records_per_s": round(rate),
        "claim_calls": calls,
        "claim_redis_usec_per_record": round(claim_usec / records, 2),
        "expiry_records_per_s": round(records / expire_s),
        "expiry_redis_usec_per_record": round(expire_usec / records, 2),
        "ceiling_lpop_records_per_s": round(popped / lpop_s),
        "ratio_to_ceiling": round(rate / (popped / lpop_s), 3),
        "goal_claim_records_per_s": GOAL,
        "scripts": scripts,
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--limit", type=int, default=10_000)
    ap.add_argument("--redis-url", default=None)
    args = parse_args(ap, script_mode="FTConfig.script_mode")
    result = run(args.records, args.limit, args.redis_url, args.script_mode)
    save("claim", result)
    if args.json:
        print(json.dumps(result))
        return
    print(f"claiming {result['records']:,} queued replays, {result['limit']:,} per call "
          f"(scripts as {result['scripts']})")  # fmt: skip
    print(f"  claim: {result['claim_records_per_s']:>12,} records/s   goal >= {GOAL:,}   "
          f"{'met' if result['claim_records_per_s'] >= GOAL else 'NOT met'}")  # fmt: skip
    print(f"  Redis time per claimed record: {result['claim_redis_usec_per_record']} us")
    print(f"  ceiling, LPOP of the same entries alone: "
          f"{result['ceiling_lpop_records_per_s']:,} records/s "
          f"(claim = {result['ratio_to_ceiling']:.3f}x)")  # fmt: skip
    print(f"  expiry that queued them (one expire_due): "
          f"{result['expiry_records_per_s']:,} records/s, Redis time per record "
          f"{result['expiry_redis_usec_per_record']} us")  # fmt: skip


if __name__ == "__main__":
    main()
