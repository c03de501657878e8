"""Replays that resume where they failed (ftlayer.stage_rows): a row failing in a
DataFrame stage is kept, in the batch's own job, as the input of the segment it failed in,
and its replay enters there -- its source not read again, the stages before that segment
not run again. Real files read by real Spark (local[2]), real Redis.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.spark import FaultTolerance, FileSource, Outcome
from ftlayer.spark.references import with_references
from tests.spark.probe import Counted, FailsOnce, FanOut, Probe, calls, first_seen, times_seen

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

SCHEMA = "id long, key long, amount string, at timestamp, tags array<string>"
KEYS, MISSING = 29, {4, 11}


def at(i: int) -> str:
    return f"2026-01-02T03:04:{i % 60:02d}.{i:06d}Z"


def write_events(path: Path, ids: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"id": i, "key": i % KEYS, "amount": f"{i}.5", "at": at(i),
             "tags": [f"t{i % 3}", "x"]} for i in ids]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_regions(path: Path, skip: set[int]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"key": k, "region": f"r{k % 3}"} for k in range(KEYS) if k not in skip]
    (path / f"regions-{time.monotonic_ns()}.json").write_text(
        "".join(json.dumps(r) + "\n" for r in rows))


def missing_regions(tmp_path: Path, n: int,
                    halves: bool = False) -> tuple[Path, Path, FileSource]:  # fmt: skip
    """``n`` events in one file (``halves``: two, a micro-batch each) and regions missing
    the keys MISSING: (the regions' directory, the output directory, the events'
    FileSource)."""
    if halves:
        write_events(tmp_path / "in" / "a.json", range(0, n // 2))
        write_events(tmp_path / "in" / "b.json", range(n // 2, n))
    else:
        write_events(tmp_path / "in" / "a.json", range(n))
    regions, out = tmp_path / "regions", tmp_path / "out"
    write_regions(regions, skip=MISSING)
    per_trigger = {"maxFilesPerTrigger": 1} if halves else {}
    return regions, out, FileSource("json", str(tmp_path / "in"), SCHEMA, **per_trigger)


def failing_ids(n: int) -> tuple[set[int], set[int]]:
    """The ids of ``n`` events whose key has no region (MISSING), and those of them in the
    first of two files (``missing_regions(..., halves=True)``: the first micro-batch)."""
    failing = {i for i in range(n) if i % KEYS in MISSING}
    return failing, {i for i in failing if i < n // 2}


def lookup(regions: Path) -> Any:
    """Segment 1's stage: the region of each key (a left join); a key without one fails."""

    def enrich(df: DataFrame) -> DataFrame:
        table = df.sparkSession.read.schema("key long, region string").json(str(regions))
        return df.join(F.broadcast(table), "key", "left").drop("amount")

    return enrich


def pipeline_of(ft: FaultTolerance, probe: Probe, regions: Path, out: Path, files: Any,
                first: Any = None, replay_from: str = "stage") -> Any:  # fmt: skip
    return (
        ft.pipeline(reads=files, name="resume", replay_from=replay_from)
        .map_batches(first or Counted(probe, "s1"), SCHEMA)
        .partition_by(["key"], 4)
        .transform(lookup(regions), failed="region IS NULL", errors="no region for its key")
        .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out)))
    )  # fmt: skip


def run_stream(spark: SparkSession, pipeline: Any, files: Any, ck: Path) -> None:
    """The files through ``pipeline`` without the replay stream: the failures wait."""
    stream = with_references(files, files.stream(spark))
    query = (stream.writeStream.foreachBatch(pipeline)
             .trigger(availableNow=True).option("checkpointLocation", str(ck)).start())  # fmt: skip
    assert query.awaitTermination(120), "the availableNow query did not end"
    assert query.exception() is None, query.exception()


def written(spark: SparkSession, out: Path) -> list[dict[str, Any]]:
    return [r.asDict() for r in spark.read.parquet(str(out)).collect()]


def regions_arrive(spark: SparkSession, ft: FaultTolerance, pipeline: Any, regions: Path,
                   out: Path, n: int) -> int:  # fmt: skip
    """Every key's region written, the replays drained through ``pipeline``: every one of
    the ``n`` records landed once. The batches before the drain (its results follow)."""
    write_regions(regions, skip=set())
    before = len(ft.results)
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    got = Counter(r["id"] for r in written(spark, out))
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    return before


def test_rows_failing_past_the_shuffle_resume_there_without_reading_the_source(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Rows whose key has no region fail in segment 1 (after the keyed shuffle) until the
    regions arrive; the drain then replays them. Their replays enter before segment 1:
    no source file is read back, the Python stage before the shuffle ran once per id,
    every record lands once, with its timestamp to the microsecond and its array as
    written. Catches: replays read back from the source (or the stages before the
    shuffle run again), a kept row's values changed on the way (types, precision), a
    kept replay not run or counted twice."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 1500
    regions, out, files = missing_regions(tmp_path, n, halves=True)
    pipeline = pipeline_of(ft, probe, regions, out, files)
    run_stream(spark, pipeline, files, tmp_path / "ck")
    failing = {i for i in range(n) if i % KEYS in MISSING}
    assert ft.layer is not None and ft.layer.stats().queued_replays == len(failing)
    write_regions(regions, skip=set())
    drained = ft.drain(timeout_s=60, pipeline=pipeline)
    assert drained.drained, drained
    rows = written(spark, out)
    got = Counter(r["id"] for r in rows)
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    for r in rows:
        if r["id"] in failing:
            assert r["at"].strftime("%S.%f") == at(r["id"])[17:26], r
            assert r["tags"] == [f"t{r['id'] % 3}", "x"] and r["region"], r
    assert sum(r.read_back for r in ft.results) == 0, "a replay read its source again"
    replays = sum(r.replayed for r in ft.results)  # batch 1 claims batch 0's failures too
    assert replays >= len(failing) and sum(r.entered for r in ft.results) == replays
    assert set(calls(probe, "s1").values()) == {1}, "the stage before the shuffle ran again"
    assert ft.layer.stats().pending == 0


def test_a_batch_of_stage_rows_only_starts_its_plan_at_their_entry(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """The same failures in segment 1, behind a DataFrame stage in segment 0; the drain's
    batches hold only stage rows entering before segment 1. Their plan starts there: the
    driver does not build segment 0 for them (its function is not called), and every
    record lands once, none read back. Catches: the tail of a query building (and
    running over no rows) the segments before its replays' entry, or a row entered
    twice or not at all when the plan starts at its entry."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 900
    regions, out, files = missing_regions(tmp_path, n, halves=True)
    built: list[int] = []

    def first(df: DataFrame) -> DataFrame:  # segment 0, built by the driver each batch
        built.append(1)
        return df.withColumn("amount", F.upper("amount"))

    pipeline = (ft.pipeline(reads=files, name="tail").transform(first)
                .partition_by(["key"], 4)
                .transform(lookup(regions), failed="region IS NULL",
                           errors="no region for its key")
                .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    run_stream(spark, pipeline, files, tmp_path / "ck")
    streamed = len(built)
    failing = {i for i in range(n) if i % KEYS in MISSING}
    write_regions(regions, skip=set())
    before = len(ft.results)
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    tail = ft.results[before:]
    assert tail and all(r.fresh == 0 and r.entered == r.replayed > 0 for r in tail), tail
    assert len(built) == streamed, "segment 0 was built for a batch of stage rows only"
    got = Counter(r["id"] for r in written(spark, out))
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    assert sum(r.entered for r in tail) == len(failing)  # each still failed before
    assert sum(r.read_back for r in ft.results) == 0
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_replays_read_back_that_fail_again_in_the_first_segment_keep_their_values(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """Rows failing in segment 0 (a DataFrame stage before the shuffle, the source kept
    by reference) go back to their source; the next micro-batch reads them back and they
    fail again: now they are kept as segment 0's input, and once the regions arrive their
    replays enter there. Each failing record is read back from its file once, not once
    per failed attempt, and lands once with its timestamp to the microsecond and its
    array as written. Catches: a replay read back for every attempt (a pass over its
    file each time), kept values changed on the way, a fresh row's null copies kept in
    place of its reference (it would land with nulls, or not at all)."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 900
    regions, out, files = missing_regions(tmp_path, n, halves=True)
    pipeline = (ft.pipeline(reads=files, name="first")
                .transform(lookup(regions), failed="region IS NULL",
                           errors="no region for its key")
                .partition_by(["key"], 4)
                .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    run_stream(spark, pipeline, files, tmp_path / "ck")  # batch 1 reads batch 0's back
    failing, first_half = failing_ids(n)
    assert sum(r.kept_again for r in ft.results) == len(first_half), ft.results
    write_regions(regions, skip=set())
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    rows = written(spark, out)
    got = Counter(r["id"] for r in rows)
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    for r in rows:
        assert r["at"].strftime("%S.%f") == at(r["id"])[17:26], r
        assert r["tags"] == [f"t{r['id'] % 3}", "x"] and r["region"], r
    assert sum(r.read_back for r in ft.results) == len(failing), "read back again"
    assert sum(r.entered for r in ft.results) == len(first_half)
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_read_back_replays_of_which_few_fail_again_are_all_kept_within_the_bound(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """The same first-segment failures (keys 4 and 11), ``max_kept_bytes`` below what the
    replays read back in the next micro-batch would take if all failed again, and the
    region of key 4 arriving between the two micro-batches: only key 11's replays fail
    again, fewer than the bound holds, and all of them are kept (a cap counted in the
    job), none read back a second time; every record lands once. Catches: the keeping of
    read-back replays sized as if every one failed again (a share of those failing
    kept, the rest read back: a pass over their files for a few rows)."""
    from ftlayer.spark.frame_entries import WIDTH

    n = 1800
    regions, out, files = missing_regions(tmp_path, n, halves=True)
    failing, first_half = failing_ids(n)
    again = {i for i in first_half if i % KEYS == 11}
    ft = make_ft(timeout_s=5.0, max_replays=3,
                 max_kept_bytes=(len(again) + len(first_half)) // 2 * WIDTH)

    def sink(df: DataFrame, batch_id: int) -> None:
        df.write.mode("append").parquet(str(out))
        if batch_id == 0:  # key 4's region arrives before the next micro-batch
            for old in regions.iterdir():
                old.unlink()
            write_regions(regions, skip={11})

    pipeline = (ft.pipeline(reads=files, name="few")
                .transform(lookup(regions), failed="region IS NULL",
                           errors="no region for its key")
                .partition_by(["key"], 4).sink_dataframe(sink))  # fmt: skip
    run_stream(spark, pipeline, files, tmp_path / "ck")
    assert sum(r.kept_again for r in ft.results) == len(again), ft.results
    regions_arrive(spark, ft, pipeline, regions, out, n)
    second_half = {i for i in failing - first_half if i % KEYS == 11}
    assert sum(r.read_back for r in ft.results) == len(first_half) + len(second_half)
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_rows_kept_before_segment_0_go_back_to_their_source_for_python_stages(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Replays read back that failed again before segment 0 are kept in DataFrame stages'
    form; the drain then runs the same source through Python stages (the pipeline
    changed kind between runs: entry 0's fingerprint names the source alone). The kept
    rows cannot enter there: they go back to their source, are read back through the
    new stage and land. Catches: stage rows taken in by a stage kind that never enters
    them before segment 0 (claimed, never run, timed out round after round)."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 900
    regions, out, files = missing_regions(tmp_path, n, halves=True)
    frames = (ft.pipeline(reads=files, name="kinds")
              .transform(lookup(regions), failed="region IS NULL",
                         errors="no region for its key")
              .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    run_stream(spark, frames, files, tmp_path / "ck")
    failing, first_half = failing_ids(n)
    assert sum(r.kept_again for r in ft.results) == len(first_half)
    python = (ft.pipeline(reads=files, name="kinds").map_batches(Counted(probe, "py"), SCHEMA)
              .sink_batches(lambda b: None))
    assert ft.drain(timeout_s=60, pipeline=python).drained
    assert set(calls(probe, "py")) == failing, "the replays did not all run"
    assert sum(r.entered for r in ft.results) == 0
    assert sum(r.read_back for r in ft.results) == len(failing) + len(first_half)
    assert ft.layer is not None and ft.layer.stats().pending == 0


class FailsUntilOpen:
    """A batch stage failing the rows whose key is in MISSING until the probe's ``open``
    key is set, counting each id it sees under ``s0``."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.__name__ = "fails_until_open"

    def __call__(self, b: pa.RecordBatch) -> Any:
        ids = b.column("id").to_numpy()
        times_seen(self.probe, "s0", ids)
        shut = self.probe.r.get(f"{self.probe.prefix}:open") is None
        failed = np.isin(b.column("key").to_numpy(), list(MISSING)) & shut
        return Outcome(b, failed=failed, errors="no region yet")


def test_python_stage_replays_read_back_that_fail_again_before_the_shuffle_keep_their_values(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """A Python stage in segment 0 fails the rows of two keys until a flag opens; the
    next micro-batch reads them back and they fail again: the source task keeps them
    (msgpack maps of the source's columns) and the driver stores each in its record's
    place. Once the flag opens, the drain runs them from those values: each failing
    record is read back from its file once, and lands once. Catches: a replay read back
    for every attempt, a kept row not entering (or entering twice), values changed."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 900
    _, _, files = missing_regions(tmp_path, n, halves=True)
    pipeline = (ft.pipeline(reads=files, name="py0", immediate_replays=0)
                .map_batches(FailsUntilOpen(probe), SCHEMA)
                .partition_by(["key"], 4).sink_batches(Sunk(probe)))
    run_stream(spark, pipeline, files, tmp_path / "ck")
    failing, first_half = failing_ids(n)
    assert sum(r.kept_again for r in ft.results) == len(first_half), [
        (r.fresh, r.replayed, r.failed, r.read_back, r.kept_again, r.entered) for r in ft.results]
    probe.r.set(f"{probe.prefix}:open", 1)
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    got = Counter(probe.ids())
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    assert sorted(probe.strings("at")) == sorted(at(i)[17:26] for i in range(n))
    assert sum(r.read_back for r in ft.results) == len(failing), "read back again"
    assert sum(r.entered for r in ft.results) == len(first_half)
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_rows_kept_before_segment_0_by_python_stages_go_back_to_their_source_for_dataframe_stages(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """The reverse of the kind change: replays kept before segment 0 by a Python stage (a
    msgpack map of the source's columns), drained through DataFrame stages, go back to
    their source and land once. Catches: a Python-kept row handed to DataFrame stages'
    ``from_json`` (dead-lettered as another schema, or never run)."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 900
    _, out, files = missing_regions(tmp_path, n, halves=True)
    python = (ft.pipeline(reads=files, name="kinds2", immediate_replays=0)
              .map_batches(FailsUntilOpen(probe), SCHEMA).sink_batches(Sunk(probe)))
    run_stream(spark, python, files, tmp_path / "ck")
    failing, first_half = failing_ids(n)
    assert sum(r.kept_again for r in ft.results) == len(first_half)
    frames = (ft.pipeline(reads=files, name="kinds2").transform(lambda df: df)
              .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    assert ft.drain(timeout_s=60, pipeline=frames).drained
    got = Counter([*probe.ids(), *(r["id"] for r in written(spark, out))])
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    assert sum(r.entered for r in ft.results) == 0
    assert sum(r.read_back for r in ft.results) == len(failing) + len(first_half)
    assert ft.layer is not None and ft.layer.stats().pending == 0


class Sunk:
    """A sink writing each row's id (and its timestamp, as written) to the probe."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.__name__ = "sunk"

    def __call__(self, b: pa.RecordBatch) -> None:
        ids = b.column("id").to_pylist()
        ats = [t.strftime("%S.%f") for t in b.column("at").to_pylist()]
        if ids:
            self.probe.r.rpush(f"{self.probe.prefix}:sink", *ids)
            self.probe.r.rpush(f"{self.probe.prefix}:at", *ats)


def test_a_stage_keeps_about_max_kept_bytes_and_the_rest_go_back_to_their_source(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """The same first-segment failures with ``max_kept_bytes`` a quarter of what the
    replays read back could take if all failed again (a row taken as 2 KB until one is
    kept): about a quarter of those failing again are kept, by a hash of their identity,
    the others go back to their source and are read back once more; every record lands
    once. Catches: the byte bound ignored (a driver's heap filled by a batch's kept rows:
    a 1 GiB driver fails at about 70 MB of them), or rows left out of the share lost."""
    from ftlayer.spark.frame_entries import WIDTH

    n = 1800
    failing_first = sum(1 for i in range(n // 2) if i % KEYS in MISSING)
    ft = make_ft(timeout_s=5.0, max_replays=3, max_kept_bytes=failing_first * WIDTH // 4)
    regions, out, files = missing_regions(tmp_path, n, halves=True)
    pipeline = (ft.pipeline(reads=files, name="bound")
                .transform(lookup(regions), failed="region IS NULL",
                           errors="no region for its key")
                .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    run_stream(spark, pipeline, files, tmp_path / "ck")
    kept = sum(r.kept_again for r in ft.results)
    assert 0 < kept < failing_first // 2, (kept, failing_first)
    regions_arrive(spark, ft, pipeline, regions, out, n)
    failing = sum(1 for i in range(n) if i % KEYS in MISSING)
    assert sum(r.read_back for r in ft.results) == failing + failing_first - kept
    assert ft.layer is not None and ft.layer.stats().pending == 0


@pytest.mark.parametrize("wide", [False, True], ids=["narrow", "wider_than_assumed"])
def test_a_stage_with_no_history_keeps_at_most_its_row_cap_in_its_first_batch(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path, wide: bool
) -> None:
    """A DataFrame stage past the shuffle fails about 100 rows in its very first batch,
    where no earlier batch tells how many of its rows fail or how wide they are:
    ``max_kept_bytes`` of 8 rows of the assumed width lets it keep 8 of them (a bounded
    ``min_by`` in the job, Spark >= 4.2), which resume at their stage; the others go back
    to their source; every record lands once. Rows wider than assumed (3 KB) are not
    kept at all. Catches: a first batch keeping every failed row whatever the bound (a
    wide batch failing whole could fill the driver's heap), rows wider than assumed kept
    past the byte bound, or rows beyond the cap lost."""
    from ftlayer.spark.frame_entries import WIDTH

    n = 1500
    ft = make_ft(timeout_s=5.0, max_replays=3, max_kept_bytes=8 * WIDTH)
    regions, out, files = missing_regions(tmp_path, n)
    if wide:  # the same events, each amount 3,000 characters long
        path = tmp_path / "in" / "a.json"
        path.write_text("".join(json.dumps({**json.loads(line), "amount": "9" * 3000}) + "\n"
                                for line in path.read_text().splitlines()))  # fmt: skip
    pipeline = pipeline_of(ft, probe, regions, out, files)
    run_stream(spark, pipeline, files, tmp_path / "ck")
    failing, _ = failing_ids(n)
    regions_arrive(spark, ft, pipeline, regions, out, n)
    major, minor = (int(x) for x in spark.version.split(".")[:2])
    kept = len(failing)  # no min_by with k (Spark < 4.2): all, as before
    if (major, minor) >= (4, 2):
        kept = 0 if wide else 8
    assert sum(r.entered for r in ft.results) == kept
    assert sum(r.read_back for r in ft.results) == len(failing) - kept
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_a_stage_whose_input_has_a_bounded_width_keeps_its_rows_by_that_width(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """The same first batch, the stage past the shuffle fed only ``id`` and ``key`` (two
    bigints: a row's kept text has a known most width, about 110 characters, not the 2 KB
    assumed of a row with strings): the same ``max_kept_bytes`` of 8 assumed rows keeps
    all of its 100-odd failed rows, and none is read back. Catches: a first batch capped
    by the width assumed for strings whatever its columns (a stage of numbers failing
    50,000 rows of 1,000,000 kept 8,192 and read the rest back: a pass over the input)."""
    from ftlayer.spark.frame_entries import WIDTH

    n = 1500
    ft = make_ft(timeout_s=5.0, max_replays=3, max_kept_bytes=8 * WIDTH)
    regions, out, files = missing_regions(tmp_path, n)
    pipeline = (ft.pipeline(reads=files, name="narrow")
                .transform(lambda df: df.drop("amount", "at", "tags")).partition_by(["key"], 4)
                .transform(lookup(regions), failed="region IS NULL",
                           errors="no region for its key")
                .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    run_stream(spark, pipeline, files, tmp_path / "ck")
    failing, _ = failing_ids(n)
    regions_arrive(spark, ft, pipeline, regions, out, n)
    assert sum(r.entered for r in ft.results) == len(failing)
    assert sum(r.read_back for r in ft.results) == 0
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_the_width_of_a_bounded_row_holds_for_sparks_widest_values(spark: SparkSession) -> None:
    """``text_width`` of columns of every bounded type is at least the length of the kept
    text Spark writes (``kept_column``: location, position, base64 of ``to_json``) for
    each type's widest values, and null where a column is unbounded. Catches: a width
    below what Spark writes (a first batch's rows dropped from its keeping as too wide,
    and read back from their source)."""
    from pyspark.sql.types import StructType

    from ftlayer.spark.frame_entries import FULL_SHARE, Kept, kept_column, text_width
    from ftlayer.spark.vector_plan import LOC_COL, POS_COL

    ddl = ("b boolean, t tinyint, s smallint, i int, l bigint, f float, d double, "
           "m decimal(38,10), dt date, ts timestamp, tn timestamp_ntz")  # fmt: skip
    df = spark.sql(
        "SELECT false b, CAST(-128 AS tinyint) t, CAST(-32768 AS smallint) s, "
        "-2147483648 i, -9223372036854775808 l, CAST(-1.1754944E-38 AS float) f, "
        "-2.2250738585072014E-308 d, "
        f"CAST('-{'9' * 28}.{'9' * 10}' AS decimal(38,10)) m, "
        "DATE'9999-12-31' dt, TIMESTAMP'9999-12-31 23:59:59.999999' ts, "
        "TIMESTAMP_NTZ'9999-12-31 23:59:59.999999' tn, "
        f"-9223372036854775808 {LOC_COL}, -9223372036854775808 {POS_COL}")
    schema = StructType.fromDDL(ddl)
    copies = tuple(f.name for f in schema.fields)
    width = text_width(schema)
    assert width is not None
    kept = Kept(1, 0, schema, 0, copies)
    text = df.agg(*kept_column(kept, F.lit(True), FULL_SHARE)).first()[0]
    assert text and len(text) <= width, (len(text), width, text)
    for column in copies:  # each alone, too: a column's own width
        one = StructType([schema[column]])
        alone = Kept(1, 0, one, 0, (column,))
        text = df.agg(*kept_column(alone, F.lit(True), FULL_SHARE)).first()[0]
        assert len(text) <= (text_width(one) or 0), (column, text)
    assert text_width(StructType.fromDDL("l bigint, s string")) is None
    assert text_width(StructType.fromDDL("a array<int>")) is None


def test_a_pipeline_built_anew_for_each_batch_keeps_its_stages_history(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """The same failures past the shuffle, over two micro-batches, the pipeline built
    anew in each (new stage objects, the same definition) under the first batch's row
    cap of 8: the second batch sizes its keeping by the first's failures (they fit the
    bound: all about 100 kept), not by the cap of a stage with no history -- though each
    batch starts a new plan cache. Catches: a stage's history kept by the stage object
    (or lost with the cache), so a job building its pipeline in its ``foreachBatch``
    pays a first batch's cap (and its cost) in every batch."""
    from ftlayer.spark.frame_entries import WIDTH

    ft = make_ft(timeout_s=5.0, max_replays=5, max_kept_bytes=8 * WIDTH)
    ft.engine.cache_entries = 0  # each batch starts a new plan cache: the history stays
    n = 1800
    regions, out, files = missing_regions(tmp_path, n, halves=True)

    def each(df: DataFrame, batch_id: int) -> None:
        pipeline_of(ft, probe, regions, out, files)(df, batch_id)

    run_stream(spark, each, files, tmp_path / "ck")
    _, first_half = failing_ids(n)
    assert len(ft.results) == 2 and ft.results[1].failed > len(first_half)
    before = regions_arrive(spark, ft, pipeline_of(ft, probe, regions, out, files), regions,
                            out, n)
    entered = sum(r.entered for r in ft.results[before:])
    assert entered == ft.results[1].failed, (entered, ft.results)
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_a_pipeline_changed_before_the_failing_segment_replays_from_the_source(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """The same failures, then the drain runs a pipeline whose stage before the shuffle is
    another function: the kept rows were kept by another version of the pipeline, so they
    go back to their source (read back, run through the new stage) and land. Catches: a
    row kept by an older pipeline entering a plan it no longer fits, or dropped."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 600
    regions, out, files = missing_regions(tmp_path, n)
    run_stream(spark, pipeline_of(ft, probe, regions, out, files), files, tmp_path / "ck")
    failing = {i for i in range(n) if i % KEYS in MISSING}

    def other_stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        times_seen(probe, "s1b", b.column("id").to_numpy())
        return b

    write_regions(regions, skip=set())
    changed = pipeline_of(ft, probe, regions, out, files, first=other_stage1)
    drained = ft.drain(timeout_s=60, pipeline=changed)
    assert drained.drained, drained
    got = Counter(r["id"] for r in written(spark, out))
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    assert sum(r.entered for r in ft.results) == 0
    assert sum(r.read_back for r in ft.results) == sum(r.replayed for r in ft.results) > 0
    assert set(calls(probe, "s1b")) == failing, "the new stage did not run the replays"


def test_replay_from_source_runs_every_stage_again(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """``replay_from="source"`` (Storm's rule): the same failures replay from their
    source records -- read back, through the stage before the shuffle again -- and land
    once. Catches: the option ignored (rows kept as a stage's input), or replays that do
    not run the stages before the failing one."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 600
    regions, out, files = missing_regions(tmp_path, n)
    pipeline = pipeline_of(ft, probe, regions, out, files, replay_from="source")
    run_stream(spark, pipeline, files, tmp_path / "ck")
    failing = {i for i in range(n) if i % KEYS in MISSING}
    regions_arrive(spark, ft, pipeline, regions, out, n)
    assert sum(r.entered for r in ft.results) == 0
    assert sum(r.read_back for r in ft.results) == len(failing)
    seen = calls(probe, "s1")
    assert {i for i, c in seen.items() if c == 2} == failing, "not every stage ran again"


def test_copies_kept_as_a_stage_input_resume_there_and_dead_letters_show_the_source(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """A source that cannot be read again (a DataFrame): rows failing past the shuffle
    resume there; a row failing before it every time (a stage that drops the column it
    checks) replays from its copy and ends in the dead letters showing its source
    columns. Catches: copies' kept rows lost (no source to go back to), a failure before
    the shuffle kept (the copy is the source row), the dead-letter view losing a row."""
    ft = make_ft(timeout_s=5.0, max_replays=1)
    n = 400
    regions, out = tmp_path / "regions", tmp_path / "out"
    write_regions(regions, skip=MISSING)
    df = spark.createDataFrame(
        [(i, i % KEYS, "n/a" if i == 7 else f"{i}.5") for i in range(n)],
        "id long, key long, amount string")  # fmt: skip

    def parse(d: DataFrame) -> DataFrame:
        return d.withColumn("amt", F.expr("try_cast(amount AS double)")).drop("amount")

    pipeline = (
        ft.pipeline(name="copies")
        .transform(parse, failed="amt IS NULL", errors="bad amount")
        .partition_by(["key"], 4)
        .transform(lookup(regions), failed="region IS NULL", errors="no region")
        .sink_dataframe(lambda d, _: d.write.mode("append").parquet(str(out)))
    )  # fmt: skip
    first = ft.run_batch(pipeline, df, 0)
    failing = {i for i in range(n) if i % KEYS in MISSING}
    assert first.failed == len(failing) + 1, first
    write_regions(regions, skip=set())
    drained = ft.drain(timeout_s=60, pipeline=pipeline)
    assert drained.dead_lettered == 1, drained
    got = Counter(r["id"] for r in written(spark, out))
    assert set(got) == set(range(n)) - {7} and max(got.values()) == 1
    assert sum(r.entered for r in ft.results) == len(failing)  # id 7 replays its copy
    letters = pipeline.dead_letters(spark).to_pylist()
    assert [(r["id"], r["amount"]) for r in letters] == [(7, "n/a")], letters
    assert np.all([r["attempts"] == 2 for r in letters])


def test_python_stage_rows_past_the_shuffle_resume_there(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Python stages over files kept by reference, nothing retried at once
    (``immediate_replays=0``): rows failing once in stage 2, after the keyed shuffle, are
    kept as its input; their replays enter there -- no file read back, stage 1 run once
    per id -- and land once, with the batch's ledger balanced (every fold 0). Catches:
    kept rows lost or replayed from the source, entered rows missing from the fold (every
    record of the batch kept pending), entered replays never completed."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 1200
    write_events(tmp_path / "in" / "a.json", range(n))
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    sink_schema = "id long, key long, amount string, at timestamp, tags array<string>"

    stage1, stage2 = Counted(probe, "s1"), FailsOnce(probe, 9, 4)

    def sink(b: pa.RecordBatch) -> None:
        ids = b.column("id").to_pylist()
        bad = [i for i, t in zip(ids, b.column("at").to_pylist(), strict=True)
               if t.strftime("%S.%f") != at(i)[17:26]]  # fmt: skip
        probe.r.rpush(f"{probe.prefix}:sink", *ids)
        if bad:
            probe.r.rpush(f"{probe.prefix}:bad_at", *bad)

    pipeline = (ft.pipeline(reads=files, name="py-resume", immediate_replays=0)
                .map_batches(stage1, sink_schema).partition_by(["key"], 4)
                .map_batches(stage2, sink_schema).sink_batches(sink))  # fmt: skip
    run_stream(spark, pipeline, files, tmp_path / "ck")
    flaky = {i for i in range(n) if i % 9 == 4}
    assert ft.layer is not None and ft.layer.stats().queued_replays == len(flaky)
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    assert Counter(probe.ids("sink")) == Counter(range(n)), "lost or duplicated"
    assert not probe.ids("bad_at"), "a kept row's timestamp changed"
    assert all(r.fold_ok for r in ft.results), "an entered row missing from the fold"
    assert sum(r.read_back for r in ft.results) == 0, "a replay read its source again"
    assert sum(r.entered for r in ft.results) == len(flaky)
    assert set(calls(probe, "s1").values()) == {1}, "stage 1 ran again"


def test_a_dead_letter_kept_at_its_stage_is_redriven_into_it(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Rows whose key has no region fail in segment 1 every time and end in the dead
    letters as stage rows (the operator's view names the segment, the reference and the
    row); once the regions arrive, ``dlq replay`` re-drives them into segment 1: they
    land without their file read back or stage 1 run again. Catches: a dead letter that
    lost its stage input, a re-drive that starts from the source or cannot enter."""
    from ftlayer.deadletters import decoded

    ft = make_ft(timeout_s=5.0, max_replays=1)
    n = 600
    regions, out, files = missing_regions(tmp_path, n)
    pipeline = pipeline_of(ft, probe, regions, out, files)
    run_stream(spark, pipeline, files, tmp_path / "ck")
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    failing = {i for i in range(n) if i % KEYS in MISSING}
    assert ft.layer is not None
    letters = ft.layer.persistence.dead_letters()
    assert len(letters) == len(failing)
    views = [decoded(d)[0] for d in letters]
    assert {v["__ft_segment"] for v in views} == {1}, views[0]
    assert {v["row"]["0"] for v in views} == failing, "the row kept is not the failed one"
    write_regions(regions, skip=set())
    first = len(ft.results)
    assert ft.layer.dlq_replay() == len(failing)
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    redriven = ft.results[first:]
    assert sum(r.entered for r in redriven) == len(failing)
    assert sum(r.read_back for r in redriven) == 0
    got = Counter(r["id"] for r in written(spark, out))
    assert set(got) == set(range(n)) and max(got.values()) == 1
    assert set(calls(probe, "s1").values()) == {1}, "stage 1 ran again"


def test_a_failed_child_resumes_alone_and_failed_siblings_go_back_to_the_source(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Stage 1 fans ids = 0 (mod 5) out into two rows; after the shuffle stage 2 fails,
    once, the second child of ids = 0 (mod 15) and both children of ids = 5 (mod 15).
    Nothing is retried at once. A lone failed child is kept and resumes alone: its
    sibling is written once and stage 1 ran once. Two failed siblings cannot be kept as
    one row: their record replays from its file through stage 1 again and both land.
    Catches: one failed sibling kept and the other lost, a lone failed child's sibling
    sent again."""
    ft = make_ft(timeout_s=5.0, max_replays=3)
    n = 900
    write_events(tmp_path / "in" / "a.json", range(n))
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    out_schema = "id long, key long, copy long"

    stage1 = FanOut(probe, KEYS)

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids, copy = b.column("id").to_numpy(), b.column("copy").to_numpy()
        tags = np.array([f"{i}:{c}" for i, c in zip(ids, copy, strict=True)])
        fails = ((ids % 15 == 0) & (copy == 1)) | (ids % 15 == 5)
        return Outcome(b, failed=first_seen(probe, "f2", tags, fails), errors="once")

    pipeline = (ft.pipeline(reads=files, name="fan-out", immediate_replays=0)
                .map_batches(stage1, out_schema).partition_by(["key"], 4)
                .map_batches(stage2, out_schema)
                .sink_batches(lambda b: probe.r.rpush(f"{probe.prefix}:sink", *[
                    f"{i}:{c}" for i, c in zip(b.column("id").to_pylist(),
                                               b.column("copy").to_pylist(), strict=True)])))
    run_stream(spark, pipeline, files, tmp_path / "ck")
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    got = Counter(probe.strings("sink"))
    want = {f"{i}:0" for i in range(n)} | {f"{i}:1" for i in range(n) if i % 5 == 0}
    assert set(got) == want, "lost rows"
    lone = {i for i in range(n) if i % 15 == 0}
    both = {i for i in range(n) if i % 15 == 5}
    assert all(got[f"{i}:0"] == 1 and got[f"{i}:1"] == 1 for i in lone), "sibling sent again"
    assert max(got.values()) == 1
    seen = calls(probe, "s1")
    assert {i for i, c in seen.items() if c > 1} == both, "stage 1 ran again for other ids"
    assert sum(r.entered for r in ft.results) == len(lone)
    assert sum(r.read_back for r in ft.results) == len(both)
