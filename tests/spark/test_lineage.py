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
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.lineage import spark_xxhash64
from ftlayer.spark import FaultTolerance, FileSource, Outcome
from tests.spark.probe import Probe, first_seen
from tests.toolkit import until

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


def _vectorized(ft: FaultTolerance, probe: Probe, reads: Any = None, unc: bool = True) -> Any:
    """source stage noting ctx.lineage -> keyed shuffle -> a stage failing id % 7 == 3
    once -> a sink leaving id % 11 == 5 unconfirmed once (``unc``), noting its lineage
    column."""

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
        left = first_seen(probe, "unc", ids, ids % 11 == 5) if unc else []
        return Outcome(None, unconfirmed=left)

    return (ft.pipeline(source=0, reads=reads, immediate_replays=0)  # replays queue
            .map_batches(first, "id long, key long")
            .partition_by(["key"], 3)
            .map_batches(second, "id long, key long")
            .sink_batches(sink, lineage="lin"))  # fmt: skip


def _check_stable(probe: Probe, n: int, rewritten: bool = True) -> dict[int, int]:
    """Every record reached the sink with one lineage id in all its writes and all its
    stages' contexts; no two records share one. Returns id -> lineage id."""
    sink, ctx = _seen(probe, "sink"), _seen(probe, "ctx")
    assert set(sink) == set(range(n)), "records lost"
    assert not rewritten or any(len(v) > 1 for v in sink.values()), "none written twice"
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
        until(lambda: len(_seen(probe, "sink")) == n and ft.layer.stats().pending == 0,
              "every record written, nothing pending", 90, 0.25)  # fmt: skip
    finally:
        query.stop()
    lineage = _check_stable(probe, n)
    if reads is not None:
        files = spark.read.schema("id long, key long").json(str(tmp_path / "in"))
        loc, pos = reads.reference(files)
        want = files.select("id", F.xxhash64(F.lit(0).cast("long"), loc, pos).alias("h"))
        assert {r["id"]: r["h"] for r in want.collect()} == lineage


@pytest.mark.parametrize("kept", ["copy", "reference"])
def test_lineage_is_stable_through_replays_with_dataframe_stages(
    spark: SparkSession, make_ft: Any, tmp_path: Path, kept: str
) -> None:
    """DataFrame stages, a keyed shuffle, a Parquet sink given ``lineage=``. The first
    write lands and then raises (every record of the batch replays: the rows come back);
    a ``transform`` holds ``id % 7 == 3`` back until a gate opens. A record written twice
    has one lineage id in both rows -- the JVM's for its first attempt, the stored one for
    its replay; held-back rows replay with theirs; a record kept by reference has Spark's
    xxhash64(source, location, position). Catches: the JVM and Python computing different
    ids for a copy or a reference, a replay's id taken from the wrong row of the broadcast
    join, two records sharing an id."""
    ft = make_ft(timeout_s=2.0, max_replays=3)
    n = 500
    _write_json(tmp_path / "in" / "a.json", range(n))
    gate, out, raised = tmp_path / "gate", tmp_path / "out", tmp_path / "raised"
    gate.mkdir()
    reads = FileSource("json", str(tmp_path / "in"), "id long, key long") if kept == "reference" \
        else None  # fmt: skip

    def held_back(df: Any) -> Any:  # rows id % 7 == 3 fail until the gate file exists
        opened = any(gate.iterdir())
        return df.withColumn("held", F.lit(not opened) & (F.col("id") % 7 == 3))

    def write(df: Any, _: int) -> None:
        df.write.mode("append").parquet(str(out))
        if not raised.exists():
            raised.touch()
            raise RuntimeError("the write landed, then the sink failed")

    pipeline = (ft.pipeline(source=0, reads=reads)
                .transform(lambda df: df.withColumn("twice", F.col("id") * 2))
                .partition_by(["key"], 3)
                .transform(held_back, failed="held", errors="held back")
                .sink_dataframe(write, lineage="lin"))  # fmt: skip
    stream = (pipeline.stream(spark) if reads is not None else pipeline.with_replays(
        spark.readStream.schema("id long, key long").json(str(tmp_path / "in"))))
    query = (stream.writeStream.foreachBatch(pipeline).trigger(processingTime="1 second")
             .option("checkpointLocation", str(tmp_path / "ck")).start())  # fmt: skip
    assert ft.layer is not None

    def rows() -> list[Any]:
        if not out.is_dir() or not any(out.glob("*.parquet")):
            return []
        return spark.read.parquet(str(out)).select("id", "lin").collect()

    held = set(range(3, n, 7))
    try:
        until(lambda: len(rows()) == 2 * (n - len(held)), "two writes", 60, 0.25)
        (gate / "open").touch()
        until(lambda: ft.layer.stats().pending == 0 and len(rows()) == 2 * n - len(held),
              "the held-back rows", 60, 0.25)  # fmt: skip
    finally:
        query.stop()
    seen: dict[int, set[int]] = defaultdict(set)
    for r in rows():
        seen[r["id"]].add(r["lin"])
    assert set(seen) == set(range(n)), "lost records"
    assert all(len(v) == 1 for v in seen.values()), "a record written with two lineage ids"
    got = {i: v.pop() for i, v in seen.items()}
    assert len(set(got.values())) == n, "two records share a lineage id"
    if reads is not None:
        files = spark.read.schema("id long, key long").json(str(tmp_path / "in"))
        loc, pos = reads.reference(files)
        want = files.select("id", F.xxhash64(F.lit(0).cast("long"), loc, pos).alias("h"))
        assert {r["id"]: r["h"] for r in want.collect()} == got


def test_a_redriven_dead_letter_keeps_its_lineage(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """``max_replays=0``: records failing past the shuffle go straight to the dead
    letters; ``dlq replay`` re-drives them while the query runs, and they reach the sink
    with the lineage id their first attempt had. Catches: a re-drive that makes the
    record look new to an idempotent sink."""
    ft = make_ft(timeout_s=2.0, max_replays=0)
    n = 300
    _write_json(tmp_path / "in" / "a.json", range(n))
    pipeline = _vectorized(ft, probe, unc=False)
    stream = pipeline.with_replays(
        spark.readStream.schema("id long, key long").json(str(tmp_path / "in")))
    query = (stream.writeStream.foreachBatch(pipeline).trigger(processingTime="1 second")
             .option("checkpointLocation", str(tmp_path / "ck")).start())  # fmt: skip
    assert ft.layer is not None
    failing = len(range(3, n, 7))
    try:
        until(lambda: ft.layer.stats().dead_letters == failing, "the dead letters", 60, 0.25)
        assert ft.layer.dlq_replay() == failing
        until(lambda: len(_seen(probe, "sink")) == n and ft.layer.stats().pending == 0,
              "the re-driven records", 60, 0.25)  # fmt: skip
    finally:
        query.stop()
    _check_stable(probe, n, rewritten=False)
    assert all(len(_seen(probe, "ctx")[i]) == 2 for i in range(3, n, 7)), "not re-driven"


def test_with_record_key_the_lineage_id_is_the_key(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """``record_key="id"``: the sink's lineage column is the key itself, in the first
    attempt and in replays. Catches: a keyed pipeline whose sink cannot deduplicate by
    the key it already has."""
    ft = make_ft(timeout_s=2.0, max_replays=3)

    def second(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        return Outcome(b, failed=first_seen(probe, "s2", ids, ids % 5 == 1), errors="once")

    def sink(b: pa.RecordBatch) -> None:
        _note(probe, "sink", b.column("id").to_numpy(), b.column("lineage_id").to_numpy())

    pipeline = (ft.pipeline(source=0, record_key="id")
                .map_batches(lambda b: b, "id long, key long")
                .partition_by(["key"], 3)
                .map_batches(second, "id long, key long")
                .sink_batches(sink, lineage="lineage_id"))  # fmt: skip
    df = spark.range(200).selectExpr("id", "id % 13 AS key")
    pipeline(df, 0)
    assert ft.drain(timeout_s=60).pending == 0
    got = _seen(probe, "sink")
    assert set(got) == set(range(200))
    assert all(v == [i] for i, v in got.items()), "lineage is not the key"
