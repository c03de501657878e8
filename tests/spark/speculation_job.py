"""A vectorized pipeline under Spark speculation on a standalone cluster, run as its own
process by test_speculation.py (the test process holds a local[2] SparkContext already,
and one process holds one JVM).

    python speculation_job.py <master url> <redis_url> <namespace> <max hold seconds> [ft url]

(``ft url``: where the FT layer lives, e.g. a Redis Cluster; default ``redis_url``, which
always holds the job's own records.)

Pipeline: stage 1 -> partition_by(key, 4) -> stage 2 -> sink. In each of two batches the
first attempt of a chosen task holds (sleeps) until a condition, so Spark launches a
speculative copy of it on the other worker (another host), the copy wins, and the slow
original then goes on to the end of its own work (``spark.python.task.killTimeout`` is
long: Spark does not kill its Python worker), as a losing attempt does when Spark's kill
comes too late:

* ``b0``: source partition 1 holds in stage 1 until b0 has settled: a losing source
  attempt that ends AFTER its batch settled (it must store no segment);
* ``b1``: source partition 1 holds in stage 1 until stage 2 of b1 starts (its copy has
  won): a losing source attempt that ends BEFORE its batch settles (its segment must be
  dropped at the settle, its summary not counted); and post-shuffle partition 2 holds in
  stage 2 until b1 has settled (its copy waits until the losing source attempt of b1 has
  ended): a losing sink attempt that writes its rows after the batch settled.

Stage 1 fails rows of b0 and b1 in every attempt of a task the same way (they replay at
once, in the source task); stage 2 fails ids % 11 == 4 once, the first time any attempt
sees them (they take the replay queue). Every stage call records in Redis what ran where
(stage, partition, attempt, task id, host, pid) and the sink records each id with the task
id that wrote it. Then the job drains, waits for the held attempts to end, reads Spark's
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
from ftlayer.spark.preflight import preflight

N = 2000  # rows per batch (4 source partitions of 500)
PARTS = 4
KEYS = 16
HOLDS = {  # phase -> (stage, partition, "orig" | "copy") -> (signals, extra seconds)
    "b0": {("s1", 1, "orig"): (("b0:settled",), 0.0)},
    "b1": {
        ("s1", 1, "orig"): (("b1:s2:start",), 0.0),
        ("s2", 2, "orig"): (("b1:settled",), 0.0),
        # the copy waits for the original to hold too: Spark may launch it while the
        # original is still starting (a slow Python worker), and it must not win before
        # the original is in the state the tests inspect
        ("s2", 2, "copy"): (("b1:s1:woke", "b1:s2:2:held"), 1.5),
    },
}


def fails_needed(ids: np.ndarray) -> np.ndarray:
    """How many times stage 1 fails each id in each attempt of a task (b0 and b1)."""
    return np.where(ids % 13 == 5, 2, np.where(ids % 7 == 3, 1, 0))


class Recorder:
    """Picklable (a URL, a key prefix, a cap); records into Redis from Spark's workers."""

    def __init__(self, url: str, prefix: str, cap_s: float) -> None:
        self.url, self.prefix, self.cap_s = url, prefix, cap_s

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
        return {
            "st": stage,
            "phase": (self.r.get(f"{self.prefix}:phase") or b"").decode(),
            "stage": tc.stageId(),
            "part": tc.partitionId(),
            "att": tc.attemptNumber(),
            "tid": tc.taskAttemptId(),
            "host": os.environ.get("SPARK_LOCAL_IP", "?"),
            "pid": os.getpid(),
        }

    def event(self, ctx: dict[str, Any], ev: str, **more: Any) -> None:
        self.r.rpush(f"{self.prefix}:runs", json.dumps({**ctx, "ev": ev, "t": time.time(), **more}))

    def signal(self, name: str) -> None:
        self.r.set(f"{self.prefix}:sig:{name}", repr(time.time()), nx=True)

    def begin(self, stage: str) -> dict[str, Any]:
        """Record this attempt's first call; an armed attempt holds (once) until its signal."""
        ctx = self.context(stage)
        if not self.r.sadd(f"{self.prefix}:started", f"{stage}:{ctx['tid']}"):
            return ctx
        self.event(ctx, "start")
        self.signal(f"{ctx['phase']}:{stage}:start")
        hold = HOLDS.get(ctx["phase"], {}).get(
            (stage, ctx["part"], "orig" if ctx["att"] == 0 else "copy")
        )
        if hold is not None:
            names, extra = hold
            self.event(ctx, "hold", until=list(names))
            if ctx["att"] == 0:
                self.signal(f"{ctx['phase']}:{stage}:{ctx['part']}:held")
            deadline, at = time.time() + self.cap_s, None
            while time.time() < deadline:
                times = [self.r.get(f"{self.prefix}:sig:{name}") for name in names]
                at = None if None in times else max(float(t) for t in times)  # type: ignore[arg-type]
                if at is not None and time.time() >= at + extra:
                    break
                time.sleep(0.05)
            else:
                at = None
            self.event(ctx, "woke", capped=at is None)
            self.signal(f"{ctx['phase']}:{stage}:woke")
        return ctx


class Stage1(Recorder):
    """Before the shuffle: fails rows in every attempt of b0/b1 (``fails_needed``)."""

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        ctx = self.begin("s1")
        ids = b.column("id").to_numpy()
        failed = np.zeros(len(ids), bool)
        cand = np.flatnonzero(fails_needed(ids) > 0) if ctx["phase"] in ("b0", "b1") else []
        if len(cand):
            with self.r.pipeline(transaction=False) as p:
                for i in ids[cand].tolist():
                    p.hincrby(f"{self.prefix}:s1:{ctx['tid']}", str(i), 1)
                seen = np.array(p.execute(), np.int64)
            failed[cand[seen <= fails_needed(ids[cand])]] = True
            self.event(ctx, "failed", n=int(failed.sum()))
        out = pa.RecordBatch.from_arrays(
            [b.column("id"), pc.bit_wise_and(b.column("id"), KEYS - 1)], names=["id", "key"]
        )
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
        out = pa.RecordBatch.from_arrays(
            [b.column("id"), pc.multiply(b.column("key"), 10)], names=["id", "value"]
        )
        return Outcome(out, failed=failed, errors="stage 2 fails it once")


class Sink(Recorder):
    def __call__(self, b: pa.RecordBatch) -> None:
        ctx = self.context("sink")
        ids = b.column("id").to_pylist()
        if ids:
            self.r.rpush(f"{self.prefix}:sink", *[f"{i}:{ctx['tid']}" for i in ids])
            self.event(ctx, "sink", n=len(ids))


def rest_tasks(spark: Any) -> list[dict[str, Any]]:
    """Every task of this application, from the driver's REST API (Spark's own record)."""
    sc = spark.sparkContext
    base = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}"
    with urllib.request.urlopen(f"{base}/stages?details=true", timeout=30) as resp:
        stages = json.load(resp)
    return [
        {
            "stage": st["stageId"],
            "tid": t["taskId"],
            "part": t.get("partitionId", t["index"]),
            "att": t["attempt"],
            "status": t["status"],
            "speculative": t.get("speculative", False),
            "host": t.get("host"),
        }
        for st in stages
        for t in (st.get("tasks") or {}).values()
    ]


def summary_of(raw: bytes | None) -> dict[str, Any] | None:
    """What a task summary left in Redis says (which attempt of which task wrote it)."""
    if raw is None:
        return None
    s = msgpack.unpackb(raw, raw=False)
    keep = ("stage", "partition", "attempt", "fresh", "segment")
    return {k: s[k] for k in keep} | {"failed": len(s["failed_src"]) // 8}


def result_of(res: Any) -> dict[str, Any]:
    return {
        "batch_id": res.batch_id,
        "fresh": res.fresh,
        "replayed": res.replayed,
        "failed": res.failed,
        "immediate_replays": res.immediate_replays,
        "written": res.written,
        "tasks": res.tasks,
        "fold_ok": res.fold_ok,
        "stage_failed": {label.split()[-1]: c.failed for label, c in res.stages.items()},
        "elapsed_s": res.elapsed_s,
    }


def main() -> None:
    from pyspark.sql import SparkSession

    master, url, ns, cap_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    ft_url = sys.argv[5] if len(sys.argv) > 5 else url
    started = time.monotonic()
    prefix = f"{ns}:t"
    r = redis.Redis.from_url(url)
    spark = (
        SparkSession.builder.master(master)
        .appName(f"ftlayer-speculation-{ns}")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.executor.memory", "512m")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.ui.showConsoleProgress", "false")
        # a copy within about a second of the slow attempt falling behind
        .config("spark.speculation", "true")
        .config("spark.speculation.interval", "100ms")
        .config("spark.speculation.quantile", "0.5")
        .config("spark.speculation.multiplier", "1.5")
        .config("spark.speculation.minTaskRuntime", "200ms")
        # judge by runtime only (a holding task may have read its input already)
        .config("spark.speculation.efficiency.enabled", "false")
        # a losing attempt's Python worker is not killed while it holds: it ends its work
        .config("spark.python.task.killTimeout", "120s")
        .getOrCreate()
    )
    sc = spark.sparkContext
    out: dict[str, Any] = {"spark": spark.version}
    deadline = time.monotonic() + 90
    while sc._jsc.sc().getExecutorMemoryStatus().size() < 3:  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            raise RuntimeError("two executors did not register within 90 s")
        time.sleep(0.2)
    out["ready_s"] = round(time.monotonic() - started, 1)

    ft = FaultTolerance(FTConfig(namespace=ns, redis_url=ft_url, timeout_s=20, max_replays=3))
    preflight(spark, ft.layer)
    # ftlayer's once-per-application checks first (their probe job leaves one executor's
    # Python worker cold), then warm both executors' Python workers (ftlayer imported), so
    # neither attempt of a held task starts cold: a copy on a warm executor would win
    # before a cold original reached its stage. The warm-up is a rendezvous: two tasks,
    # each waiting (in Redis) for the other's executor, so neither can finish first and
    # have its copy replace the cold one (rounds of quick tasks did that on a slow
    # machine: the cold executor's task was copied and killed in every round)
    meet = f"{ns}:warm"

    def warm(_: int) -> str:
        import ftlayer.spark.vector_tasks  # noqa: F401

        host = os.environ.get("SPARK_LOCAL_IP", "?")
        c = redis.Redis.from_url(url)
        c.sadd(meet, host)
        until = time.monotonic() + 120
        while c.scard(meet) < 2 and time.monotonic() < until:
            time.sleep(0.05)
        return host

    hosts = set(sc.parallelize(range(2), 2).map(warm).collect())
    r.delete(meet)
    if len(hosts) < 2:
        raise RuntimeError(f"the warm-up reached one executor only in 120 s: {hosts}")
    rec = (url, prefix, cap_s)
    pipeline = (
        ft.pipeline(source=0)
        .map_batches(Stage1(*rec), "id long, key long")
        .partition_by(["key"], PARTS)
        .map_batches(Stage2(*rec), "id long, value long")
        .sink_batches(Sink(*rec))
    )
    settled = {}
    for k in range(2):
        phase = f"b{k}"
        r.set(f"{prefix}:phase", phase)
        ft.run_batch(pipeline, spark.range(k * N, (k + 1) * N, 1, PARTS), phase)
        settled[phase] = time.time()
        r.set(f"{prefix}:sig:{phase}:settled", repr(settled[phase]))
    r.set(f"{prefix}:phase", "drain")
    report = ft.drain(timeout_s=120)
    out["settled"] = settled
    out["drain"] = {"drained": report.drained, "pending": report.pending, "batches": report.batches}

    # let every held attempt end its work before looking at what attempts left behind
    def runs() -> list[dict[str, Any]]:
        return [json.loads(x) for x in r.lrange(f"{prefix}:runs", 0, -1)]

    deadline = time.monotonic() + cap_s + 10
    while time.monotonic() < deadline:
        held = {e["tid"] for e in runs() if e["ev"] == "hold"}
        woke = [e["t"] for e in runs() if e["ev"] == "woke"]
        if len(woke) == len(held) and time.time() > max(woke, default=0) + 3:
            break
        time.sleep(0.2)
    st = ft.layer.stats()  # type: ignore[union-attr]
    client = ft.layer.client  # type: ignore[union-attr]
    out["results"] = [result_of(res) for res in ft.results]
    out["stats"] = {
        "pending": st.pending,
        "dead_letters": st.dead_letters,
        "unsettled_segments": st.unsettled_segments,
        "failed_explicit": st.failed_explicit,
        "completed": st.completed,
        "queued_replays": st.queued_replays,
    }
    out["leftover"] = {
        part: sorted(k.decode() for k in client.scan_iter(match=f"ft:{{{ns}:*:{part}:*"))
        for part in ("seg", "sum")
    }
    out["leftover_summaries"] = [summary_of(client.get(k)) for k in out["leftover"]["sum"]]
    out["runs"] = runs()
    out["sink"] = [x.decode() for x in r.lrange(f"{prefix}:sink", 0, -1)]
    out["tasks"] = rest_tasks(spark)
    out["elapsed_s"] = round(time.monotonic() - started, 1)
    ft.close()
    spark.stop()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
