"""What an idempotent sink costs: records/s into Delta Lake and PostgreSQL through
ftlayer's ``DeltaSink`` / ``PostgresSink`` (one row per lineage id), beside a plain append
of the same rows by the same pipeline, in one local[2] Spark session.

The pipeline: events read from JSON files (``id``, ``key``, ``payload``: a JSON string of
``--payload-bytes`` W bytes, kept by reference) -> a DataFrame stage takes the amount out
of the payload -> a keyed shuffle into 4 partitions -> a Python sink given each row's
lineage id (``sink_batches(..., lineage="lineage_id")``), writing ``id, key, total,
lineage_id``. Each run reads the events under a directory of its own (hard links: new
files to ftlayer, so new lineage ids, every row inserted). Sinks, each into a table of its
own that grows over the rounds (as a real table does):

* ``delta_append``: ``write_deltalake(mode="append")`` of each batch;
  ``delta_merge``: ``DeltaSink`` (a merge inserting the rows whose lineage id is new);
* ``pg_append``: ``COPY`` of each batch into a table without a key;
  ``pg_merge``: ``PostgresSink`` (``COPY`` into a session table, ``INSERT ... ON CONFLICT
  (lineage_id) DO NOTHING``, one transaction).

Each merge variant runs beside its append (ABBA order, after ``--warmup`` uncounted
rounds); ``ratio_delta_merge_vs_append`` / ``ratio_pg_merge_vs_append`` are medians of the
per-round ratios of the append's time to the merge's, with quartiles. Goal: Delta >= 0.8;
PostgreSQL reported.

    python -m benchmarks.sink_overhead [--records 300000] [--payload-bytes 1024]
        [--repeat 5] [--warmup 1] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks._common import parse_args, redis_for_benchmark, save, url_of
from benchmarks._paired import PARTITIONS, PairedRounds, goals_unmet, paired_args, spark_session
from benchmarks._postgres import LocalPostgres
from benchmarks._wide import write_events
from benchmarks.dataframe_overhead import SCHEMA, parse
from ftlayer import FTConfig
from ftlayer.sinks import DeltaSink, PostgresSink
from ftlayer.spark import FaultTolerance, FileSource

GOALS = {"delta_merge": 0.8}
PAIRS = {"delta_merge": "delta_append", "pg_merge": "pg_append"}
RATIOS = {"delta_merge": "ratio_delta_merge_vs_append", "pg_merge": "ratio_pg_merge_vs_append"}
COLUMNS = ["id", "key", "total", "lineage_id"]


class DeltaAppend:
    """The plain append: each batch written as it is (duplicates and all)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, b: pa.RecordBatch) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.path, pa.Table.from_batches([b.select(COLUMNS)]), mode="append")


class PostgresAppend:
    """The plain append: ``COPY`` of each batch into a table without a key."""

    def __init__(self, url: str, table: str) -> None:
        self.url, self.table = url, table

    def __call__(self, b: pa.RecordBatch) -> None:
        import psycopg

        with psycopg.connect(self.url) as conn, conn.cursor() as cur:
            with cur.copy(f"COPY {self.table} ({', '.join(COLUMNS)}) FROM STDIN") as copy:
                for row in zip(*(b.column(c).to_pylist() for c in COLUMNS), strict=True):
                    copy.write_row(row)


class Selected:
    """A sink given the benchmark's columns only (the merge sinks take what they get)."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.ft_lineage = sink, "lineage_id"

    def __call__(self, b: pa.RecordBatch, ctx: Any = None) -> None:
        self.sink(b.select(COLUMNS), ctx)


def run(records: int, width: int, repeat: int, warmup: int, url: str | None) -> dict[str, Any]:
    import psycopg

    spark = spark_session()
    tmp = Path(tempfile.mkdtemp(prefix="ftbench-sink-"))
    try:
        with redis_for_benchmark(url) as client, LocalPostgres() as pg:
            with psycopg.connect(pg.url, autocommit=True) as c:
                c.execute("CREATE TABLE plain (id bigint, key bigint, total double precision, "
                          "lineage_id bigint)")  # fmt: skip
                c.execute("CREATE TABLE keyed (id bigint, key bigint, total double precision, "
                          "lineage_id bigint PRIMARY KEY)")  # fmt: skip
            write_events(tmp / "in", records, width, 8)
            ft = FaultTolerance(FTConfig(namespace=f"sink{uuid.uuid4().hex[:6]}",
                                         redis_url=url_of(client, url), timeout_s=60.0))
            sinks = {
                "delta_append": DeltaAppend(str(tmp / "delta_append")),
                "delta_merge": Selected(DeltaSink(str(tmp / "delta_merge"))),
                "pg_append": PostgresAppend(pg.url, "plain"),
                "pg_merge": Selected(PostgresSink(pg.url, "keyed")),
            }

            batch_ids = itertools.count()

            def variant(name: str) -> Callable[[], Any]:
                where = tmp / f"in-{uuid.uuid4().hex[:8]}"  # new files: new lineage ids
                where.mkdir()
                for f in (tmp / "in").iterdir():
                    os.link(f, where / f.name)
                files = FileSource("json", str(where), SCHEMA)
                pipeline = (ft.pipeline(reads=files, name="bench")
                            .transform(parse).partition_by(["key"], PARTITIONS)
                            .sink_batches(sinks[name], lineage="lineage_id"))  # fmt: skip
                df = spark.read.schema(SCHEMA).json(str(where))

                batch_id = next(batch_ids)  # a streaming query's kind: an integer

                def job() -> None:
                    result = ft.run_batch(pipeline, df, batch_id)
                    assert result.fresh == records and result.failed == 0, result

                return job

            rounds = PairedRounds(PAIRS, warmup)
            for rnd in range(warmup + repeat):
                rounds.round(rnd, variant)
            with psycopg.connect(pg.url) as c:
                rows = {t: c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # type: ignore[index]
                        for t in ("plain", "keyed")}  # fmt: skip
            assert rows["keyed"] == rows["plain"], rows  # each round: new lineage ids
            if ft.layer is not None:
                ft.layer.clear()
            ft.close()
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rounds.result("sink_overhead", records, width,
                         "JSON files kept by reference, read each run", repeat, RATIOS,
                         GOALS, table_rows_at_end=rows["keyed"])  # fmt: skip


def verdict(r: dict[str, Any]) -> list[str]:
    """The goals not met, one line each (empty: all met)."""
    return goals_unmet(r, RATIOS, GOALS)


def text(r: dict[str, Any]) -> str:
    lines = [f"{r['records']:,} records a round, {r['payload_bytes']} B payloads, "
             f"{r['repeat']} rounds; tables end with {r['table_rows_at_end']:,} rows"]  # fmt: skip
    lines += [f"  {k:14s} {v:>10,} records/s" for k, v in r["records_per_s"].items()]
    for k, b in PAIRS.items():
        q = r["ratio_quartiles"][k]
        goal = f"; goal {GOALS[k]}" if k in GOALS else ""
        lines.append(f"  {k} / {b}: {r[RATIOS[k]]} (quartiles {q[0]}-{q[1]}{goal})")
    return "\n".join(lines + [f"  goal not met: {line}" for line in verdict(r)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    paired_args(ap, records=300_000, repeat=5, warmup=1)
    args = parse_args(ap)
    r = run(args.records, args.payload_bytes, args.repeat, args.warmup, args.redis_url)
    save("sink_overhead", r)
    print(json.dumps(r) if args.json else text(r))


if __name__ == "__main__":
    main()
