"""The cross-task ack path: XOR events per second, beside its ceilings in the same run.

N source records flow through 3 hops, each hop a separate task with its own handler and
flush (as across shuffles), ``batch`` records per task, into a real Redis (embedded unless
--redis-url):

    source task : persist (+ its init, 1 XOR)                       -> flush
    hop 1 task  : emit a child of the input, ack the input (2 XORs) -> flush
    hop 2 task  : emit a child of the input, ack the input (2 XORs) -> flush
    sink task   : ack the input (1 XOR)                             -> flush: complete

That is 6 logical XOR events per record, through ``FTLayer(...).handler()``, ``persist``,
``emit``, ``ack``, ``flush`` -- and again (``*_numpy``) with the source calling
``persist_many`` and the hops and the sink ``emit_many`` / ``ack_many`` on id arrays.
Every record must complete (pending 0, completed N), or the run fails. Measured on the
same server, alternating with the ftlayer run:

- ``raw_set_ops_per_s``: pipelined SETs of 8-byte values, ``batch`` per pipeline: the
  plain ceiling of this server through redis-py;
- ``redis_benchmark_set_ops_per_s``: the server's own ceiling, ``redis-benchmark -P 64 -t
  set`` (C, 50 connections; once per run), and ``ratio_vs_redis_benchmark_set``, XOR
  events/s over it;
- ``naive_lua_events_per_s``: the straightforward implementation, one EVALSHA per XOR pair
  (HGET, 64-bit XOR on two 32-bit halves, HSET or HDEL), redis-py encoding each argument,
  ``batch`` calls per pipeline (2x for the hops). It stores no payload, no timeout, no
  stats: it is a lower bar of work than ftlayer's, not an equal one.

On a Redis Cluster (``--redis-url redis+cluster://host:port/0``, or ``--cluster`` for an
embedded 3-master EmbeddedCluster) the server-side figures are summed over every master
and also reported per node (``per_node``: address, shards held, EVALSHA calls and usec,
usec per event) and per shard (``per_shard``: shard, node, records and events, from the
shard's ``stats`` hash). The ceilings spread over the cluster: raw SETs through redis-py's
cluster pipeline (plain keys, spread by slot); the naive Lua through one plain pipeline
per master on its own connection, each master with a key hash-tagged onto it, because
redis-py's cluster pipelines refuse EVALSHA. ftlayer itself on a cluster sends its flush
calls one per shard, unpipelined (ftlayer.acker, for the same reason).

    python -m benchmarks.ack_throughput [--records 100000] [--batch 10000]
        [--sweep 100,1000,10000] [--repeat 3] [--shards 8]
        [--redis-url URL | --cluster] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import numpy as np
import redis

from benchmarks._common import (
    machine,
    median,
    node_of_key,
    parse_args,
    primaries,
    redis_benchmark_set,
    redis_for_benchmark,
    save,
    save_chart,
    script_usec,
    server_cpu_s,
)
from ftlayer import FTConfig, FTHandler, FTLayer
from ftlayer.config import ScriptMode
from ftlayer.connection import is_cluster
from ftlayer.ids import new_ids

PAYLOAD = b"\xc4\x62" + b"p" * 98  # msgpack bin8 of 98 bytes: 100 bytes in all
EVENTS_PER_RECORD = 6  # source init 1, hop 1: 2, hop 2: 2, sink 1

NAIVE_LUA = """
local v = redis.call('HGET', KEYS[1], ARGV[1])
local hi, lo = tonumber(ARGV[2]), tonumber(ARGV[3])
if v then
  local ehi, elo = struct.unpack('>i4i4', v)
  hi, lo = bit.bxor(ehi, hi), bit.bxor(elo, lo)
end
if hi == 0 and lo == 0 then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], struct.pack('>i4i4', hi, lo))
end
return 0
"""

GOALS = {
    "redis_usec_per_event": ("<=", 1.0),
    "client_events_per_cpu_s": (">=", 1_000_000),
    "client_events_per_cpu_s_numpy": (">=", 2_000_000),
    "ratio_vs_naive": (">=", 4.0),
}


class _Clock:
    """Wall and process-CPU time, plus named wall-time splits."""

    def __init__(self) -> None:
        self.splits: dict[str, float] = {}
        self.wall0 = time.perf_counter()
        self.cpu0 = time.process_time()
        self._t = self.wall0

    def split(self, name: str) -> None:
        t = time.perf_counter()
        self.splits[name] = self.splits.get(name, 0.0) + (t - self._t)
        self._t = t

    def stop(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall0, time.process_time() - self.cpu0


Counters = dict[str, tuple[int, int, float]]  # node -> (script calls, usec, cpu s)


def _node_counters(client: redis.Redis) -> Counters:
    """Script calls and usec (EVALSHA and FCALL, INFO commandstats) and CPU seconds (INFO
    cpu) of every master so far."""
    out = {}
    for addr, conn in primaries(client):
        calls, usec = script_usec(conn)
        out[addr] = (calls, usec, server_cpu_s(conn))
    return out


def _server_counters(client: redis.Redis) -> tuple[int, int, float]:
    """The counters of every master, summed."""
    per = _node_counters(client).values()
    return sum(c[0] for c in per), sum(c[1] for c in per), sum(c[2] for c in per)


def _delta(c0: Counters, c1: Counters) -> dict[str, tuple[int, int, float]]:
    return {n: (c1[n][0] - c0[n][0], c1[n][1] - c0[n][1], c1[n][2] - c0[n][2]) for n in c1}


def _hop_numpy(task: FTHandler, src: np.ndarray, cur: np.ndarray) -> np.ndarray:
    """One hop with the numpy API: a child per input, then the inputs acked."""
    children = task.emit_many(src)
    task.ack_many(src, cur)
    return children


def run_ftlayer(
    client: redis.Redis,
    records: int,
    batch: int,
    namespace: str | None = None,
    shards: int = 8,
    numpy_api: bool = False,
    script_mode: ScriptMode = "auto",
) -> dict[str, Any]:
    """The 3-hop workload through the real handler API; asserts every record completed.
    Server counters are taken on every master; per shard, the ``stats`` hash.
    ``numpy_api``: the source uses persist_many, the hops and the sink emit_many /
    ack_many (ids as arrays) instead of a call per record. ``script_mode``: FTConfig's
    (on Redis 7 "auto" runs the scripts as functions, "eval" by EVALSHA)."""
    namespace = namespace or f"ack-{uuid.uuid4().hex[:8]}"
    cfg = FTConfig(namespace=namespace, timeout_s=600, shards=shards, script_mode=script_mode)
    layer = FTLayer(client, cfg)
    try:
        n0 = _node_counters(client)
        clock = _Clock()
        for first in range(0, records, batch):
            k = min(batch, records - first)
            source = layer.handler()
            assert isinstance(source, FTHandler)
            if numpy_api:
                src, cur = source.persist_many([PAYLOAD] * k, np.arange(first, first + k))
            else:
                persist = source.persist
                roots = [persist(PAYLOAD, i, 0) for i in range(first, first + k)]
            clock.split("source_persist")
            source.flush()
            clock.split("source_flush")
            if not numpy_api:
                inputs = roots
            for hop in ("hop1", "hop2"):
                task = layer.handler()
                assert isinstance(task, FTHandler)
                if numpy_api:
                    cur = _hop_numpy(task, src, cur)
                else:
                    emit, ack = task.emit, task.ack
                    children = []
                    for rid in inputs:
                        children.append(emit(rid))
                        ack(rid)
                    inputs = children
                clock.split(f"{hop}_emit_ack")
                task.flush()
                clock.split(f"{hop}_flush")
            sink = layer.handler()
            if numpy_api:
                assert isinstance(sink, FTHandler)
                sink.ack_many(src, cur)
            else:
                ack = sink.ack
                for rid in inputs:
                    ack(rid)
            clock.split("sink_ack")
            sink.flush()
            clock.split("sink_flush")
        wall, cpu = clock.stop()
        per_node = _delta(n0, _node_counters(client))
        st = layer.stats()
        assert st.pending == 0, f"{st.pending} records still pending"
        assert st.completed == records, f"completed {st.completed} of {records}"
        assert st.persisted == records and st.orphans == 0, st
        per_shard: list[dict[str, Any]] = []
        for k, keys in enumerate(layer.keyspace.shards):
            stats: dict[bytes, bytes] = client.hgetall(keys.stats)  # type: ignore[assignment]
            raw = {a.decode(): int(b) for a, b in stats.items()}
            per_shard.append({
                "shard": k, "node": node_of_key(client, keys.stats),
                "records": raw.get("persisted", 0),
                "completed": raw.get("completed", 0) + raw.get("completed_local", 0),
                "events": EVENTS_PER_RECORD * raw.get("persisted", 0),
            })  # fmt: skip
    finally:
        layer.clear()
    assert sum(s["records"] for s in per_shard) == records
    events = EVENTS_PER_RECORD * records
    return {
        "events": events,
        "wall_s": wall,
        "cpu_s": cpu,
        "evalsha_calls": sum(d[0] for d in per_node.values()),
        "evalsha_usec": sum(d[1] for d in per_node.values()),
        "server_cpu_s": sum(d[2] for d in per_node.values()),
        "per_node": per_node,
        "per_shard": per_shard,
        "splits_s": clock.splits,
        "scripts": "functions" if layer.scripts.functions else "eval",
    }


def _naive_targets(client: redis.Redis) -> list[tuple[redis.Redis, str]]:
    """(connection, key) per master: the one server and one key, or on a cluster each
    primary's own connection with a key whose hash tag puts it on that primary."""
    base = f"naive-{uuid.uuid4().hex[:8]}"
    if not is_cluster(client):
        return [(client, base)]
    targets = []
    for addr, conn in primaries(client):
        tag = next(t for t in range(100_000) if node_of_key(client, f"{base}:{{{t}}}") == addr)
        targets.append((conn, f"{base}:{{{tag}}}"))
    return targets


def run_naive(client: redis.Redis, records: int, batch: int) -> dict[str, Any]:
    """The same 6 XOR events per record, one script call per (source id, current id).
    On a cluster record j goes to master j mod masters, each master one pipeline per step
    on its own connection (redis-py's cluster pipelines refuse EVALSHA)."""
    targets = _naive_targets(client)
    scripts = [conn.register_script(NAIVE_LUA) for conn, _ in targets]

    def halves(v: int) -> tuple[int, int]:
        hi, lo = v >> 32, v & 0xFFFFFFFF
        return hi - (1 << 32) if hi >= 1 << 31 else hi, lo - (1 << 32) if lo >= 1 << 31 else lo

    n = len(targets)

    def xor_calls(pairs: list[tuple[bytes, int]], per: int = 1) -> None:
        # the ``per`` pairs of record j sit at per*j ...: they all go to master j mod n
        for t, ((conn, key), script) in enumerate(zip(targets, scripts, strict=True)):
            with conn.pipeline(transaction=False) as pipe:
                for i in range(t * per, len(pairs), n * per):
                    for src, cur in pairs[i : i + per]:
                        hi, lo = halves(cur)
                        script(keys=[key], args=[src, hi, lo], client=pipe)
                pipe.execute()

    for (_, key), script in zip(targets, scripts, strict=True):
        script(keys=[key], args=[b"\0" * 8, 0, 0])  # load it outside the timing
    c0 = _server_counters(client)
    clock = _Clock()
    for first in range(0, records, batch):
        k = min(batch, records - first)
        ids = new_ids(4 * k).tolist()
        srcs = [i.to_bytes(8, "big") for i in ids[:k]]
        root, c1, c2 = ids[k : 2 * k], ids[2 * k : 3 * k], ids[3 * k :]
        xor_calls(list(zip(srcs, root, strict=True)))  # source init
        xor_calls(
            [p for s, a, b in zip(srcs, root, c1, strict=True) for p in ((s, b), (s, a))], 2
        )  # hop 1
        xor_calls(
            [p for s, a, b in zip(srcs, c1, c2, strict=True) for p in ((s, b), (s, a))], 2
        )  # hop 2
        xor_calls(list(zip(srcs, c2, strict=True)))  # sink
    wall, cpu = clock.stop()
    c1_ = _server_counters(client)
    left = 0
    for conn, key in targets:
        left += conn.hlen(key)
        conn.delete(key)
    assert left == 0, f"naive: {left} entries did not return to 0"
    events = EVENTS_PER_RECORD * records
    return {
        "events": events,
        "wall_s": wall,
        "cpu_s": cpu,
        "evalsha_usec": c1_[1] - c0[1],
        "server_cpu_s": c1_[2] - c0[2],
    }


def run_raw_set(client: redis.Redis, ops: int, batch: int) -> dict[str, Any]:
    """Pipelined SETs of 8-byte values, ``batch`` per pipeline (keys reused per batch)."""
    prefix = f"rawset-{uuid.uuid4().hex[:8]}:"
    keys = [f"{prefix}{i}" for i in range(batch)]
    value = b"\x01" * 8
    t0 = time.perf_counter()
    for first in range(0, ops, batch):
        with client.pipeline(transaction=False) as pipe:
            for key in keys[: min(batch, ops - first)]:
                pipe.set(key, value)
            pipe.execute()
    wall = time.perf_counter() - t0
    client.delete(*keys[: min(batch, ops)])
    return {"ops": ops, "wall_s": wall}


def measure(
    client: redis.Redis,
    records: int,
    batch: int,
    repeat: int,
    shards: int = 8,
    script_mode: ScriptMode = "auto",
) -> dict[str, Any]:
    """ftlayer, naive and raw SET, alternated ``repeat`` times; medians. One namespace
    for the repeats (cleared after each), so shards sit on the same masters each time."""
    ft, ftnp, naive, raw = [], [], [], []
    namespace = f"ack-{uuid.uuid4().hex[:8]}"
    for _ in range(repeat):
        ft.append(run_ftlayer(client, records, batch, namespace, shards, False, script_mode))
        ftnp.append(run_ftlayer(client, records, batch, namespace, shards, True, script_mode))
        naive.append(run_naive(client, records, batch))
        raw.append(run_raw_set(client, EVENTS_PER_RECORD * records, batch))
    events = EVENTS_PER_RECORD * records

    def med(runs: list[dict[str, Any]], f: Any) -> float:
        return median([f(r) for r in runs])

    xor_eps = med(ft, lambda r: events / r["wall_s"])
    naive_eps = med(naive, lambda r: events / r["wall_s"])
    raw_ops = med(raw, lambda r: r["ops"] / r["wall_s"])
    splits = {
        name: round(med(ft, lambda r, n=name: r["splits_s"][n]) * 1e9 / records, 1)
        for name in ft[0]["splits_s"]
    }
    per_shard = ft[0]["per_shard"]
    per_node = []
    for node in ft[0]["per_node"]:
        held = [s for s in per_shard if s["node"] == node]
        node_events = sum(s["events"] for s in held)
        usec = med(ft, lambda r, n=node: r["per_node"][n][1])
        per_node.append({
            "node": node,
            "shards": [s["shard"] for s in held],
            "records": sum(s["records"] for s in held),
            "events": node_events,
            "evalsha_calls": ft[0]["per_node"][node][0],
            "evalsha_usec": round(usec),
            "usec_per_event": round(usec / node_events, 3) if node_events else None,
            "server_cpu_s": round(med(ft, lambda r, n=node: r["per_node"][n][2]), 3),
            "share_of_usec": round(usec / max(1, med(ft, lambda r: r["evalsha_usec"])), 3),
        })  # fmt: skip
    return {
        "records": records,
        "batch": batch,
        "events": events,
        "xor_events_per_s": round(xor_eps),
        "client_events_per_cpu_s": round(med(ft, lambda r: events / r["cpu_s"])),
        "client_events_per_cpu_s_numpy": round(med(ftnp, lambda r: events / r["cpu_s"])),
        "xor_events_per_s_numpy": round(med(ftnp, lambda r: events / r["wall_s"])),
        "redis_usec_per_event_numpy": round(med(ftnp, lambda r: r["evalsha_usec"] / events), 3),
        "redis_usec_per_event": round(med(ft, lambda r: r["evalsha_usec"] / events), 3),
        "redis_cpu_usec_per_event": round(med(ft, lambda r: r["server_cpu_s"] * 1e6 / events), 3),
        "evalsha_calls": ft[0]["evalsha_calls"],
        "raw_set_ops_per_s": round(raw_ops),
        "naive_lua_events_per_s": round(naive_eps),
        "naive_client_events_per_cpu_s": round(med(naive, lambda r: events / r["cpu_s"])),
        "naive_redis_usec_per_event": round(med(naive, lambda r: r["evalsha_usec"] / events), 3),
        "naive_redis_cpu_usec_per_event": round(
            med(naive, lambda r: r["server_cpu_s"] * 1e6 / events), 3
        ),
        "ratio_vs_naive": round(xor_eps / naive_eps, 2),
        "ratio_vs_raw_set": round(xor_eps / raw_ops, 2),
        "client_wall_ns_per_record": splits,
        "shards": shards,
        "scripts": ft[0]["scripts"],
        "per_node": per_node,
        "per_shard": per_shard,
    }


CLUSTER_CEILINGS = (
    "raw SET: redis-py cluster pipeline, plain keys spread over the masters by slot; naive "
    "Lua: one plain pipeline per master on its own connection, key hash-tagged onto that "
    "master, masters in turn (redis-py cluster pipelines refuse EVALSHA); ftlayer: one "
    "unpipelined flush call per shard (same reason)"
)


def run(
    records: int,
    batch: int,
    sweep: list[int],
    repeat: int,
    url: str | None,
    *,
    cluster: bool = False,
    shards: int = 8,
    script_mode: ScriptMode = "auto",
) -> dict[str, Any]:
    with redis_for_benchmark(url, cluster=cluster) as client:
        result = run_on(client, records, batch, sweep, repeat, shards, script_mode)
    return result


def run_on(
    client: redis.Redis,
    records: int,
    batch: int,
    sweep: list[int],
    repeat: int,
    shards: int = 8,
    script_mode: ScriptMode = "auto",
) -> dict[str, Any]:
    """The whole benchmark on one client (a server or a cluster)."""
    nodes = primaries(client)
    first = nodes[0][1]
    info = {**first.info("server"), **first.info("memory")}
    main = measure(client, records, batch, repeat, shards, script_mode)
    ceiling = redis_benchmark_set(client)
    main["redis_benchmark_set_ops_per_s"] = ceiling["ops_per_s"]
    main["redis_benchmark_set_note"] = ceiling["note"]
    main["ratio_vs_redis_benchmark_set"] = (
        round(main["xor_events_per_s"] / ceiling["ops_per_s"], 3) if ceiling["ops_per_s"] else None
    )
    points = []
    for b in sweep:
        if b == batch:
            points.append(main)
            continue
        points.append(measure(client, records, b, max(1, repeat - 1), shards, script_mode))
    result: dict[str, Any] = {k: v for k, v in main.items()}
    result["cluster"] = is_cluster(client)
    result["masters"] = len(nodes)
    if result["cluster"]:
        result["cluster_ceilings"] = CLUSTER_CEILINGS
    result["sweep"] = [
        {k: p[k] for k in ("batch", "xor_events_per_s", "client_events_per_cpu_s",
                           "redis_usec_per_event", "naive_lua_events_per_s",
                           "raw_set_ops_per_s", "ratio_vs_naive", "ratio_vs_raw_set")}
        for p in points
    ]  # fmt: skip
    result["goals"] = {
        name: {"target": f"{op} {target:g}", "measured": result[name],
               "met": result[name] <= target if op == "<=" else result[name] >= target}
        for name, (op, target) in GOALS.items()
    }  # fmt: skip
    result["repeat"] = repeat
    result["redis"] = f"{info.get('redis_version')} ({info.get('mem_allocator', '?')})"
    result["machine"] = machine()
    result["date"] = time.strftime("%Y-%m-%d")
    return result


def _chart(result: dict[str, Any]) -> Any:
    pts = sorted(result["sweep"], key=lambda p: p["batch"])
    xs = [p["batch"] for p in pts]

    def draw(plt: Any) -> None:
        for key, label, style in (
            ("raw_set_ops_per_s", "raw pipelined SET (ops/s, ceiling)", "k--"),
            ("xor_events_per_s", "ftlayer handler, 3 hops (XOR events/s)", "o-"),
            ("naive_lua_events_per_s", "naive: one EVALSHA per XOR (events/s)", "s-"),
        ):
            plt.plot(xs, [p[key] for p in pts], style, label=label)
        plt.xscale("log")
        plt.yscale("log")
        plt.xlabel("records per task (batch size)")
        plt.ylabel("per second, client wall time")
        plt.title(f"ack path, {result['records']:,} records, Redis {result['redis']}")
        plt.grid(True, which="both", alpha=0.3)
        plt.legend(fontsize=8)

    return draw


def print_table(result: dict[str, Any]) -> None:
    where = f"Redis Cluster of {result['masters']} masters, " if result.get("cluster") else ""
    print(
        f"ack path: {result['records']:,} records x {EVENTS_PER_RECORD} XOR events, "
        f"{result['batch']:,} records per task, median of {result['repeat']} "
        f"({where}Redis {result['redis']}, scripts as {result['scripts']}, {result['machine']})"
    )
    for k in ("xor_events_per_s", "client_events_per_cpu_s", "redis_usec_per_event",
              "xor_events_per_s_numpy", "client_events_per_cpu_s_numpy",
              "redis_usec_per_event_numpy", "redis_cpu_usec_per_event", "evalsha_calls",
              "raw_set_ops_per_s",
              "naive_lua_events_per_s", "naive_client_events_per_cpu_s",
              "naive_redis_usec_per_event", "naive_redis_cpu_usec_per_event",
              "ratio_vs_naive", "ratio_vs_raw_set"):  # fmt: skip
        print(f"  {k:<32} {result[k]:>14,}")
    if result.get("redis_benchmark_set_ops_per_s"):
        print(f"  ceiling, {result['redis_benchmark_set_note']}: "
              f"{result['redis_benchmark_set_ops_per_s']:,} ops/s; XOR events/s over it: "
              f"{result['ratio_vs_redis_benchmark_set']}")  # fmt: skip
    else:
        print(f"  ceiling, redis-benchmark: {result.get('redis_benchmark_set_note')}")
    print_split(result)
    print("  client wall ns per record, by stage:")
    for k, v in result["client_wall_ns_per_record"].items():
        print(f"    {k:<30} {v:>14,}")
    print("  batch sweep:")
    print(f"    {'batch':>7} {'xor ev/s':>11} {'ev/cpu-s':>11} {'us/ev srv':>10} "
          f"{'naive ev/s':>11} {'raw SET/s':>11} {'x naive':>8} {'x SET':>6}")  # fmt: skip
    for p in result["sweep"]:
        print(f"    {p['batch']:>7} {p['xor_events_per_s']:>11,} "
              f"{p['client_events_per_cpu_s']:>11,} {p['redis_usec_per_event']:>10} "
              f"{p['naive_lua_events_per_s']:>11,} {p['raw_set_ops_per_s']:>11,} "
              f"{p['ratio_vs_naive']:>8} {p['ratio_vs_raw_set']:>6}")  # fmt: skip
    print("  goals:")
    for name, g in result["goals"].items():
        print(f"    {name:<28} {g['target']:>12}  measured {g['measured']:<10,} "
              f"{'MET' if g['met'] else 'NOT MET'}")  # fmt: skip


def print_split(result: dict[str, Any]) -> None:
    """Per master and per shard: where the server work and the records went."""
    print(f"  per node ({result['shards']} shards):")
    print(f"    {'node':<22} {'shards':<16} {'events':>9} {'evalsha':>8} {'usec':>10} "
          f"{'us/ev':>6} {'share':>6} {'cpu s':>6}")  # fmt: skip
    for n in result["per_node"]:
        print(f"    {n['node']:<22} {','.join(map(str, n['shards'])) or '-':<16} "
              f"{n['events']:>9,} {n['evalsha_calls']:>8,} {n['evalsha_usec']:>10,} "
              f"{n['usec_per_event'] if n['usec_per_event'] is not None else '-':>6} "
              f"{n['share_of_usec']:>6} {n['server_cpu_s']:>6}")  # fmt: skip
    print("  per shard: " + ", ".join(
        f"{s['shard']}@{s['node'].rsplit(':', 1)[-1]}={s['records']:,}"
        for s in result["per_shard"]) + " records")  # fmt: skip
    if result.get("cluster_ceilings"):
        print(f"  cluster ceilings: {result['cluster_ceilings']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=10_000, help="records per task")
    ap.add_argument("--sweep", default="100,1000,10000", help="batch sizes for the chart")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shards", type=int, default=8, help="FTConfig.shards (hash tags)")
    where = ap.add_mutually_exclusive_group()
    where.add_argument(
        "--redis-url",
        default=None,
        help="redis://, rediss://, unix:// or redis+cluster:// (any node)",
    )
    where.add_argument(
        "--cluster",
        action="store_true",
        help="run on an embedded 3-master Redis Cluster (EmbeddedCluster)",
    )
    args = parse_args(ap, script_mode="FTConfig.script_mode: on Redis 7 auto runs the scripts "
                      "as functions")  # fmt: skip
    sweep = sorted({int(b) for b in args.sweep.split(",") if b.strip()} | {args.batch})
    result = run(args.records, args.batch, sweep, args.repeat, args.redis_url,
                 cluster=args.cluster, shards=args.shards,
                 script_mode=args.script_mode)  # fmt: skip
    save("ack_throughput", result)
    chart = save_chart("ack_throughput", _chart(result))
    if args.json:
        print(json.dumps(result))
        return
    print_table(result)
    if chart:
        print(f"  chart: {chart}")


if __name__ == "__main__":
    main()
