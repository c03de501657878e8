"""Lineage ids (ftlayer.lineage): one id per source record, the same in every replay and
re-drive; real Spark (local[2]) is the oracle of the hash, real Redis keeps the records.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from probe import Probe, first_seen, wait_for
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.lineage import spark_xxhash64
from ftlayer.spark import FaultTolerance, FileSource, Outcome

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark


def test_spark_xxhash64_matches_spark(spark: SparkSession) -> None:
    """Our port of Spark's xxhash64 over longs against Spark's own, 1 to 3 columns of
    generated longs (extremes included). Catches: a lineage id computed in Python that
    differs from the one the JVM computes for the same record (a replay read back by
    reference would look like a new record to the sink)."""
    rng = np.random.default_rng(7)
    n = 2000
    cols = {c: rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
            for c in "abc"}  # fmt: skip
    for c in cols.values():
        c[:4] = [0, -1, 2**63 - 1, -(2**63)]
    df = spark.createDataFrame(pa.table(cols))
    got = df.select(F.xxhash64("a").alias("h1"), F.xxhash64("a", "b").alias("h2"),
                    F.xxhash64(F.lit(5).cast("long"), "b", "c").alias("h3")).toArrow()  # fmt: skip
    assert got.column("h1").to_numpy().tolist() == spark_xxhash64(cols["a"]).tolist()
    assert got.column("h2").to_numpy().tolist() == spark_xxhash64(cols["a"], cols["b"]).tolist()
    want = spark_xxhash64(np.int64(5), cols["b"], cols["c"])
    assert got.column("h3").to_numpy().tolist() == want.tolist()


def _write_json(path: Path, ids: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"id": i, "key": i % 13}) + "\n" for i in ids))
    tmp.rename(path)


def _seen(probe: Probe, tag: str) -> dict[int, list[int]]:
    """id -> the lineage ids it was seen with, in order."""
    out: dict[int, list[int]] = defaultdict(list)
    for item in probe.r.lrange(f"{probe.prefix}:{tag}", 0, -1):
        i, lin = item.decode().split(":")
        out[int(i)].append(int(lin))
    return out


def _note(probe: Probe, tag: str, ids: Any, lineage: Any) -> None:
    if len(ids):
        items = [f"{i}:{v}" for i, v in zip(ids.tolist(), lineage.tolist(), strict=True)]
        probe.r.rpush(f"{probe.prefix}:{tag}", *items)


def _vectorized(ft: FaultTolerance, probe: Probe, reads: Any = None) -> Any:
    """source stage noting ctx.lineage -> keyed shuffle -> a stage failing id % 7 == 3
    once -> a sink leaving id % 11 == 5 unconfirmed once, noting its lineage column."""

    def first(b: pa.RecordBatch, ctx: Any) -> pa.RecordBatch:
        _note(probe, "ctx", b.column("id").to_numpy(), ctx.lineage)
        return b

    def second(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        failed = first_seen(probe, "s2", ids, ids % 7 == 3)
        return Outcome(b, failed=failed, errors="fails once")

    def sink(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        _note(probe, "sink", ids, b.column("lin").to_numpy())
        unc = first_seen(probe, "unc", ids, ids % 11 == 5)
        return Outcome(None, unconfirmed=unc)

    return (ft.pipeline(source=0, reads=reads)
            .map_batches(first, "id long, key long")
            .partition_by(["key"], 3)
            .map_batches(second, "id long, key long")
            .sink_batches(sink, lineage="lin"))  # fmt: skip


def _check_stable(probe: Probe, n: int) -> dict[int, int]:
    """Every record reached the sink with one lineage id in all its writes and all its
    stages' contexts; no two records share one. Returns id -> lineage id."""
    sink, ctx = _seen(probe, "sink"), _seen(probe, "ctx")
    assert set(sink) == set(range(n)), "records lost"
    assert any(len(v) > 1 for v in sink.values()), "no record was written twice"
    lineage = {}
    for i in range(n):
        assert len(set(sink[i] + ctx[i])) == 1, f"record {i}: lineage ids {sink[i]} {ctx[i]}"
        lineage[i] = sink[i][0]
    assert len(set(lineage.values())) == n, "two records share a lineage id"
    return lineage


@pytest.mark.parametrize("kept", ["copy", "reference"])
def test_lineage_is_stable_through_replays_on_the_vectorized_path(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path, kept: str
) -> None:
    """A streaming query on JSON files whose records fail past a shuffle, or are left
    unconfirmed by the sink, and replay: each record shows one lineage id to its source
    stage's context and to the sink in every attempt; a record kept by reference has
    Spark's xxhash64(source, location, position). Catches: a replay given a new lineage id
    (the sink could not tell it from a new record), an id lost across the shuffle, the
    driver and the tasks computing different ids."""
    ft = make_ft(timeout_s=2.0, max_replays=3)
    n = 600
    _write_json(tmp_path / "in" / "a.json", range(n))
    reads = FileSource("json", str(tmp_path / "in"), "id long, key long") if kept == "reference" \
        else None  # fmt: skip
    pipeline = _vectorized(ft, probe, reads)
    stream = (pipeline.stream(spark) if reads is not None else pipeline.with_replays(
        spark.readStream.schema("id long, key long").json(str(tmp_path / "in"))))
    query = (stream.writeStream.foreachBatch(pipeline).trigger(processingTime="1 second")
             .option("checkpointLocation", str(tmp_path / "ck")).start())  # fmt: skip
    try:
        assert ft.layer is not None
        wait_for(lambda: len(_seen(probe, "sink")) == n and ft.layer.stats().pending == 0,
                 90, "every record written, nothing pending")  # fmt: skip
    finally:
        query.stop()
    lineage = _check_stable(probe, n)
    if reads is not None:
        files = spark.read.schema("id long, key long").json(str(tmp_path / "in"))
        loc, pos = reads.reference(files)
        want = files.select("id", F.xxhash64(F.lit(0).cast("long"), loc, pos).alias("h"))
        assert {r["id"]: r["h"] for r in want.collect()} == lineage
