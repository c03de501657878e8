"""ftlayer deployed as in production, on loopback, with faults: nothing may be lost.

Starts a Spark standalone master and two workers (one core each: executor JVMs of their own,
with their own Python workers; ftlayer.spark.standalone), a 3-master Redis Cluster with one
replica per master, and two ``ftlayer serve`` sidecars sharing the namespace's lease. This
process is the Spark driver: it runs the demo pipeline (ftlayer.demo: vectorized stages, a
keyed shuffle, explicit failures, unconfirmed sink writes, crashed tasks) as a Structured
Streaming query with a ``checkpointLocation`` against ``spark://…``, with
``durability="replicated"``. While micro-batches run it kills, each with ``kill -9``, one
Spark worker, the Redis master of the namespace's first shard, and the sidecar holding the
lease (benchmarks.cluster_faults: how each recovery is timed). Then it drains and checks the
sink against the source.

It prints a table (``--json``: one object with ``source_records``, ``lost``, ``pending``,
``duplicates``, ``replayed``, ``failovers``, ``faults`` (kind, when, recovery seconds),
``elapsed_s`` and ``capacity``) and exits 1 unless nothing was lost, nothing is pending and
every fault was injected and recovered. Everything it started is stopped, also on Ctrl-C.

``--sink delta`` / ``--sink postgres``: the demo's sink also writes through ftlayer's
idempotent sink into a Delta table / a PostgreSQL table (a server this run starts), and
``lost`` and ``duplicates`` are counted from the table; the run also fails unless
``duplicates`` is 0. ``--master-kill-at settle`` kills the Redis master when the driver
begins settling a micro-batch (``--master-kill-delay-s`` later): the driver's own writes
meet the failover. ``--repeat N`` runs it N times (``--sweep``: with the master kill at
``batch``, then at ``settle`` + 0, 0.2, 0.5 and 1 s, in turn) and fails unless every run
passes; ``cluster_e2e_runs.json`` keeps each run's verdict figures.

``capacity`` checks the deployment guide's formulas (docs/deployment.md, capacity planning)
against this run: the Redis command time per source record on the masters (INFO
commandstats) beside what the guide predicts for this run -- batch scope: a fixed cost per
micro-batch, a cost per replayed record and the idle background, with this run's batch size,
replays and duration; task scope: E × u -- and records/s per executor core beside the
guide's per-core figure, with the seconds per micro-batch that bound it here.

    python -m benchmarks.cluster_e2e [--records 20000] [--batches 20] [--faults
        spark_worker,redis_master,sidecar] [--timeout-s 3] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks._common import machine, parse_args, save
from benchmarks._postgres import LocalPostgres
from benchmarks.cluster_faults import KINDS, FaultPlan, RedisWork, SettleWatch
from ftlayer.demo import DemoProgress, run_demo
from ftlayer.embedded import EmbeddedCluster
from ftlayer.errors import interrupted
from ftlayer.keys import Keyspace
from ftlayer.service.process import ServeProcess
from ftlayer.spark.standalone import StandaloneCluster

SHARDS = 8  # the default: the sidecars, started first, create the namespace with it
# The deployment guide's figures (docs/deployment.md, capacity planning), checked by this run.
E_TASK_SCOPE = 4  # task scope: events per record of map → partition_by → map → sink
U_GUIDE = 1.42  # task scope: Redis µs per event, one master (Redis 6.2)
GUIDE_BATCH_USEC = 1_900  # batch scope: Redis µs per micro-batch (8 shards)
GUIDE_REPLAY_USEC = 135  # batch scope: Redis µs per replayed record, all of its work
GUIDE_IDLE_USEC_PER_S = 500  # Redis µs per second with nothing flowing: sidecars, lease
GUIDE_PER_CORE = 375_000  # records/s per core, vectorized pipeline FT on, 1 M-record batches


def run(records: int, batches: int, kinds: tuple[str, ...], timeout_s: float, log_dir: Path,
        fail_rate: float = 0.02, drop_rate: float = 0.01, crash_rate: float = 0.1,
        sink: str = "redis", master_kill_at: str = "batch", master_kill_delay_s: float = 0.0,
        rejoin_delay_s: float = 0.0) -> dict[str, Any]:  # fmt: skip
    """One run (see the module doc); the rates are the demo's."""
    started = time.monotonic()
    ns = f"e2e-{uuid.uuid4().hex[:8]}"
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # this process is the driver, on loopback
    with contextlib.ExitStack() as stack:
        sink_url = None
        if sink == "postgres":
            sink_url = stack.enter_context(LocalPostgres()).url
        spark = stack.enter_context(StandaloneCluster(workers=2, cores=1, memory="1g"))
        cluster = stack.enter_context(EmbeddedCluster(masters=3, replicas=1))
        sidecars = [
            stack.enter_context(ServeProcess(cluster.url, ns, log_dir / f"serve-{k}.log",
                                             timeout_s=timeout_s, lease_s=3.0))
            for k in range(2)
        ]  # fmt: skip
        masters_before = _masters(cluster)
        n = len(kinds)
        at = [max(1, round(batches * (k + 1) / (n + 2))) for k in range(n)]
        plan = FaultPlan(started, spark, cluster, sidecars, Keyspace(ns, SHARDS)[0].stats,
                         kinds, at, master_kill_at=master_kill_at,
                         master_kill_delay_s=master_kill_delay_s,
                         rejoin_delay_s=rejoin_delay_s)  # fmt: skip
        stack.callback(SettleWatch(plan).attach(("ftlayer.spark.engine",
                                                 "ftlayer.scripts")))  # fmt: skip
        phases: dict[str, float] = {}

        def progress(p: DemoProgress) -> None:
            phases.setdefault(p.phase, time.monotonic())
            plan.progress(p)

        plan.start()
        with RedisWork(cluster) as work:
            report = run_demo(
                records=records, batches=batches, timeout_s=timeout_s, redis_url=cluster.url,
                drain_timeout_s=180.0, progress=progress, sidecar=False,
                fail_rate=fail_rate, drop_rate=drop_rate, crash_rate=crash_rate,
                spark_conf={**spark.driver_conf(), "spark.app.name": "ftlayer-cluster-e2e",
                            "spark.executor.cores": "1", "spark.cores.max": "2",
                            "spark.executor.memory": "768m", "spark.task.maxFailures": "8"},
                config={"namespace": ns, "durability": "replicated", "shards": SHARDS,
                        "flush_retries": 8, "flush_backoff_s": 0.25},
                sink=sink, sink_url=sink_url,
            )  # fmt: skip
            plan.join(timeout_s=180)
        failovers = sum(1 for m in masters_before if m not in _masters(cluster))
    t_stream, t_drain = phases.get("streaming", started), phases.get("draining", time.monotonic())
    streaming_s = t_drain - t_stream
    idle_s = t_stream - work.timeline[0][0]
    idle_usec_per_s = work.usec_between(work.timeline[0][0], t_stream) / idle_s if idle_s else 0
    recovered = [f for f in plan.faults if f.recovery_s is not None]
    return {
        "machine": machine(),
        "source_records": records,
        "micro_batches": report.micro_batches,
        "sink": sink,
        "master_kill_at": master_kill_at,
        "master_kill_delay_s": master_kill_delay_s,
        "rejoin_delay_s": rejoin_delay_s,
        "driver_waits": plan.driver_waits,
        "lost": report.lost,
        "pending": report.pending,
        "duplicates": report.duplicates,
        "rewrites": report.rewrites,
        "replayed": report.replayed,
        "dead_lettered": report.dead_lettered,
        "crashed_tasks": report.crashed_tasks,
        "misplaced": report.misplaced,
        "failovers": failovers,
        "faults": [f.as_dict() for f in plan.faults],
        "faults_planned": list(kinds),
        "faults_recovered": len(recovered),
        "fault_errors": plan.errors,
        "elapsed_s": round(time.monotonic() - started, 1),
        "streaming_s": round(streaming_s, 1),
        "capacity": _capacity(
            records, report.micro_batches, report.replayed, streaming_s, idle_usec_per_s, work
        ),  # fmt: skip
    }


def _masters(cluster: EmbeddedCluster) -> set[int | None]:
    return {n.port for n in cluster.nodes
            if n.running and n.client().info("replication")["role"] == "master"}  # fmt: skip


def _capacity(records: int, batches: int, replayed: int, streaming_s: float,
              idle_usec_per_s: float, work: RedisWork) -> dict[str, Any]:  # fmt: skip
    """The guide's predictions beside this run's measurements (see the module doc)."""
    usec = work.master_usec / records
    task_scope = E_TASK_SCOPE * U_GUIDE
    window_s = work.timeline[-1][0] - work.timeline[0][0]
    n = records / batches if batches else records
    batch_scope = (GUIDE_BATCH_USEC / n + replayed / records * GUIDE_REPLAY_USEC
                   + GUIDE_IDLE_USEC_PER_S * window_s / records)  # fmt: skip
    rate = records / streaming_s if streaming_s > 0 else 0.0
    return {
        "redis_usec_per_record_measured": round(usec, 2),
        "redis_calls_per_record_measured": round(work.master_calls / records, 3),
        "redis_usec_per_record_guide_batch_scope": round(batch_scope, 2),
        "redis_usec_per_record_guide_task_scope": round(task_scope, 2),
        "measured_vs_guide_batch_scope": round(usec / batch_scope, 2),
        "records_per_s_per_master_at_100pct_measured": round(1e6 / usec) if usec else None,
        "records_per_s_per_master_at_100pct_guide_batch_scope": round(1e6 / batch_scope),
        "records_per_s_per_master_at_100pct_guide_task_scope": round(1e6 / task_scope),
        "redis_usec_per_s_idle": round(idle_usec_per_s),
        "seconds_per_micro_batch": round(streaming_s / batches, 2) if batches else None,
        "records_per_s_per_executor_core_measured": round(rate / 2),
        "records_per_s_per_executor_core_guide": GUIDE_PER_CORE,
        "by_master": work.by_node,
        "by_command": {
            k: {"usec": u, "calls": c}
            for k, (u, c) in sorted(work.by_command.items(), key=lambda kv: -kv[1][0])
        },
    }


def verdict(r: dict[str, Any]) -> tuple[bool, str]:
    table = r.get("sink", "redis") != "redis"
    ok = (r["lost"] == 0 and r["pending"] == 0 and not r["fault_errors"]
          and r["faults_recovered"] == len(r["faults_planned"])
          and (r["duplicates"] == 0 or not table))  # fmt: skip
    head = "OK" if ok else "FAILED"
    dups = f", {r['duplicates']} duplicates in the {r['sink']} table" if table else ""
    return ok, (
        f"{head}: {r['source_records']:,} records, {r['lost']} lost{dups}, {r['pending']} "
        f"pending, {r['faults_recovered']}/{len(r['faults_planned'])} faults recovered"
    )


def print_table(r: dict[str, Any]) -> None:
    rows = [(k, r[k]) for k in ("sink", "source_records", "micro_batches", "lost", "pending",
                                "duplicates", "rewrites", "replayed", "dead_lettered",
                                "crashed_tasks", "misplaced", "failovers", "driver_waits",
                                "streaming_s", "elapsed_s")]  # fmt: skip
    print("ftlayer cluster end-to-end (Spark standalone 2 workers, Redis Cluster 3+3, 2 sidecars)")
    for k, v in rows:
        print(f"  {k:<16} {v:>12,}" if isinstance(v, int) else f"  {k:<16} {v:>12}")
    print("\n  fault          at (s)  batch  recovery (s)  detail")
    for f in r["faults"]:
        rec = "never" if f["recovery_s"] is None else f"{f['recovery_s']:.2f}"
        detail = ", ".join(f"{k} {v}" for k, v in f["detail"].items())
        print(f"  {f['kind']:<14} {f['at_s']:>6.1f}  {f['at_batch']:>5}  {rec:>12}  {detail}")
    for e in r["fault_errors"]:
        print(f"  fault not injected or failed: {e}")
    c = r["capacity"]
    print("\n  capacity (docs/deployment.md)     this run  guide: batch scope  task scope")
    print(f"  Redis µs per record (masters)  {c['redis_usec_per_record_measured']:>10}"
          f"  {c['redis_usec_per_record_guide_batch_scope']:>18}"
          f"  {c['redis_usec_per_record_guide_task_scope']:>10}")  # fmt: skip
    print(f"  records/s, one master at 100 % "
          f"{c['records_per_s_per_master_at_100pct_measured'] or 0:>10,}"
          f"  {c['records_per_s_per_master_at_100pct_guide_batch_scope']:>18,}"
          f"  {c['records_per_s_per_master_at_100pct_guide_task_scope']:>10,}")  # fmt: skip
    print(f"  records/s per executor core    {c['records_per_s_per_executor_core_measured']:>10,}"
          f"  {c['records_per_s_per_executor_core_guide']:>18,}  (1 M-record batches; "
          f"here {c['seconds_per_micro_batch']} s per micro-batch)")  # fmt: skip
    print()
    print(verdict(r)[1])


def _terminated(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.cluster_e2e",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument(
        "--faults",
        default=",".join(KINDS),
        help="comma-separated, in order; '' for none (default: %(default)s)",
    )
    ap.add_argument("--timeout-s", type=float, default=3.0, help="record timeout T")
    ap.add_argument("--fail-rate", type=float, default=0.02, help="as in ftlayer demo")
    ap.add_argument("--drop-rate", type=float, default=0.01, help="as in ftlayer demo")
    ap.add_argument("--crash-rate", type=float, default=0.1, help="as in ftlayer demo")
    ap.add_argument("--logs", default=None, help="directory for the sidecars' logs")
    ap.add_argument("--sink", choices=["redis", "delta", "postgres"], default="redis",
                    help="write through an idempotent sink into a table; count from it")
    ap.add_argument("--master-kill-at", choices=["batch", "settle"], default="batch",
                    help="when the Redis master dies (see the module doc)")
    ap.add_argument("--master-kill-delay-s", type=float, default=0.0)
    ap.add_argument("--rejoin-delay-s", type=float, default=0.0,
                    help="seconds before the killed master is restarted (a slow supervisor)")
    ap.add_argument("--repeat", type=int, default=1, help="runs, one after the other")
    ap.add_argument("--sweep", action="store_true",
                    help="vary the master kill's moment over the runs (see the module doc)")
    args = parse_args(ap, argv)
    kinds = tuple(k for k in args.faults.split(",") if k)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        ap.error(f"unknown fault {bad[0]!r}: choose from {', '.join(KINDS)}")
    log_dir = Path(args.logs or tempfile.mkdtemp(prefix="ftlayer-e2e-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    moments = [(args.master_kill_at, args.master_kill_delay_s)]
    if args.sweep:
        moments = [("batch", 0.0), *(("settle", d) for d in SWEEP_DELAYS_S)]
    results = []
    # SIGTERM (a supervisor's stop, `timeout`) stops a run as Ctrl-C does: the workers,
    # Redis nodes and sidecars it started are stopped too (Python's default for SIGTERM
    # would leave the standalone cluster's JVMs running)
    signal.signal(signal.SIGTERM, _terminated)
    try:
        for i in range(args.repeat):
            at, delay = moments[i % len(moments)]
            result = run(args.records, args.batches, kinds, args.timeout_s, log_dir,
                         args.fail_rate, args.drop_rate, args.crash_rate, args.sink, at,
                         delay, args.rejoin_delay_s)  # fmt: skip
            results.append(result)
            if args.json:
                print(json.dumps(result), flush=True)
            else:
                print_table(result)
    except BaseException as e:
        if not interrupted(e):  # Ctrl-C inside a py4j call surfaces as a Py4JError
            raise
        print("interrupted: everything this run started is stopped", file=sys.stderr)
        return 130
    save("cluster_e2e", results[-1])
    if args.repeat > 1:
        save("cluster_e2e_runs", {"command": "python -m benchmarks.cluster_e2e "
                                  + " ".join(sys.argv[1:]), "runs": [_brief(r) for r in results],
                                  "passed": sum(verdict(r)[0] for r in results),
                                  "machine": machine(), "date": time.strftime("%Y-%m-%d")})
        if not args.json:
            print(f"{sum(verdict(r)[0] for r in results)}/{len(results)} runs passed")
    return 0 if all(verdict(r)[0] for r in results) else 1


SWEEP_DELAYS_S = (0.0, 0.2, 0.5, 1.0)
"""``--sweep``: the master kill's delays after the driver begins settling a micro-batch."""


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    """A run's verdict figures, for cluster_e2e_runs.json."""
    master = next((f for f in r["faults"] if f["kind"] == "redis_master"), None)
    return {k: r[k] for k in ("sink", "master_kill_at", "master_kill_delay_s",
                              "rejoin_delay_s", "driver_waits", "lost",
                              "pending", "duplicates", "rewrites", "fault_errors",
                              "faults_recovered", "elapsed_s")} | {
        "master_recovery_s": master["recovery_s"] if master else None,
        "ok": verdict(r)[0]}  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
