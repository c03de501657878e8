"""Effectively once into Delta and PostgreSQL when a sink task dies after its write
committed: the Python worker killed with ``kill -9``, or the task crashed (an exception
no handler catches). Spark runs the task again, it writes the same rows again -- same
lineage ids -- and the idempotent sink keeps one row per record. Real Spark (local[2],
task retries on), real Redis, a real PostgreSQL server, real Delta tables.

The driver killed mid-batch and restarted on its checkpoint is in test_crash_driver.py.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyspark import TaskContext, cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from benchmarks._postgres import LocalPostgres
from ftlayer.sinks import DeltaSink, PostgresSink
from tests.spark.probe import Probe, TaskKilled

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

N = 4000


class DiesAfterWrite:
    """A sink writing through ``sink``, then -- once, in partition 1's first attempt --
    dying: ``kill`` (SIGKILL of its Python worker) or ``crash`` (TaskKilled)."""

    def __init__(self, sink: Any, probe: Probe, how: str) -> None:
        self.sink, self.probe, self.how = sink, probe, how
        self.ft_lineage = sink.ft_lineage

    def __call__(self, b: pa.RecordBatch, ctx: Any = None) -> None:
        self.sink(b, ctx)
        self.probe.r.rpush(f"{self.probe.prefix}:sink", *b.column("id").to_pylist())
        tc = TaskContext.get()
        if tc.partitionId() == 1 and tc.attemptNumber() == 0 and self.probe.first_time("died", 1):
            if self.how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise TaskKilled("the sink task crashed after its write committed")


@pytest.mark.parametrize("how", ["kill", "crash"])
@pytest.mark.parametrize("table", ["postgres", "delta"])
def test_a_sink_task_dying_after_its_write_leaves_no_duplicate(
    spark: SparkSession,
    make_ft: Any,
    probe: Probe,
    task_retries: int,
    postgres: LocalPostgres,
    tmp_path: Path,
    how: str,
    table: str,
) -> None:
    """``kill``: the sink runs after a keyed shuffle (its retry reads the shuffle's output);
    ``crash``: in the source task (its retry reads the input again and computes the
    lineage ids anew). Catches: a retried task writing its rows again under new lineage
    ids (duplicates in the table), a row of the dead attempt lost, a record acked before
    a write of it was confirmed."""
    ft = make_ft(timeout_s=3.0)
    name = f"t{uuid.uuid4().hex[:8]}"
    sink = (PostgresSink(postgres.url, name, create=True) if table == "postgres"
            else DeltaSink(str(tmp_path / name)))  # fmt: skip
    pipeline = ft.pipeline(source=0).map_batches(lambda b: b, "id long, key long")
    if how == "kill":
        pipeline = pipeline.partition_by(["key"], 3)
    pipeline = pipeline.sink_batches(DiesAfterWrite(sink, probe, how))
    df = spark.range(N).select("id", (F.col("id") % 17).alias("key")).repartition(2)
    ft.run_batch(pipeline, df, 0)
    report = ft.drain(timeout_s=60)
    assert report.drained and report.pending == 0, report
    assert probe.r.scard(f"{probe.prefix}:died") == 1, "the sink task died once"
    written = Counter(probe.ids())
    assert any(n > 1 for n in written.values()), "no row was written twice"
    if table == "postgres":
        with psycopg.connect(postgres.url) as c:
            ids = [r[0] for r in c.execute(f"SELECT id FROM {name}")]
    else:
        ids = DeltaTable(str(tmp_path / name)).to_pyarrow_table().column("id").to_pylist()
    got = Counter(ids)
    assert set(got) == set(range(N)), f"lost: {sorted(set(range(N)) - set(got))[:10]}"
    assert max(got.values()) == 1, f"duplicates: {sum(got.values()) - N}"
