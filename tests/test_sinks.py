"""The idempotent sinks (ftlayer.sinks) against a real PostgreSQL server and real Delta
tables (delta-rs), without Spark: one row per lineage id whatever writes again, whoever
writes at once. The pipeline-level proofs (a driver killed mid-run, duplicates counted
from the table) are in tests/spark/test_crash_driver.py.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from benchmarks._postgres import LocalPostgres
from ftlayer.errors import ConfigError
from ftlayer.sinks import DeltaSink, PostgresSink


def rows(lo: int, hi: int, lineage: str = "lineage_id") -> pa.RecordBatch:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.RecordBatch.from_pydict({
        lineage: pa.array(ids * 7919 - 10**12), "id": pa.array(ids),
        "name": pa.array([f"r{i}" for i in ids]), "amount": pa.array(ids * 0.5)})  # fmt: skip


def pg_rows(url: str, table: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as c:
        return c.execute(f"SELECT id, lineage_id, name FROM {table} ORDER BY id").fetchall()


def delta_ids(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("id").to_pylist())


def overlapping_writers(sink: Any, writers: int = 8) -> list[str]:
    """``writers`` threads each writing 150 rows, each overlapping the next by 50, all
    starting at once (a barrier: the first writes of a table race its creation)."""
    errors: list[str] = []
    start = threading.Barrier(writers)

    def write(k: int) -> None:
        start.wait()
        try:
            sink(rows(k * 100, k * 100 + 150))
        except Exception as e:  # collected: the test fails naming it
            errors.append(repr(e))

    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors


def test_postgres_sink_writes_each_lineage_once(postgres: LocalPostgres) -> None:
    """A batch written again, a batch overlapping it and one holding a record twice leave
    one row per lineage id; the sink counts what it skipped. Catches: a replay written
    twice, a row lost because another row of its batch was a duplicate."""
    table = f"t{uuid.uuid4().hex[:8]}"
    sink = PostgresSink(postgres.url, table, create=True)
    sink(rows(0, 100))
    sink(rows(0, 100))
    sink(rows(50, 150))
    twice = pa.Table.from_batches([rows(150, 160), rows(155, 165)]).combine_chunks()
    sink(twice.to_batches()[0])  # one write holding a record twice
    got = pg_rows(postgres.url, table)
    assert [r[0] for r in got] == list(range(165))
    assert sink.inserted == 165 and sink.skipped == 155


def test_postgres_sink_concurrent_writers(postgres: LocalPostgres) -> None:
    """Eight sessions writing overlapping rows at once (the table created by whichever
    comes first): one row per lineage id. Catches: a race between two writers' checks
    (the unique key decides, not a read), the table's creation failing a writer."""
    for _ in range(3):  # three fresh tables: three races of the creation
        table = f"t{uuid.uuid4().hex[:8]}"
        assert overlapping_writers(PostgresSink(postgres.url, table, create=True)) == []
        assert [r[0] for r in pg_rows(postgres.url, table)] == list(range(850))


def test_postgres_sink_rides_out_a_server_restart(postgres: LocalPostgres) -> None:
    """The server is killed (``kill -9``) after a write and comes back 1 s later: the
    next write reconnects and lands, retried whole (it skips nothing it had not
    written). Catches: a dead pooled connection failing every later write of the
    worker, a retry that gives up before the server is back."""
    table = f"t{uuid.uuid4().hex[:8]}"
    sink = PostgresSink(postgres.url, table, create=True, attempts=12)
    sink(rows(0, 10))
    postgres.kill()
    threading.Timer(1.0, postgres.start).start()
    sink(rows(5, 20))
    assert [r[0] for r in pg_rows(postgres.url, table)] == list(range(20))


def test_postgres_sink_errors_name_the_problem(postgres: LocalPostgres) -> None:
    """No lineage column in the batch, or a table without a unique key on it: a clear
    error, nothing written. Catches: a sink that writes duplicates silently because its
    table cannot deduplicate."""
    table = f"t{uuid.uuid4().hex[:8]}"
    with pytest.raises(ConfigError, match="no column \\['lineage_id'\\]"):
        PostgresSink(postgres.url, table, create=True)(rows(0, 3, lineage="other"))
    with psycopg.connect(postgres.url) as c:
        c.execute(f"CREATE TABLE {table} (lineage_id bigint, id bigint, name text, "
                  "amount double precision)")  # fmt: skip
    with pytest.raises(psycopg.errors.InvalidColumnReference, match="ON CONFLICT"):
        PostgresSink(postgres.url, table)(rows(0, 3))
    assert pg_rows(postgres.url, table) == []


def test_postgres_sink_key_columns_keep_several_rows_of_one_record(
    postgres: LocalPostgres,
) -> None:
    """``key=["item"]``: rows of one record (one lineage id) told apart by ``item`` are
    all kept, and a replay of them is skipped. Catches: a fan-out stage's rows collapsed
    into one."""
    table = f"t{uuid.uuid4().hex[:8]}"
    sink = PostgresSink(postgres.url, table, key=["item"], create=True)
    batch = pa.RecordBatch.from_pydict({"lineage_id": pa.array([1, 1, 1, 2], pa.int64()),
                                        "item": pa.array([0, 1, 2, 0], pa.int64())})
    sink(batch)
    sink(batch)
    with psycopg.connect(postgres.url) as c:
        assert c.execute(f"SELECT count(*) FROM {table}").fetchone() == (4,)


def test_delta_sink_writes_each_lineage_once(tmp_path: Path) -> None:
    """The first write creates the table; a repeat, an overlapping write and a write
    holding a record twice add only the new lineage ids, once. Catches: the merge
    inserting matched rows or a source row twice (a record's re-run and its replay in one
    batch), the creating write and the merges disagreeing on the key."""
    path = tmp_path / "t"
    sink = DeltaSink(str(path))
    sink(rows(0, 100))
    sink(rows(0, 100))
    sink(rows(50, 150))
    twice = pa.Table.from_batches([rows(150, 160), rows(155, 165)]).combine_chunks()
    sink(twice.to_batches()[0])  # one write holding a record twice: its first row kept
    assert delta_ids(path) == list(range(165))
    assert sink.inserted == 165 and sink.skipped == 155


def test_delta_sink_concurrent_writers(tmp_path: Path) -> None:
    """Eight writers merging overlapping rows into one table at once, the table created
    by whichever commits version 0: each conflicting commit is retried against the new
    version and skips what landed. Catches: duplicates from two merges that both read
    the table before either committed, a writer failing on the creation race."""
    for round_ in range(4):  # a race: several rounds, each on a new table
        path = tmp_path / f"t{round_}"
        assert overlapping_writers(DeltaSink(str(path))) == []
        assert delta_ids(path) == list(range(850))


def test_a_batch_run_again_is_told_from_a_new_one(layer: Any) -> None:
    """The driver asks Redis whether a batch id began before (its rows may then have
    reached a sink: ``BatchContext.written_before`` is True for all of them). Catches: a
    batch re-run after a driver crash taken for a first run (its rows appended again)."""
    seg = layer.segments
    assert seg.run_again(0, "5") is False
    assert seg.run_again(0, "5") is True, "the same batch id again: a re-run"
    assert seg.run_again(0, "6") is False and seg.run_again(1, "6") is False
    assert seg.run_again(0, "6") is True
