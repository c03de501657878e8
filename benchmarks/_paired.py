"""What the pipeline benchmarks share: one local Spark session, and paired rounds, how they
compare ftlayer with what a user would write instead on a machine whose speed drifts.

Each variant runs beside a baseline run of its own in every round, the two in alternating
order (by round and by the pair's place), so a drift slows both sides of a pair alike; the
figure of a pair is the median of its per-round ratios (baseline time / variant time),
with their quartiles. The first ``warmup`` rounds (JVM, Python workers, caches) are run
and not counted.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from benchmarks._common import provenance

__all__ = ["PARTITIONS", "PairedRounds", "goals_unmet", "paired_args", "quartiles",
           "spark_session", "time_run"]  # fmt: skip

PARTITIONS = 4
"""Shuffle partitions (``spark.sql.shuffle.partitions``) and the pipelines' ``partition_by``."""


def spark_session() -> Any:
    """The benchmarks' local[2] session, its UI and progress bars off."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("ftlayer-bench")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(PARTITIONS))
             .config("spark.pyspark.python", sys.executable).getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    return spark

Prepare = Callable[[], Callable[[], Any]]
"""Makes a run ready (untimed) and returns it; what the run returns, when callable (its
checks), runs after the clock stopped."""


def paired_args(ap: argparse.ArgumentParser, records: int, repeat: int, warmup: int) -> None:
    """The options of a paired-rounds benchmark over wide events read from files."""
    ap.add_argument("--records", type=int, default=records)
    ap.add_argument("--payload-bytes", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=repeat, help="counted rounds")
    ap.add_argument("--warmup", type=int, default=warmup, help="rounds run, not counted")
    ap.add_argument("--redis-url", default=None, help="default: an embedded redis-server")


def time_run(prepare: Prepare) -> float:
    """Seconds of the run ``prepare`` returns (its preparation and checks not counted)."""
    job = prepare()
    t0 = time.perf_counter()
    after = job()
    dt = time.perf_counter() - t0
    if callable(after):
        after()
    return dt


def quartiles(xs: list[float]) -> list[float]:
    """First and third quartile (the one value twice when there is only one)."""
    return statistics.quantiles(xs, n=4)[::2] if len(xs) > 1 else [xs[0], xs[0]]


class PairedRounds:
    """The counted times of each variant and the per-round ratios of each pair.

    ``pairs``: variant -> its baseline (several variants may share one; each still gets a
    baseline run of its own every round)."""

    def __init__(self, pairs: Mapping[str, str], warmup: int) -> None:
        self.pairs = dict(pairs)
        self.warmup = warmup
        self.times: dict[str, list[float]] = {}
        self.ratios: dict[str, list[float]] = {k: [] for k in self.pairs}
        self.diffs: dict[str, list[float]] = {k: [] for k in self.pairs}
        """Per pair, each round's variant time minus its baseline's (seconds)."""

    def round(self, rnd: int, prepare: Callable[[str], Callable[[], Any]]) -> None:
        """Round ``rnd`` (from 0) of every pair; ``prepare(name)`` makes variant
        ``name``'s run ready and returns it (see :func:`time_run`)."""
        for i, (name, base) in enumerate(self.pairs.items()):
            order = (base, name) if (rnd + i) % 2 == 0 else (name, base)
            dt = {k: time_run(lambda k=k: prepare(k)) for k in order}  # type: ignore[misc]
            if rnd >= self.warmup:
                for k in order:
                    self.times.setdefault(k, []).append(dt[k])
                self.ratios[name].append(dt[base] / dt[name])
                self.diffs[name].append(dt[name] - dt[base])

    def single(self, rnd: int, name: str, prepare: Prepare) -> None:
        """An unpaired run of ``name`` in round ``rnd`` (no goal rides on it)."""
        dt = time_run(prepare)
        if rnd >= self.warmup:
            self.times.setdefault(name, []).append(dt)

    def figures(self, records: int, names: Mapping[str, str]) -> dict[str, Any]:
        """records/s of each variant (median time), each pair's median ratio under its
        name in ``names``, the ratios' quartiles, and every counted time."""
        med = statistics.median
        return {
            "records_per_s": {k: round(records / med(v)) for k, v in self.times.items() if v},
            **{names[k]: round(med(v), 3) for k, v in self.ratios.items()},
            "ratio_quartiles": {k: [round(q, 3) for q in quartiles(v)]
                                for k, v in self.ratios.items()},  # fmt: skip
            "runs_s": {k: [round(x, 3) for x in v] for k, v in self.times.items()},
        }


    def result(self, benchmark: str, records: int, width: int, source: str, repeat: int,
               names: Mapping[str, str], goals: Mapping[str, float],
               **extra: Any) -> dict[str, Any]:  # fmt: skip
        """A pipeline benchmark's result: its run's shape, :meth:`figures`, ``extra``
        (the benchmark's own figures), its goals and provenance."""
        return {
            "records": records, "payload_bytes": width, "source": source,
            "repeat": repeat, "warmup": self.warmup,
            **self.figures(records, names), **extra,
            "goals": dict(goals), **provenance(benchmark),
        }  # fmt: skip


def goals_unmet(r: dict[str, Any], names: dict[str, str], goals: dict[str, float]) -> list[str]:
    """The goals a run's ratios did not meet, one line each (empty: all met)."""
    return [f"{names[k]}: {r[names[k]]} < {g}" for k, g in goals.items() if r[names[k]] < g]
