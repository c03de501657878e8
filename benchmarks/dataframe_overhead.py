"""What ftlayer costs a pipeline written in DataFrame code, against the same DataFrame code
without it, in one local[2] Spark session.

The pipeline: events read from JSON files (``id``, ``key``, ``payload``: a JSON string of
``--payload-bytes`` W bytes) -> stage 1 takes the amount out of the payload
(``get_json_object``) -> a keyed shuffle into 4 partitions -> stage 2 computes the VAT ->
a sink that writes every row with ``df.write`` (Spark's ``noop`` format: the whole plan
runs, nothing is stored). Variants, each run right beside a plain run of its own (ABBA
order, after ``--warmup`` uncounted rounds):

* ``df_ft_on``: the same stages as ftlayer DataFrame stages (``transform``,
  ``partition_by``, ``sink_dataframe``), the source kept by reference; beside
  ``dataframe``, the plain query;
* ``df_ft_on_failing``: ``df_ft_on`` with 5 % of the attempts of stage 1 failing
  (``failed=rand(seed) < 0.05``: ``_wide.failing_attempts``), before the shuffle: their
  replays run inside the measured time (the run ends when nothing is pending) -- stage 1
  is in the first segment, whose input is the source row, so they are read back from the
  files (a replay failing there again is kept as that input, within ``max_kept_bytes``,
  and enters there); beside
  ``dataframe``.
  ``failing_replays``: per run, the drain's batches (replay rounds, a Spark job each) and
  the replays read back or entered;
* ``df_ft_on_failing_late``: the same with 5 % of the attempts of stage 2 failing, after
  the shuffle: their rows are kept as stage 2's input and enter there (nothing read back
  from the files); ``failing_late_replays`` as ``failing_replays``;
* ``df_parquet``: ``df_ft_on`` ending in ``df.write.parquet`` (a fresh directory each
  run); beside ``parquet``, the plain query writing the same Parquet.

``ratio_df_ft_on_vs_dataframe``, ``ratio_df_ft_on_failing_vs_dataframe``,
``ratio_df_ft_on_failing_late_vs_dataframe`` and ``ratio_df_parquet_vs_plain`` are
medians of the per-round ratios of the baseline's time to the variant's (paired), with
quartiles. Goals: ``df_ft_on`` >= 0.9, ``df_ft_on_failing`` >= 0.8,
``df_ft_on_failing_late`` >= 0.7, ``df_parquet`` >= 0.9. ``redis_bytes_per_record``: what a
``df_ft_on`` batch sent Redis (its own counters), per record.

    python -m benchmarks.dataframe_overhead [--records 1000000] [--payload-bytes 1024]
        [--repeat 7] [--warmup 2] [--json]

(``python -m benchmarks.pipeline_overhead --dataframe ...`` runs the same.) Each run
writes ``dataframe_overhead_<W>.json`` and its ratios into ``pipeline_overhead.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from benchmarks._common import (
    load,
    median,
    parse_args,
    redis_for_benchmark,
    save,
    url_of,
)
from benchmarks._paired import PARTITIONS, PairedRounds, goals_unmet, paired_args, spark_session
from benchmarks._wide import failing_attempts, net_input_bytes, read_events, write_events
from ftlayer import FTConfig
from ftlayer.spark import FaultTolerance, FileSource

FAIL_RATE = 0.05
SCHEMA = "id long, key long, payload string"
GOALS = {"df_ft_on": 0.9, "df_ft_on_failing": 0.8, "df_ft_on_failing_late": 0.7,
         "df_parquet": 0.9}  # fmt: skip
PAIRS = {"df_ft_on": "dataframe", "df_ft_on_failing": "dataframe",
         "df_ft_on_failing_late": "dataframe", "df_parquet": "parquet"}  # fmt: skip
RATIOS = {"df_ft_on": "ratio_df_ft_on_vs_dataframe",
          "df_ft_on_failing": "ratio_df_ft_on_failing_vs_dataframe",
          "df_ft_on_failing_late": "ratio_df_ft_on_failing_late_vs_dataframe",
          "df_parquet": "ratio_df_parquet_vs_plain"}  # fmt: skip
Failing = Literal["", "early", "late"]
"""Where 5 % of attempts fail: nowhere, in stage 1 (before the shuffle), in stage 2."""


def parse(df: Any) -> Any:
    """Stage 1: the amount out of the payload, as ``total``."""
    from pyspark.sql import functions as F  # noqa: N812

    amount = F.get_json_object("payload", "$.amount").cast("long")
    return df.withColumn("total", amount * 1.2).drop("payload")


def vat(df: Any) -> Any:
    """Stage 2 (after the keyed shuffle)."""
    from pyspark.sql import functions as F  # noqa: N812

    return df.withColumn("vat", F.round(F.col("total") * 0.2, 2)).drop("total")


def noop(df: Any, _: Any = None) -> None:
    df.write.format("noop").mode("overwrite").save()


class Runs:
    """The variants, on one Redis; each run its own batch id, nothing left pending."""

    def __init__(self, spark: Any, url: str, client: Any, files: FileSource, tmp: Path) -> None:
        self.spark, self.files, self.tmp, self.client = spark, files, tmp, client
        # replay_limit: a batch of replays takes all of them (each batch of replays reads
        # back every file its replays name)
        self.ft = FaultTolerance(FTConfig(namespace=f"dfb{uuid.uuid4().hex[:6]}",
                                          redis_url=url, timeout_s=30.0),
                                 replay_limit=1_000_000)  # fmt: skip
        self.sent: list[float] = []
        self.replays: dict[str, list[dict[str, int]]] = {"early": [], "late": []}
        """Per failing run, by where it fails: the drain's batches (replay rounds, each a
        Spark job), and the replays read back from their files or entered at their stage."""

    def source(self) -> Any:
        return read_events(self.spark, Path(self.files.path))

    def plain(self, sink: Callable[[Any, Any], None]) -> Callable[[], None]:
        df = self.source()
        return lambda: sink(vat(parse(df).repartition(PARTITIONS, "key")), None)

    def pipeline(self, sink: Callable[[Any, Any], None], failing: Failing = "") -> Any:
        def fails(where: Failing) -> dict[str, Any]:
            return ({"failed": failing_attempts(FAIL_RATE), "errors": "injected failure"}
                    if failing == where else {})  # fmt: skip

        return (self.ft.pipeline(reads=self.files, name="bench")
                .transform(parse, **fails("early")).partition_by(["key"], PARTITIONS)
                .transform(vat, **fails("late")).sink_dataframe(sink))  # fmt: skip

    def ft_on(self, sink: Callable[[Any, Any], None], failing: Failing, n: int,
              measure: bool = False) -> Callable[[], Any]:  # fmt: skip
        pipeline, df = self.pipeline(sink, failing), self.source()
        layer = self.ft.layer
        assert layer is not None

        def job() -> Callable[[], None]:
            before = net_input_bytes(self.client) if measure else 0
            first = len(self.ft.results)
            result = self.ft.run_batch(pipeline, df, uuid.uuid4().hex[:8])
            if measure:
                self.sent.append((net_input_bytes(self.client) - before) / n)
            if failing:
                drained = self.ft.drain(timeout_s=300, pipeline=pipeline)
                assert drained.drained, drained
                ran = self.ft.results[first:]
                self.replays[failing].append({"rounds": drained.batches,
                                              "read_back": sum(r.read_back for r in ran),
                                              "entered": sum(r.entered for r in ran)})  # fmt: skip

            def check() -> None:
                assert result.fresh == n, result
                assert layer.stats().pending == 0

            return check

        return job

    def parquet_sink(self) -> Callable[[Any, Any], None]:
        out = self.tmp / f"out-{uuid.uuid4().hex[:8]}"

        def write(df: Any, _: Any = None) -> None:
            df.write.parquet(str(out))

        return write

    def close(self) -> None:
        if self.ft.layer is not None:
            self.ft.layer.clear()
        self.ft.close()


def run(records: int, width: int, repeat: int, warmup: int, url: str | None) -> dict[str, Any]:
    spark = spark_session()
    tmp = Path(tempfile.mkdtemp(prefix="ftbench-df-"))
    try:
        with redis_for_benchmark(url) as client:
            redis_url = url_of(client, url)
            source_bytes = write_events(tmp / "in", records, width, 8)
            runs = Runs(spark, redis_url, client, FileSource("json", str(tmp / "in"), SCHEMA),
                        tmp)  # fmt: skip
            variants: dict[str, Callable[[], Callable[[], Any]]] = {
                "dataframe": lambda: runs.plain(noop),
                "parquet": lambda: runs.plain(runs.parquet_sink()),
                "df_ft_on": lambda: runs.ft_on(noop, "", records, measure=True),
                "df_ft_on_failing": lambda: runs.ft_on(noop, "early", records),
                "df_ft_on_failing_late": lambda: runs.ft_on(noop, "late", records),
                "df_parquet": lambda: runs.ft_on(runs.parquet_sink(), "", records),
            }

            def prepare(name: str) -> Callable[[], Any]:
                shutil.rmtree(tmp / "out", ignore_errors=True)  # an earlier run's output
                for out in tmp.glob("out-*"):
                    shutil.rmtree(out, ignore_errors=True)
                return variants[name]()

            rounds = PairedRounds(PAIRS, warmup)
            for rnd in range(warmup + repeat):
                rounds.round(rnd, prepare)
            runs.close()
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rounds.result(
        "dataframe_overhead", records, width, "JSON files, read each run", repeat, RATIOS,
        GOALS, source_bytes=source_bytes,
        redis_bytes_per_record=round(median(runs.sent), 3) if runs.sent else None,
        failing_replays=replays_median(runs.replays["early"]),
        failing_late_replays=replays_median(runs.replays["late"]),
    )  # fmt: skip


def replays_median(runs: list[dict[str, int]]) -> dict[str, float] | None:
    """The median per failing run of its replay rounds, replays read back, entered."""
    if not runs:
        return None
    return {k: median([float(x[k]) for x in runs]) for k in ("rounds", "read_back", "entered")}


def verdict(r: dict[str, Any]) -> list[str]:
    """The goals not met, one line each (empty: all met)."""
    return goals_unmet(r, RATIOS, GOALS)


def merge(r: dict[str, Any]) -> None:
    """Put a run's goal figures into pipeline_overhead.json, where every pipeline goal is
    read: under ``dataframe_stages[W]``, and at the top the lowest of each ratio over the
    widths recorded (the goals hold at every width)."""
    main = load("pipeline_overhead")
    width = str(r["payload_bytes"])
    runs = main.setdefault("dataframe_stages", {})
    runs[width] = {"source": f"dataframe_overhead_{width}.json", "date": r["date"],
                   **{key: r[key] for key in RATIOS.values()},
                   "ratio_quartiles": r["ratio_quartiles"]}  # fmt: skip
    for key in RATIOS.values():  # a width recorded before a figure existed has none of it
        main[key] = min(run[key] for run in runs.values() if key in run)
    save("pipeline_overhead", main)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    paired_args(ap, records=1_000_000, repeat=7, warmup=2)
    args = parse_args(ap)
    r = run(args.records, args.payload_bytes, args.repeat, args.warmup, args.redis_url)
    save(f"dataframe_overhead_{args.payload_bytes}", r)
    merge(r)
    print(json.dumps(r) if args.json else text(r))


def text(r: dict[str, Any]) -> str:
    """The run as a table, the goals not met last."""
    lines = [f"{r['records']:,} records, {r['payload_bytes']} B payloads, {r['repeat']} rounds"]
    lines += [f"  {k:18s} {v:>12,} records/s" for k, v in r["records_per_s"].items()]
    for k, b in PAIRS.items():
        q = r["ratio_quartiles"][k]
        lines.append(f"  {k} / {b}: {r[RATIOS[k]]} (quartiles {q[0]}-{q[1]}; "
                     f"goal {GOALS[k]})")  # fmt: skip
    lines.append(f"  Redis bytes per record: {r['redis_bytes_per_record']}")
    for key, where in (("failing_replays", "failing"), ("failing_late_replays", "failing_late")):
        if r.get(key):
            f = r[key]
            lines.append(f"  {where}, per run (median): {f['rounds']:g} replay rounds, "
                         f"{f['read_back']:g} replays read back from their files, "
                         f"{f['entered']:g} entered at their stage")  # fmt: skip
    return "\n".join(lines + [f"  goal not met: {line}" for line in verdict(r)])


if __name__ == "__main__":
    main()
