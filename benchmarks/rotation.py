"""The sidecar with 1,000,000 pending records: rotation time and memory.

Persists N records (100-byte payloads) through the real handler into a real Redis
(embedded unless --redis-url) while a real ``ftlayer serve`` process runs beside it, then:
- ``idle_rotation_ms``: one rotation (expire_due, the sidecar's call) while N records are
  pending and none is due -- the steady-state cost of the clock;
- ``expiry_*``: the sidecar's own rotations that time all N out (each failed, re-persisted
  under a new id and queued for replay), from its log: total time and records/s;
- ``sidecar_rss_mb_*``: the sidecar process's resident memory, idle and at peak;
- ``redis_bytes_per_pending``: Redis used_memory growth per pending record (payload incl.).

    python -m benchmarks.rotation [--records 1000000] [--timeout-s 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import uuid

import psutil

from benchmarks._common import (
    machine,
    median,
    parse_args,
    persist_pending,
    redis_for_benchmark,
    save,
    url_of,
)
from ftlayer import FTConfig, FTLayer

PAYLOAD = b"\xc4\x62" + b"p" * 98  # msgpack bin8 of 98 bytes: 100 bytes in all


def run(
    records: int, timeout_s: float, buckets: int, url: str | None, script_mode: str = "auto"
) -> dict:
    ns = f"rot-{uuid.uuid4().hex[:6]}"
    with redis_for_benchmark(url) as client:
        redis_url = url_of(client, url)
        cfg = FTConfig(namespace=ns, timeout_s=timeout_s, buckets=buckets,
                       script_mode=script_mode)  # type: ignore[arg-type]  # fmt: skip
        layer = FTLayer(client, cfg)
        log = tempfile.NamedTemporaryFile(prefix="ftlayer-serve-", suffix=".log", delete=False)
        serve = subprocess.Popen(
            [sys.executable, "-m", "ftlayer.cli", "serve", "--redis-url", redis_url,
             "--namespace", ns, "--timeout-s", str(timeout_s), "--buckets", str(buckets),
             "--metrics-port", "-1", "--script-mode", script_mode],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        proc = psutil.Process(serve.pid)
        peak = [0]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.1):
                try:
                    peak[0] = max(peak[0], proc.memory_info().rss)
                except psutil.Error:
                    return

        threading.Thread(target=sample, daemon=True).start()
        try:
            mem0 = client.info("memory")["used_memory"]
            t0 = time.perf_counter()
            persist_pending(layer, records, PAYLOAD)
            persist_s = time.perf_counter() - t0
            mem1 = client.info("memory")["used_memory"]
            idle = []
            for _ in range(15):
                t = time.perf_counter()
                res = layer.expire_due()
                idle.append((time.perf_counter() - t) * 1e3)
                assert res.processed == 0, "records came due during the idle measurement"
            idle_rss = proc.memory_info().rss
            end = time.monotonic() + timeout_s * buckets / (buckets - 1) + persist_s + 120
            while layer.stats().failed_timeout < records:
                if time.monotonic() > end:
                    raise RuntimeError("the sidecar did not expire every record in time")
                time.sleep(0.5)
        finally:
            stop.set()
            serve.terminate()
            serve.wait(timeout=30)
            log.close()
        took = [float(m) for m in re.findall(r"rotation expired=\d+ .*took_ms=([\d.]+)",
                                             open(log.name).read())]  # fmt: skip
        layer.clear()
    expiry_ms = sum(took)
    result = {
        "records": records,
        "timeout_s": timeout_s,
        "buckets": buckets,
        "persist_records_per_s": round(records / persist_s),
        "idle_rotation_ms": round(median(idle), 3),
        "expiry_rotations": len(took),
        "expiry_total_s": round(expiry_ms / 1e3, 2),
        "expiry_records_per_s": round(records / (expiry_ms / 1e3)) if expiry_ms else None,
        "expiry_longest_rotation_s": round(max(took) / 1e3, 2) if took else None,
        "sidecar_rss_mb_idle": round(idle_rss / 2**20, 1),
        "sidecar_rss_mb_peak": round(peak[0] / 2**20, 1),
        "redis_bytes_per_pending": round((mem1 - mem0) / records, 1),
        "scripts": "functions" if layer.scripts.functions else "eval",
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--timeout-s", type=float, default=20.0)
    ap.add_argument("--buckets", type=int, default=5)
    ap.add_argument("--redis-url", default=None)
    args = parse_args(ap, script_mode="FTConfig.script_mode, the sidecar's too")
    result = run(args.records, args.timeout_s, args.buckets, args.redis_url, args.script_mode)
    save("rotation", result)
    if args.json:
        print(json.dumps(result))
        return
    print(f"sidecar rotation with {result['records']:,} pending records")
    for k, v in result.items():
        if k not in ("records",):
            print(f"  {k:<28} {v}")


if __name__ == "__main__":
    main()
