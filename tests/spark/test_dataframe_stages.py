"""DataFrame stages (``transform``) and DataFrame sinks (``sink_dataframe``): real file
streams read by real Spark (local[2]) and written with ``df.write.parquet``, real Redis.
Failed rows are marked by a Column, observed in the write's own job, and replay.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.errors import ConfigError
from ftlayer.spark import FaultTolerance, FileSource, StageCounts
from ftlayer.spark.frame_run import holds_no_rows
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

SCHEMA = "id long, key long, amount string"


def write_json(path: Path, ids: range, bad: set[int] = frozenset()) -> None:  # type: ignore[assignment]
    """Events whose ``amount`` is a number, or ``n/a`` for the ids in ``bad``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    rows = [{"id": i, "key": i % 29, "amount": "n/a" if i in bad else f"{i}.5"} for i in ids]
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)


def write_regions(path: Path, keys: range, skip: set[int]) -> None:
    path.mkdir(parents=True, exist_ok=True)
    name = f"regions-{time.monotonic_ns()}.json"
    rows = [{"key": k, "region": f"r{k % 3}"} for k in keys if k not in skip]
    (path / name).write_text("".join(json.dumps(r) + "\n" for r in rows))



def parse(df: DataFrame) -> DataFrame:
    return df.withColumn("amt", F.expr("try_cast(amount AS double)"))


def lookup(regions: Path) -> Any:
    def enrich(df: DataFrame) -> DataFrame:
        table = df.sparkSession.read.schema("key long, region string").json(str(regions))
        return df.join(F.broadcast(table), "key", "left")

    return enrich


def written(spark: SparkSession, out: Path) -> Counter[int]:
    if not out.is_dir() or not any(out.glob("*.parquet")):
        return Counter()
    return Counter(r["id"] for r in spark.read.parquet(str(out)).select("id").collect())


def test_rows_failing_before_and_after_a_shuffle_replay_into_a_parquet_sink(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """Stage 1 parses ``amount`` with ``try_cast`` (``n/a`` fails, every time: dead
    letters naming the value); after a keyed shuffle stage 2 joins a lookup table that
    misses two keys until the test adds them (their rows fail, then replay and land). The
    Parquet read back is the source minus the dead letters, each once. Catches: failed
    rows written anyway or lost, replays that never run on a quiet stream, dead letters
    without their error, a failed row counted twice."""
    ft = make_ft(timeout_s=2.0, max_replays=2)
    n, bad = 1200, {i for i in range(1200) if i % 97 == 5}
    write_json(tmp_path / "in" / "a.json", range(0, n // 2), bad)
    write_json(tmp_path / "in" / "b.json", range(n // 2, n), bad)
    regions, out = tmp_path / "regions", tmp_path / "out"
    write_regions(regions, range(29), skip={4, 11})
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    pipeline = (
        ft.pipeline(reads=files, name="df-stages")
        .transform(parse, failed=F.col("amt").isNull(),
                   errors=F.concat(F.lit("bad amount "), F.col("amount")))
        .partition_by(["key"], 4)
        .transform(lookup(regions), failed="region IS NULL", errors="no region for its key")
        .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out)))
    )  # fmt: skip
    query = (
        pipeline.stream(spark).writeStream.foreachBatch(pipeline)
        .trigger(processingTime="1 second")
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    )  # fmt: skip
    assert ft.layer is not None
    missing = {i for i in range(n) if i % 29 in (4, 11) and i not in bad}
    try:
        until(lambda: sum(written(spark, out).values()) >= n - len(bad) - len(missing),
              "the first batch", 60, 0.25)  # fmt: skip
        assert not set(written(spark, out)) & missing, "a failed row was written"
        write_regions(regions, range(29), skip=set())
        until(lambda: ft.layer.stats().pending == 0, "nothing pending", 60, 0.25)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    got = written(spark, out)
    assert set(got) == set(range(n)) - bad, "lost records, or dead letters written"
    assert all(c == 1 for c in got.values()), "duplicates"
    letters = pipeline.dead_letters(spark)
    assert sorted(letters.column("id").to_pylist()) == sorted(bad)
    for row in letters.to_pylist():
        assert row["amount"] == "n/a" and row["attempts"] == 3, row
        assert "transform[0.0] parse" in row["error"] and "bad amount n/a" in row["error"]
    st = ft.layer.stats()
    assert st.dead_letters == len(bad) and st.pending == 0
    stages: dict[str, StageCounts] = {}
    for r in ft.results:  # each failed row counted, in its stage, as replayed or dead
        for label, c in r.stages.items():
            stages.setdefault(label.split("]")[0] + "]", StageCounts()).add(c)
    parse_c, lookup_c = stages["transform[0.0]"], stages["transform[1.0]"]
    assert (parse_c.replayed, parse_c.dead_lettered) == (2 * len(bad), len(bad)), parse_c
    assert lookup_c.dead_lettered == 0 and lookup_c.replayed >= len(missing), lookup_c
    for c in (parse_c, lookup_c):
        assert c.failed == c.replayed + c.dead_lettered, c


def test_a_sink_write_that_fails_for_real_replays_the_batch(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """The sink's output path is a plain file, so ``df.write.parquet`` fails (for real:
    Hadoop cannot make a directory there); the test then removes it. Every record of the
    failed batch replays and lands once. Catches: a failed write's rows acked (lost), the
    stream dying on the sink's error, replays that never come."""
    ft = make_ft(timeout_s=2.0, max_replays=5)
    n = 400
    write_json(tmp_path / "in" / "a.json", range(n))
    out = tmp_path / "out"
    out.write_text("not a directory")
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    results: list[Any] = []
    empty: list[bool] = []

    def each(df: DataFrame, batch_id: int) -> None:
        empty.append(holds_no_rows(df))
        results.append(ft.run_batch(pipeline, df, batch_id))

    pipeline = (
        ft.pipeline(reads=files, name="df-sink-fails")
        .transform(parse, failed="amt IS NULL")
        .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out)))
    )
    query = (
        pipeline.stream(spark).writeStream.foreachBatch(each)
        .trigger(processingTime="1 second")
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    )  # fmt: skip
    assert ft.layer is not None
    try:
        until(lambda: results and results[0].failed == n, "the failed first batch", 60, 0.25)
        assert "sink_dataframe" in results[0].errors[0], results[0].errors
        out.unlink()
        until(lambda: sum(written(spark, out).values()) >= n and ft.layer.stats().pending == 0,
              "the replays", 60, 0.25)  # fmt: skip
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    got = written(spark, out)
    assert set(got) == set(range(n)) and all(c == 1 for c in got.values())
    assert ft.layer.stats().dead_letters == 0
    # the replays came in micro-batches of their own, which the engine knew held no rows
    # of the source (planned as a drain's batch, without the source's branch)
    assert len(empty) > 1 and not empty[0] and all(empty[1:]), empty
    assert not holds_no_rows(spark.read.parquet(str(out)))  # not a micro-batch


@pytest.mark.parametrize(("stage", "says"), [
    (lambda df: df.select("id", "key"), "dropped"),
    (lambda df: df.groupBy("key").agg(F.max("__ft_loc").alias("__ft_loc"),
                                      F.max("__ft_pos").alias("__ft_pos")),
     "recomputed or aggregated"),
    (lambda df: df.withColumn("__ft_pos", F.col("__ft_pos") + 1), "recomputed or aggregated"),
])  # fmt: skip
def test_a_stage_that_loses_the_identity_is_refused_naming_it(
    spark: SparkSession, make_ft: Any, tmp_path: Path, stage: Any, says: str
) -> None:
    """A stage dropping, aggregating or recomputing the identity columns is refused before
    anything runs, with one line naming it. Catches: records silently untracked (acked
    by a sink that never saw them), an error that does not say which stage."""
    ft = make_ft()
    write_json(tmp_path / "in" / "a.json", range(50))
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    pipeline = (ft.pipeline(reads=files, name="refused").transform(parse)
                .transform(stage).sink_dataframe(lambda df, _: df.count()))  # fmt: skip
    df = spark.read.schema(SCHEMA).json(str(tmp_path / "in"))
    with pytest.raises(ConfigError, match=rf"transform\[0\.1\] <lambda> {says}.*__ft_"):
        pipeline(df, 0)
    assert ft.layer is not None and ft.layer.stats().pending == 0


def test_row_stages_do_not_mix_with_dataframe_stages(make_ft: Any, tmp_path: Path) -> None:
    """Row stages take a pipeline of their own, and the error says so; a pipeline of
    DataFrame stages ends in a DataFrame or batch sink, not a row sink."""
    ft = make_ft()
    files = FileSource("json", str(tmp_path), SCHEMA)
    with pytest.raises(ConfigError, match="row stages .* take a pipeline of their own"):
        ft.pipeline(reads=files).transform(parse).map(lambda r: r)
    with pytest.raises(ConfigError, match="row stages .* take a pipeline of their own"):
        ft.pipeline(reads=files).filter(lambda r: True).transform(parse)
    with pytest.raises(ConfigError, match="sink_dataframe"):
        ft.pipeline(reads=files).transform(parse).sink(lambda r: None)
    with pytest.raises(ConfigError, match="not of row stages"):
        ft.pipeline(reads=files).map(lambda r: r).sink_dataframe(lambda df, _: None)
    ft.pipeline(reads=files).transform(parse).map_batches(lambda b: b, SCHEMA)  # they mix


def test_a_source_that_cannot_be_read_again_is_copied_once(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """A plain DataFrame (no ``reads=``) through DataFrame stages: its rows are copied
    by one Python pass that stores them (a segment per partition), failed rows replay from
    their copies (``drain``), the rest complete, and no segment is left; each stage's
    failed rows carry its error text. Catches: copies never stored (failed rows lost),
    segments left to time out (everything replays), a replay of a copy mistaken for a
    fresh row, a stage's one error text lost or given to another stage's rows."""
    ft: FaultTolerance = make_ft(timeout_s=2.0, max_replays=2)
    out = tmp_path / "out"
    rows = [(i, i % 7, "n/a" if i % 41 == 3 else f"{i}.5") for i in range(400)]
    seen = tmp_path / "seen"
    pipeline = (
        ft.pipeline(name="copies")
        .transform(parse, failed="amt IS NULL", errors="bad amount")
        .partition_by(["key"], 3)
        # ids = 9 (mod 50) fail while the file "seen" does not exist (failed= as a function
        # of the stage's output: built anew each batch): their fresh attempt
        .transform(lambda df: df,
                   failed=lambda df: F.lit(not seen.exists()) & (F.col("id") % 50 == 9))
        .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out)))
    )  # fmt: skip
    first = ft.run_batch(pipeline, spark.createDataFrame(rows, SCHEMA).repartition(3), 0)
    bad = {i for i in range(400) if i % 41 == 3}
    once = {i for i in range(400) if i % 50 == 9} - bad
    assert (first.fresh, first.failed) == (400, len(bad) + len(once)), first
    seen.write_text("")
    drained = ft.drain(timeout_s=60, pipeline=pipeline)
    assert drained.drained, drained
    got = written(spark, out)
    assert set(got) == set(range(400)) - bad and max(got.values()) == 1
    letters = pipeline.dead_letters(spark)
    assert sorted(letters.column("id").to_pylist()) == sorted(bad)
    assert set(letters.column("amount").to_pylist()) == {"n/a"}, "the copies' columns"
    # one text for all of a stage's failed rows: errors=, after the stage's name (none:
    # the name alone)
    assert set(letters.column("error").to_pylist()) == {"transform[0.0] parse: bad amount"}
    assert set(first.errors) == {"transform[0.0] parse: bad amount",
                                 "transform[1.0] <lambda>"}, first.errors
    st = ft.layer.stats()
    assert st.pending == 0 and st.unsettled_segments == 0 and st.dead_letters == len(bad)


def test_the_collector_is_held_off_while_ftlayer_settles_and_on_for_the_users_code(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """A batch with failed rows: while ftlayer settles it (its ``batch settling`` log
    line) Python's cyclic collector is off -- full collections over the driver's heap cost
    40-260 ms a batch and find nothing --; the stage's function and the sink's function run
    with it on, and it is on after the batch (ftlayer.gc_pause). Catches: the pause not
    applied to the batch, the user's code run with it off, the collector left off."""
    import gc
    import logging

    ft = make_ft()
    write_json(tmp_path / "in" / "a.json", range(40), bad={3, 7})
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    on: dict[str, bool] = {}

    def stage(df: DataFrame) -> DataFrame:
        on["stage"] = gc.isenabled()
        return parse(df)

    def sink(df: DataFrame, _: Any) -> None:
        on["sink"] = gc.isenabled()
        df.write.format("noop").mode("overwrite").save()

    class Settling(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("batch settling"):
                on["settling"] = gc.isenabled()

    pipeline = (ft.pipeline(reads=files, name="gc").transform(stage, failed="amt IS NULL")
                .sink_dataframe(sink))  # fmt: skip
    logger, handler = logging.getLogger("ftlayer.spark.engine"), Settling()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        assert gc.isenabled()
        result = ft.run_batch(pipeline, spark.read.schema(SCHEMA).json(str(tmp_path / "in")), 0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert result.failed == 2, result
    assert on == {"stage": True, "sink": True, "settling": False}
    assert gc.isenabled()


def test_a_sink_that_runs_no_dataframe_action_is_an_error_not_an_ack(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """A sink that writes nothing Spark's observations see (no action, or ``df.rdd``)
    fails its batch with an error saying so; nothing is acked. Catches: rows acked that
    no write took, a sink that blocks for ever waiting for metrics."""
    ft = make_ft()
    write_json(tmp_path / "in" / "a.json", range(20))
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    pipeline = (ft.pipeline(reads=files, name="no-action")
                .transform(parse, failed="amt IS NULL")
                .sink_dataframe(lambda df, _: None))  # fmt: skip
    with pytest.raises(ConfigError, match="no DataFrame action"):
        pipeline(spark.read.schema(SCHEMA).json(str(tmp_path / "in")), 0)


def test_the_documented_example_runs(spark: SparkSession, capsys: pytest.CaptureFixture) -> None:
    """docs/dataframe-stages.md's (and the README's first) example, as written: 500 orders
    from a file kept by reference, 6 with an amount that is not a number (failed three
    times, dead-lettered), 494 written to Parquet, and the availableNow query ends with
    nothing pending."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "dataframe-stages.md"
    code = re.search(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert code is not None
    scope: dict[str, Any] = {}
    exec(compile(code.group(1), str(doc), "exec"), scope)
    assert "written=494 dead_letters=6" in capsys.readouterr().out
    letters = scope["pipeline"].dead_letters(spark)
    assert sorted(letters.column("id").to_pylist()) == [0, 97, 194, 291, 388, 485]
    assert scope["ft"].layer.stats().pending == 0
    scope["ft"].close()


def test_python_and_dataframe_stages_mix_in_one_pipeline(
    spark: SparkSession, make_ft: Any, probe: Any, tmp_path: Path
) -> None:
    """A Python batch stage (failing ids = 1 (mod 50) on their first attempt through an
    ``Outcome``, raising on id 77 every time: bisection isolates it), a keyed shuffle, a
    DataFrame stage (``try_cast``: ``n/a`` amounts fail every time), and a Python sink that
    leaves ids = 7 (mod 60) unconfirmed once. Every record lands or is a dead letter with
    its error; unconfirmed writes replay. Catches: identity lost through a Python stage,
    a Python stage's failures or raised rows not observed, a Python sink's answers lost."""
    import pyarrow as pa

    from ftlayer.spark import Outcome
    from tests.spark.probe import first_seen

    ft = make_ft(timeout_s=2.0, max_replays=2)
    n, bad = 600, {i for i in range(600) if i % 97 == 5}
    write_json(tmp_path / "in" / "a.json", range(n), bad)
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)

    def stage1(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        if (ids == 77).any():
            raise ValueError("id 77 is poison")
        out = b.append_column("twice", pa.array(ids * 2))
        failed = first_seen(probe, "s1", ids, ids % 50 == 1)
        return Outcome(out, failed=failed, errors="first attempt fails")

    def sink(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        assert b.schema.names == ["id", "key", "amount", "twice", "amt"], b.schema.names
        probe.r.rpush(f"{probe.prefix}:sink", *ids.tolist())
        return Outcome(None, unconfirmed=first_seen(probe, "unc", ids, ids % 60 == 7))

    pipeline = (
        ft.pipeline(reads=files, name="mixed")
        .map_batches(stage1, "id long, key long, amount string, twice long")
        .partition_by(["key"], 3)
        .transform(parse, failed="amt IS NULL", errors="bad amount")
        .sink_batches(sink)
    )
    query = (
        pipeline.stream(spark).writeStream.foreachBatch(pipeline)
        .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start()
    )  # fmt: skip
    assert query.awaitTermination(120), "the availableNow query did not end"
    assert query.exception() is None, query.exception()
    got = Counter(int(x) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))
    dead = bad | {77}
    assert set(got) == set(range(n)) - dead, "lost records, or dead letters written"
    unconfirmed = {i for i in range(n) if i % 60 == 7} - dead
    assert all(c == (2 if i in unconfirmed else 1) for i, c in got.items())
    letters = {r["id"]: r["error"] for r in pipeline.dead_letters(spark).to_pylist()}
    assert set(letters) == dead
    assert "ValueError: id 77 is poison" in letters[77] and "map_batches" in letters[77]
    assert all("transform[1.0] parse: bad amount" in letters[i] for i in bad)
    assert ft.layer.stats().pending == 0



def test_a_pipeline_built_anew_for_each_batch_does_not_grow_the_engines_cache(
    spark: SparkSession, make_ft: Any
) -> None:
    """Twelve batches, each with its pipeline built anew (new stage objects and
    functions, as a job building it inside its ``foreachBatch``): the engine's cache of
    plan parts stays near its bound, and every batch's rows are written. Catches: a
    cache keyed by the pipeline's objects growing by every batch's (a slow leak of Python
    and JVM objects in a query that runs for weeks)."""
    ft = make_ft()
    ft.engine.cache_entries = 20
    written, sizes = [], []
    for i in range(12):
        pipeline = (ft.pipeline(name="anew")
                    .transform(lambda df: df.withColumn("y", df.id * 2), failed="y < 0",
                               errors="negative")
                    .sink_dataframe(lambda df, _: written.append(df.count())))  # fmt: skip
        result = ft.run_batch(pipeline, spark.range(50), f"anew-{i}")
        assert result.fresh == 50 and result.failed == 0, result
        sizes.append(len(ft.engine.columns))
    assert written == [50] * 12
    grown = sizes[1] - sizes[0]
    assert grown > 0 and max(sizes) <= 20 + 2 * grown, sizes
