"""The ack path on one Redis server and on a 3-master Redis Cluster, in the same run.

The workload of benchmarks.ack_throughput (N records, 3 hops, 6 XOR events per record,
through the real handler API, every record checked complete) with its ceilings, run first
on one embedded redis-server, then on an embedded 3-master EmbeddedCluster, both started
here; printed side by side with the ratio cluster / single, plus where the cluster's
server work and records went (per master, per shard).

What it can show: that the scripts and the routing work on a cluster, what the cluster
path costs the client (one unpipelined flush call per shard: redis-py cluster pipelines
refuse EVALSHA) and the servers, and how the work spreads over shards and masters. What it
cannot show on a machine with fewer cores than masters + client: a throughput gain from
more cores, since the masters and the client share the same CPUs.

    python -m benchmarks.cluster_compare [--records 100000] [--batch 10000] [--repeat 3]
        [--shards 8] [--masters 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from benchmarks._common import machine, parse_args, save
from benchmarks.ack_throughput import print_split, run_on
from ftlayer.connection import connect
from ftlayer.embedded import EmbeddedCluster, EmbeddedRedis

COMPARED = (
    "xor_events_per_s",
    "client_events_per_cpu_s",
    "redis_usec_per_event",
    "redis_cpu_usec_per_event",
    "evalsha_calls",
    "raw_set_ops_per_s",
    "naive_lua_events_per_s",
    "naive_redis_usec_per_event",
    "ratio_vs_naive",
    "ratio_vs_raw_set",
)


def run(records: int, batch: int, repeat: int, shards: int, masters: int) -> dict[str, Any]:
    with EmbeddedRedis() as server:
        client = server.client()
        try:
            single = run_on(client, records, batch, [batch], repeat, shards)
        finally:
            client.close()
    with EmbeddedCluster(masters) as cluster:
        cclient = connect(cluster.url)
        try:
            clustered = run_on(cclient, records, batch, [batch], repeat, shards)
        finally:
            cclient.close()
    ratio = {k: round(clustered[k] / single[k], 3) if single[k] else None for k in COMPARED}
    return {
        "records": records,
        "batch": batch,
        "repeat": repeat,
        "shards": shards,
        "masters": masters,
        "cpus": os.cpu_count(),
        "redis": single["redis"],
        "single": single,
        "cluster": clustered,
        "ratio_cluster_vs_single": ratio,
        "note": (
            f"{masters} masters and the client share {os.cpu_count()} CPU(s): this shows "
            "the scripts and routing working on a cluster, the client and server cost of "
            "the cluster path, and how work spreads over shards and masters; it cannot show "
            "a throughput gain from more cores"
        ),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }


def print_table(result: dict[str, Any]) -> None:
    print(
        f"ack path, single server vs Redis Cluster of {result['masters']} masters: "
        f"{result['records']:,} records x 6 XOR events, {result['batch']:,} per task, "
        f"{result['shards']} shards, median of {result['repeat']} "
        f"(Redis {result['redis']}, {result['cpus']} CPUs, {result['machine']})"
    )
    print(f"  {'':<30} {'single':>12} {'cluster':>12} {'cluster/single':>15}")
    for k in COMPARED:
        r = result["ratio_cluster_vs_single"][k]
        print(f"  {k:<30} {result['single'][k]:>12,} {result['cluster'][k]:>12,} "
              f"{r if r is not None else '-':>15}")  # fmt: skip
    print("single server:")
    print_split(result["single"])
    print("cluster:")
    print_split(result["cluster"])
    print(f"  note: {result['note']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=10_000, help="records per task")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shards", type=int, default=8, help="FTConfig.shards (hash tags)")
    ap.add_argument("--masters", type=int, default=3)
    args = parse_args(ap)
    result = run(args.records, args.batch, args.repeat, args.shards, args.masters)
    save("cluster_compare", result)
    if args.json:
        print(json.dumps(result))
        return
    print_table(result)


if __name__ == "__main__":
    main()
