"""A vectorized pipeline under Spark speculation, on a standalone cluster; run as its own
process by test_speculation.py (the test process already holds a local[2] SparkContext,
and one process holds one JVM).

    python speculation_job.py <master url> <redis_url> <namespace> <slow seconds>

Two batches, each with one task made slow on purpose so that Spark launches a speculative
copy of it on the other worker (another host) and the copy finishes first:

* ``b0``: the first attempt of source partition ``SLOW_SOURCE`` sleeps in stage 1 (before
  the shuffle);
* ``b1``: the first attempt of post-shuffle partition ``SLOW_SHUFFLED`` sleeps in stage 2
  (before its sink).

Stage 1 fails rows of the two batches in every attempt (each attempt fails them the same
way: they replay at once in the source task); stage 2 fails rows once, the first time any
attempt sees them (they take the replay queue). The stages record in Redis what ran where
(stage, partition, attempt, task id, host) and the sink records every id with the task id
that wrote it. Then the job drains, waits for the slow attempts to end, reads Spark's
own record of the tasks (the driver's REST API: status, ``speculative``) and prints
``RESULT <json>``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from pyspark import TaskContext

from ftlayer import FTConfig
from ftlayer.spark import FaultTolerance, Outcome

N = 2000  # rows per batch (4 source partitions of 500)
PARTS = 4
SLOW_SOURCE = 1  # source partition whose first attempt sleeps in b0
SLOW_SHUFFLED = 2  # post-shuffle partition whose first attempt sleeps in b1
KEYS = 16


def fails_needed(ids: np.ndarray) -> np.ndarray:
    """How many times stage 1 fails each id in each attempt of a task (b0 and b1)."""
    return np.where(ids % 13 == 5, 2, np.where(ids % 7 == 3, 1, 0))


class Recorder:
    """Picklable (a URL and a prefix); records into Redis from Spark's Python workers."""

    def __init__(self, url: str, prefix: str, slow_s: float) -> None:
        self.url, self.prefix, self.slow_s = url, prefix, slow_s

    @property
    def r(self) -> redis.Redis:
        cache: dict[tuple[int, str], redis.Redis] = sys.__dict__.setdefault("_spec_job", {})
        key = (os.getpid(), self.url)
        if key not in cache:
            cache[key] = redis.Redis.from_url(self.url)
        return cache[key]

    def context(self, stage: str) -> dict[str, Any]:
        tc = TaskContext.get()
        assert tc is not None
        arm = {k.decode(): v.decode() for k, v in self.r.hgetall(f"{self.prefix}:arm").items()}
        return {
            "st": stage, "phase": arm.get("phase", ""), "stage": tc.stageId(),
            "part": tc.partitionId(), "att": tc.attemptNumber(), "tid": tc.taskAttemptId(),
            "host": os.environ.get("SPARK_LOCAL_IP", "?"), "pid": os.getpid(),
            "slow": arm.get("slow") == stage and int(arm.get("part", -1)) == tc.partitionId(),
        }  # fmt: skip

    def event(self, ctx: dict[str, Any], ev: str, **more: Any) -> None:
        rec = {k: v for k, v in ctx.items() if k != "slow"}
        self.r.rpush(f"{self.prefix}:runs", json.dumps({**rec, "ev": ev, "t": time.time(), **more}))

    def begin(self, stage: str) -> dict[str, Any]:
        """Record this attempt's first call; the armed first attempt sleeps (once)."""
        ctx = self.context(stage)
        if self.r.sadd(f"{self.prefix}:started", f"{stage}:{ctx['tid']}"):
            self.event(ctx, "start")
            if ctx["slow"] and ctx["att"] == 0:
                self.event(ctx, "sleep")
                time.sleep(self.slow_s)
                self.event(ctx, "woke")
        return ctx


class Stage1(Recorder):
    """Before the shuffle: fails rows in every attempt of b0/b1 (``fails_needed``)."""

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        ctx = self.begin("s1")
        ids = b.column("id").to_numpy()
        failed = np.zeros(len(ids), bool)
        if ctx["phase"] in ("b0", "b1"):
            need = fails_needed(ids)
            cand = np.flatnonzero(need > 0)
            if len(cand):
                with self.r.pipeline(transaction=False) as p:
                    for i in ids[cand].tolist():
                        p.hincrby(f"{self.prefix}:s1:{ctx['tid']}", str(i), 1)
                    seen = np.array(p.execute(), np.int64)
                failed[cand[seen <= need[cand]]] = True
                self.event(ctx, "failed", n=int(failed.sum()))
        out = pa.RecordBatch.from_arrays([b.column("id"), pc.bit_wise_and(b.column("id"), KEYS - 1)],
                                         names=["id", "key"])  # fmt: skip
        return Outcome(out, failed=failed, errors="stage 1 fails it in this attempt")


class Stage2(Recorder):
    """After the shuffle: fails ids % 11 == 4 the first time any attempt sees them."""

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        ctx = self.begin("s2")
        ids = b.column("id").to_numpy()
        cand = np.flatnonzero(ids % 11 == 4)
        failed = np.zeros(len(ids), bool)
        if len(cand):
            with self.r.pipeline(transaction=False) as p:
                for i in ids[cand].tolist():
                    p.sadd(f"{self.prefix}:s2seen", i)
                failed[cand[np.array(p.execute(), bool)]] = True
            self.event(ctx, "failed", n=int(failed.sum()))
        out = pa.RecordBatch.from_arrays([b.column("id"), pc.multiply(b.column("key"), 10)],
                                         names=["id", "value"])  # fmt: skip
        return Outcome(out, failed=failed, errors="stage 2 fails it once")


class Sink(Recorder):
    def __call__(self, b: pa.RecordBatch) -> None:
        ctx = self.context("sink")
        ids = b.column("id").to_pylist()
        if ids:
            self.r.rpush(f"{self.prefix}:sink", *[f"{i}:{ctx['tid']}" for i in ids])
            self.event(ctx, "sink", n=len(ids))


def summary_of(raw: bytes | None) -> dict[str, Any] | None:
    """What a task summary left in Redis says (which attempt of which task wrote it)."""
    if raw is None:
        return None
    s = msgpack.unpackb(raw, raw=False)
    keep = ("stage", "partition", "attempt", "token", "fresh", "replayed", "written", "segment")
    return {k: s[k] for k in keep} | {"failed": len(s["failed_src"]) // 8}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def rest_tasks(spark: Any) -> list[dict[str, Any]]:
    """Every task of this application, from the driver's REST API (Spark's own record)."""
    sc = spark.sparkContext
    base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"
    with urllib.request.urlopen(f"{base}/stages?details=true", timeout=30) as resp:
        stages = json.load(resp)
    out = []
    for st in stages:
        for t in (st.get("tasks") or {}).values():
            out.append({
                "stage": st["stageId"], "tid": t["taskId"], "index": t["index"],
                "part": t.get("partitionId", t["index"]), "att": t["attempt"],
                "status": t["status"], "speculative": t.get("speculative", False),
                "host": t.get("host"), "executor": t.get("executorId"),
            })  # fmt: skip
    return out


def main() -> None:
    from pyspark.sql import SparkSession

    master, url, ns, slow_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    started = time.monotonic()
    prefix = f"{ns}:t"
    r = redis.Redis.from_url(url)
    builder = (
        SparkSession.builder.master(master).appName(f"ftlayer-speculation-{ns}")
        .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.cores", "1").config("spark.cores.max", "2")
        .config("spark.executor.memory", "512m")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.showConsoleProgress", "false")
        # a copy within about a second of the slow attempt falling behind
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.minTaskRuntime", "200ms")
        # judge by runtime only (a sleeping task may have read its input already)
        .config("spark.speculation.efficiency.enabled", "false")
    )  # fmt: skip
    for k, v in json.loads(os.environ.get("SPEC_EXTRA", "{}")).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    sc = spark.sparkContext
    out: dict[str, Any] = {"spark": spark.version}
    deadline = time.monotonic() + 90
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise RuntimeError("two executors did not register within 90 s")
        time.sleep(0.2)
    out["ready_s"] = round(time.monotonic() - started, 1)

    ft = FaultTolerance(FTConfig(namespace=ns, redis_url=url, timeout_s=20, max_replays=3))
    rec = (url, prefix, slow_s)
    pipeline = (
        ft.pipeline(source=0)
        .map_batches(Stage1(*rec), "id long, key long")
        .partition_by(["key"], PARTS)
        .map_batches(Stage2(*rec), "id long, value long")
        .sink_batches(Sink(*rec))
    )
    batches = {}
    for k, (slow, part) in enumerate((("s1", SLOW_SOURCE), ("s2", SLOW_SHUFFLED))):
        phase = f"b{k}"
        r.hset(f"{prefix}:arm", mapping={"phase": phase, "slow": slow, "part": part})
        df = spark.range(k * N, (k + 1) * N, 1, PARTS)
        t0 = time.monotonic()
        res = ft.run_batch(pipeline, df, phase)
        batches[phase] = {
            "fresh": res.fresh, "replayed": res.replayed, "failed": res.failed,
            "immediate_replays": res.immediate_replays, "written": res.written,
            "tasks": res.tasks, "fold_ok": res.fold_ok, "errors": res.errors[:3],
            "stage_failed": {label: c.failed for label, c in res.stages.items()},
            "elapsed_s": round(time.monotonic() - t0, 1),
        }  # fmt: skip
    r.hset(f"{prefix}:arm", mapping={"phase": "drain", "slow": "", "part": -1})
    report = ft.drain(timeout_s=120)
    out["batches"] = batches
    out["drain"] = {"drained": report.drained, "pending": report.pending,
                    "batches": report.batches}  # fmt: skip
    out["drain_folds_ok"] = all(b.fold_ok for b in ft.results[2:])

    # let every slow first attempt end (by Spark killing it, or by waking up) before
    # looking at what attempts left behind
    def runs() -> list[dict[str, Any]]:
        return [json.loads(x) for x in r.lrange(f"{prefix}:runs", 0, -1)]

    slept = [e for e in runs() if e["ev"] == "sleep"]
    wait_until = max((e["t"] for e in slept), default=0.0) + slow_s + 5
    time.sleep(max(0.0, wait_until - time.time()))
    st = ft.layer.stats()  # type: ignore[union-attr]
    client = ft.layer.client  # type: ignore[union-attr]
    out["stats"] = {"pending": st.pending, "dead_letters": st.dead_letters,
                    "unsettled_segments": st.unsettled_segments,
                    "failed_explicit": st.failed_explicit, "completed": st.completed,
                    "queued_replays": st.queued_replays}  # fmt: skip
    out["leftover"] = {
        part: sorted(k.decode() for k in client.scan_iter(match=f"ft:{{{ns}:*:{part}:*"))
        for part in ("seg", "sum")
    }
    out["leftover_summaries"] = [summary_of(client.get(k)) for k in out["leftover"]["sum"]]
    out["slow_alive"] = [e["tid"] for e in slept if alive(e["pid"])]
    out["runs"] = runs()
    out["sink"] = [x.decode() for x in r.lrange(f"{prefix}:sink", 0, -1)]
    out["tasks"] = rest_tasks(spark)
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    ft.close()
    spark.stop()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
