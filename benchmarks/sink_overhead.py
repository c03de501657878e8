"""What an idempotent sink costs: records/s into Delta Lake and PostgreSQL through
ftlayer's ``DeltaSink`` / ``PostgresSink`` (one row per lineage id), each case beside the
plain write a user would make without ftlayer, by the same pipeline, in one local[2] Spark
session.

The pipeline: events read from JSON files (``id``, ``key``, ``payload``: a JSON string of
``--payload-bytes`` W bytes, kept by reference) -> a DataFrame stage takes the amount out
of the payload -> a keyed shuffle into 4 partitions -> a Python sink given each row's
lineage id (``sink_batches(..., lineage="lineage_id")``), writing ``id, key, total,
lineage_id`` (N rows a run: ``--records``). Every variant writes a table of its own; both
sides of a pair start from the same table contents. Three cases per sink:

* ``append``: first attempts. Each round reads new files (hard links: new lineage ids)
  as a new batch id, so every row is new; the tables grow by N a round. ``DeltaSink``
  appends them (a first write cannot be in the table); ``PostgresSink`` inserts them
  through its one path (``COPY`` into a session table, ``INSERT ... ON CONFLICT
  (lineage_id) DO NOTHING``). Plain: ``write_deltalake(mode="append")``; ``COPY`` into
  the table.
* ``merge``: a batch Spark runs again after its driver died. Before the rounds, one run
  of batch id B writes the N rows; every round runs batch B again on the same files (the
  same lineage ids; ftlayer marks every row as possibly written before), into a table
  that holds exactly those N rows: the sinks take their merge path, and must insert
  nothing. Plain: ``DeltaTable.merge(...).when_not_matched_insert_all()`` on the lineage
  id (retried on a commit conflict, as concurrent tasks need); ``COPY`` into a temporary
  table and ``INSERT ... ON CONFLICT (lineage_id) DO NOTHING``.
* ``merge_10x``: the same into a table of 10 N rows (9 N of other records, appended
  before in 9 writes of N, and the batch's N).

Row counts are checked after the clock stops, after every run of every variant: exactly
N more rows after an append, exactly as many as before after a merge (no duplicates, no
loss); a Delta run in a merge case must add no ``WRITE`` (append) commit. PostgreSQL: the
plain writes keep one connection per Python worker, as ``PostgresSink`` does; every table
has the same primary key (``lineage_id``).

Each variant runs beside its plain write (ABBA order, after ``--warmup`` uncounted rounds);
``ratio_<variant>_vs_plain`` is the median of the per-round ratios of the plain write's
time to the variant's, with quartiles. Goal: ``delta_append`` >= 0.8; the rest reported.

    python -m benchmarks.sink_overhead [--records 100000] [--payload-bytes 1024]
        [--repeat 5] [--warmup 1] [--json] [--record | --results DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from benchmarks._common import parse_args, redis_for_benchmark, save, url_of
from benchmarks._paired import PARTITIONS, PairedRounds, goals_unmet, paired_args, spark_session
from benchmarks._postgres import LocalPostgres, worker_connection
from benchmarks._wide import write_events
from benchmarks.dataframe_overhead import SCHEMA, parse
from ftlayer import FTConfig
from ftlayer.sinks import DeltaSink, PostgresSink
from ftlayer.spark import FaultTolerance, FileSource

CASES = ("append", "merge", "merge_10x")
VARIANTS = [f"{sink}_{case}" for sink in ("delta", "pg") for case in CASES]
PAIRS = {v: f"plain_{v}" for v in VARIANTS}
RATIOS = {v: f"ratio_{v}_vs_plain" for v in VARIANTS}
GOALS = {"delta_append": 0.8}
COLUMNS = ["id", "key", "total", "lineage_id"]
ARROW_SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.int64()), ("total", pa.float64()),
                          ("lineage_id", pa.int64())])  # fmt: skip
DDL = "id bigint, key bigint, total double precision, lineage_id bigint PRIMARY KEY"
PREFILL = 9
"""``merge_10x``: the table holds PREFILL N rows of other records besides the batch's N."""


class PlainDeltaAppend:
    """``write_deltalake(mode="append")`` of each batch."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, b: pa.RecordBatch) -> None:
        from deltalake import write_deltalake

        write_deltalake(self.path, pa.Table.from_batches([b.select(COLUMNS)]), mode="append")


class PlainDeltaMerge:
    """``DeltaTable.merge`` of each batch on the lineage id, inserting the rows whose id
    is new; run again on a commit conflict (concurrent tasks merge into one table)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, b: pa.RecordBatch) -> None:
        from deltalake import DeltaTable
        from deltalake.exceptions import CommitFailedError

        rows = pa.Table.from_batches([b.select(COLUMNS)])
        for attempt in itertools.count():
            try:
                (DeltaTable(self.path)
                 .merge(rows, "t.lineage_id = s.lineage_id", source_alias="s",
                        target_alias="t")
                 .when_not_matched_insert_all().execute())  # fmt: skip
                return
            except CommitFailedError:
                if attempt >= 20:
                    raise
                time.sleep(0.02 * (attempt + 1))


class PlainPostgres:
    """Each batch in one transaction on the worker's connection: ``COPY`` into the table
    (``upsert`` False), or ``COPY`` into a temporary table and ``INSERT ... ON CONFLICT
    (lineage_id) DO NOTHING`` from it (``upsert`` True)."""

    def __init__(self, url: str, table: str, upsert: bool) -> None:
        self.url, self.table, self.upsert = url, table, upsert

    def __call__(self, b: pa.RecordBatch) -> None:
        cols = ", ".join(COLUMNS)
        conn = worker_connection(self.url)
        rows = zip(*(b.column(c).to_pylist() for c in COLUMNS), strict=True)
        with conn.transaction(), conn.cursor() as cur:
            into = self.table
            if self.upsert:
                into = f"stage_{self.table}"
                cur.execute(f"CREATE TEMP TABLE IF NOT EXISTS {into} (LIKE {self.table}) "
                            "ON COMMIT DELETE ROWS")  # fmt: skip
            with cur.copy(f"COPY {into} ({cols}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            if self.upsert:
                cur.execute(f"INSERT INTO {self.table} ({cols}) SELECT {cols} FROM {into} "
                            "ON CONFLICT (lineage_id) DO NOTHING")  # fmt: skip


class Selected:
    """A sink given the benchmark's columns only (the ftlayer sinks take what they get)."""

    def __init__(self, sink: Any) -> None:
        self.sink, self.ft_lineage = sink, "lineage_id"

    def __call__(self, b: pa.RecordBatch, ctx: Any = None) -> None:
        self.sink(b.select(COLUMNS), ctx)


@dataclass
class Table:
    """One variant's table: where it is, and how many rows it must hold."""

    delta: str | None
    pg: str | None
    rows: int = 0

    def count(self, pg_url: str) -> int:
        import psycopg
        from deltalake import DeltaTable

        if self.delta is not None:
            return int(DeltaTable(self.delta).to_pyarrow_dataset().count_rows())
        with psycopg.connect(pg_url) as c:
            return int(c.execute(f"SELECT count(*) FROM {self.pg}").fetchone()[0])  # type: ignore[index]

    def version(self) -> int:
        from deltalake import DeltaTable

        return DeltaTable(self.delta).version() if self.delta else 0

    def operations(self, since: int) -> list[str]:
        """The Delta commits after version ``since``: their operations."""
        from deltalake import DeltaTable

        if self.delta is None or DeltaTable(self.delta).version() == since:
            return []
        dt = DeltaTable(self.delta)
        return sorted({h["operation"] for h in dt.history(dt.version() - since)})


def prefill(table: Table, pg_url: str, n: int) -> None:
    """``PREFILL`` writes of ``n`` rows of other records (lineage ids -1 down: no record
    of a file has them but by a 64-bit hash collision, which the row counts would show)."""
    import numpy as np
    import psycopg
    from deltalake import write_deltalake

    for i in range(PREFILL):
        lo = i * n + 1
        if table.delta is not None:
            ids = np.arange(lo, lo + n, dtype=np.int64)
            write_deltalake(table.delta, pa.table([ids, ids % 64, ids * 1.2, -ids],
                                                  schema=ARROW_SCHEMA), mode="append")
        else:
            with psycopg.connect(pg_url) as c:
                c.execute(f"INSERT INTO {table.pg} ({', '.join(COLUMNS)}) SELECT g, g % 64, "
                          f"g * 1.2, -g FROM generate_series({lo}, {lo + n - 1}) g")  # fmt: skip
    table.rows += PREFILL * n


def run(records: int, width: int, repeat: int, warmup: int, url: str | None) -> dict[str, Any]:
    import psycopg
    from deltalake import write_deltalake

    spark = spark_session()
    tmp = Path(tempfile.mkdtemp(prefix="ftbench-sink-"))
    try:
        with redis_for_benchmark(url) as client, LocalPostgres() as pg:
            write_events(tmp / "in", records, width, 8)
            ft = FaultTolerance(FTConfig(namespace=f"sink{uuid.uuid4().hex[:6]}",
                                         redis_url=url_of(client, url), timeout_s=60.0))
            tables: dict[str, Table] = {}
            sinks: dict[str, Any] = {}
            for name in [*VARIANTS, *PAIRS.values()]:
                plain, append = name.startswith("plain_"), name.endswith("_append")
                if "delta" in name:
                    path = str(tmp / name)
                    tables[name] = Table(path, None)
                    write_deltalake(path, ARROW_SCHEMA.empty_table())
                    plain_sink = PlainDeltaAppend(path) if append else PlainDeltaMerge(path)
                    sinks[name] = plain_sink if plain else Selected(DeltaSink(path))
                else:
                    tables[name] = Table(None, name)
                    with psycopg.connect(pg.url, autocommit=True) as c:
                        c.execute(f"CREATE TABLE {name} ({DDL})")
                    sinks[name] = (PlainPostgres(pg.url, name, not append) if plain
                                   else Selected(PostgresSink(pg.url, name)))  # fmt: skip

            batch_ids = itertools.count(1)
            sources = {name: i for i, name in enumerate(tables)}

            def pipeline(name: str, where: Path, sink: Any) -> Any:
                files = FileSource("json", str(where), SCHEMA)
                return (ft.pipeline(source=sources[name], reads=files, name=f"bench-{name}")
                        .transform(parse).partition_by(["key"], PARTITIONS)
                        .sink_batches(sink, lineage="lineage_id"))  # fmt: skip

            def linked(name: str) -> Path:
                where = tmp / f"in-{name}-{uuid.uuid4().hex[:8]}"  # new files: new ids
                where.mkdir()
                for f in (tmp / "in").iterdir():
                    os.link(f, where / f.name)
                return where

            reruns: dict[str, tuple[Any, Any, int]] = {}
            for name, t in tables.items():  # the merge cases' tables, before the rounds
                if "merge" not in name:
                    continue
                if name.endswith("10x"):
                    prefill(t, pg.url, records)
                where, batch_id = linked(name), next(batch_ids)
                first = sinks[name]
                if name.startswith("plain_"):  # the first run appends, as in "append"
                    first = (PlainDeltaAppend(t.delta) if t.delta
                             else PlainPostgres(pg.url, name, False))  # fmt: skip
                df = spark.read.schema(SCHEMA).json(str(where))
                done = ft.run_batch(pipeline(name, where, first), df, batch_id)
                assert done.fresh == records and done.failed == 0, done
                t.rows += records
                assert t.count(pg.url) == t.rows, (name, t.count(pg.url), t.rows)
                reruns[name] = (pipeline(name, where, sinks[name]), df, batch_id)
                if t.pg:
                    with psycopg.connect(pg.url, autocommit=True) as c:
                        c.execute(f"VACUUM ANALYZE {name}")
            operations: dict[str, set[str]] = {name: set() for name in tables}

            def variant(name: str) -> Callable[[], Any]:
                t = tables[name]
                if name in reruns:  # the same batch id on the same files: run again
                    pipe, df, batch_id = reruns[name]
                    added = 0
                else:
                    where, batch_id, added = linked(name), next(batch_ids), records
                    pipe = pipeline(name, where, sinks[name])
                    df = spark.read.schema(SCHEMA).json(str(where))
                version = t.version()

                def job() -> Callable[[], None]:
                    result = ft.run_batch(pipe, df, batch_id)

                    def check() -> None:  # after the clock stopped
                        assert result.fresh == records and result.failed == 0, result
                        t.rows += added
                        rows = t.count(pg.url)
                        assert rows == t.rows, f"{name}: {rows} rows, expected {t.rows}"
                        ops = t.operations(version)
                        assert added or "WRITE" not in ops, f"{name} appended: {ops}"
                        operations[name].update(ops)

                    return check

                return job

            rounds = PairedRounds(PAIRS, warmup)
            for rnd in range(warmup + repeat):
                rounds.round(rnd, variant)
            rows = {name: t.count(pg.url) for name, t in tables.items()}
            assert rows == {name: t.rows for name, t in tables.items()}, rows
            if ft.layer is not None:
                ft.layer.clear()
            ft.close()
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return rounds.result(
        "sink_overhead", records, width, "JSON files kept by reference, read each run",
        repeat, RATIOS, GOALS, table_rows_at_end=rows, rows_checked_runs=2 * len(PAIRS) * (
            warmup + repeat),
        delta_commit_operations={k: sorted(v) for k, v in operations.items() if v},
    )  # fmt: skip


def verdict(r: dict[str, Any]) -> list[str]:
    """The goals not met, one line each (empty: all met)."""
    return goals_unmet(r, RATIOS, GOALS)


def text(r: dict[str, Any]) -> str:
    lines = [f"{r['records']:,} records a run, {r['payload_bytes']} B payloads, "
             f"{r['repeat']} rounds (+{r['warmup']} warm-up); row counts checked after "
             f"each of {r['rows_checked_runs']} runs"]  # fmt: skip
    rates = r["records_per_s"]
    for k, b in PAIRS.items():
        q = r["ratio_quartiles"][k]
        goal = f"; goal {GOALS[k]}" if k in GOALS else ""
        lines.append(f"  {k:16s} {rates[k]:>9,} rec/s  {b:22s} {rates[b]:>9,} rec/s  "
                     f"ratio {r[RATIOS[k]]} (quartiles {q[0]}-{q[1]}{goal})")  # fmt: skip
    lines.append(f"  table rows at the end: {r['table_rows_at_end']}")
    lines.append(f"  Delta commits: {r['delta_commit_operations']}")
    return "\n".join(lines + [f"  goal not met: {line}" for line in verdict(r)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    paired_args(ap, records=100_000, repeat=5, warmup=1)
    args = parse_args(ap)
    r = run(args.records, args.payload_bytes, args.repeat, args.warmup, args.redis_url)
    save("sink_overhead", r)
    print(json.dumps(r) if args.json else text(r))


if __name__ == "__main__":
    main()
