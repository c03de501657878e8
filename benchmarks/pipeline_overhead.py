"""What fault tolerance costs a real PySpark ``foreachBatch`` pipeline.

One pipeline -- a map stage, a keyed shuffle (``partition_by``), a second map stage and
a per-partition sink -- over the same cached DataFrame of N records on ``local[2]``, run
as: FT OFF (the no-op handler), FT ON, and FT ON with 5 % of record attempts failing
explicitly (their replays included in the time: the run ends when nothing is pending).
After a warm-up round, runs alternate (off, on, on-5 %, off, ...) and medians are
reported, with the same work
written as plain PySpark (RDD map / partitionBy / map / foreachPartition) beside it as the
ceiling. Goals: ``ratio_on_off`` >= 0.90, ``ratio_5pct_off`` >= 0.80.

    python -m benchmarks.pipeline_overhead [--records 100000] [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import uuid
from typing import Any

from benchmarks._common import machine, median, redis_for_benchmark, save, save_chart
from ftlayer import FailRecord, FTConfig
from ftlayer.spark import FaultTolerance

PARTITIONS = 4


class Stage1:
    """The first per-record stage; fails ``rate`` of the attempts explicitly."""

    def __init__(self, rate: float) -> None:
        self.rate = rate

    def __call__(self, r: dict[str, Any]) -> dict[str, Any]:
        if self.rate and random.random() < self.rate:
            raise FailRecord("injected")
        return {"id": r["id"], "key": r["key"], "total": r["amount"] * 1.2}


def stage2(r: dict[str, Any]) -> dict[str, Any]:
    return {**r, "vat": round(r["total"] * 0.2, 2)}


def sink(records: list[dict[str, Any]]) -> None:
    sum(r["vat"] for r in records)  # the write: consume every record


def _plain(df: Any) -> None:
    """The same work without ftlayer: the ceiling."""
    (df.rdd.map(lambda row: Stage1(0)(row.asDict()))
       .map(lambda r: (r["key"], r)).partitionBy(PARTITIONS)
       .map(lambda kv: stage2(kv[1])).foreachPartition(lambda it: sink(list(it))))  # fmt: skip


def _ft_run(ft: FaultTolerance, df: Any, rate: float, n: int) -> None:
    pipeline = (
        ft.pipeline(source=0)
        .map(Stage1(rate))
        .partition_by(["key"], PARTITIONS, types=["bigint"])
        .map(stage2)
        .sink(sink, per="partition")
    )
    result = ft.run_batch(pipeline, df, 0)
    assert result.fresh == n
    if ft.config.enabled:
        report = ft.drain(timeout_s=300, pipeline=pipeline)
        assert report.drained, report
        st = ft.layer.stats()  # type: ignore[union-attr]
        assert st.pending == 0 and st.completed + st.dead_lettered == n, st


def run(records: int, repeat: int, url: str | None) -> dict[str, Any]:
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F  # noqa: N812

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("ftlayer-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(PARTITIONS))
             .config("spark.pyspark.python", sys.executable).getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    df = (
        spark.range(records)
        .select("id", (F.col("id") % 64).alias("key"), (F.col("id") % 500).alias("amount"))
        .repartition(PARTITIONS)
        .cache()
    )
    df.count()
    times: dict[str, list[float]] = {"plain": [], "off": [], "on": [], "on_5pct": []}
    try:
        with redis_for_benchmark(url) as client:
            kw = client.connection_pool.connection_kwargs
            redis_url = url or f"redis://{kw['host']}:{kw['port']}/0"
            for rep in range(repeat + 1):  # round 0 warms the JVM and workers: not counted
                for name in list(times):
                    ft = None
                    if name != "plain":
                        cfg = FTConfig(namespace=f"po-{uuid.uuid4().hex[:6]}",
                                       status="off" if name == "off" else "on",
                                       redis_url=redis_url, max_replays=10)  # fmt: skip
                        ft = FaultTolerance(cfg)
                    t0 = time.perf_counter()
                    if ft is None:
                        _plain(df)
                    else:
                        _ft_run(ft, df, 0.05 if name == "on_5pct" else 0.0, records)
                    if rep:
                        times[name].append(time.perf_counter() - t0)
                    if ft is not None:
                        if ft.layer is not None:
                            ft.layer.clear()
                        ft.close()
    finally:
        spark.stop()
    rate = {k: records / median(v) for k, v in times.items()}
    return {
        "records": records,
        "repeat": repeat,
        "plain_pyspark_records_per_s": round(rate["plain"]),
        "ft_off_records_per_s": round(rate["off"]),
        "ft_on_records_per_s": round(rate["on"]),
        "ft_on_5pct_records_per_s": round(rate["on_5pct"]),
        "ratio_on_off": round(rate["on"] / rate["off"], 3),
        "ratio_5pct_off": round(rate["on_5pct"] / rate["off"], 3),
        "ratio_off_plain": round(rate["off"] / rate["plain"], 3),
        "runs_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--redis-url", default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = run(args.records, args.repeat, args.redis_url)
    save("pipeline_overhead", result)
    keys = ["plain_pyspark_records_per_s", "ft_off_records_per_s", "ft_on_records_per_s",
            "ft_on_5pct_records_per_s"]  # fmt: skip

    def draw(plt: Any) -> None:
        plt.bar(["plain PySpark", "FT off", "FT on", "FT on, 5 % fail"],
                [result[k] for k in keys], color=["grey", "C0", "C1", "C3"])  # fmt: skip
        plt.ylabel("records/s (median)")
        plt.title(f"foreachBatch pipeline, {args.records:,} records, local[2]")

    save_chart("pipeline_overhead", draw)
    if args.json:
        print(json.dumps(result))
        return
    print(f"pipeline overhead, {result['records']:,} records, median of {result['repeat']}")
    for k in [*keys, "ratio_on_off", "ratio_5pct_off", "ratio_off_plain"]:
        print(f"  {k:<30} {result[k]:>12}")


if __name__ == "__main__":
    main()
