"""Sources kept by reference (ftlayer.spark.references): real file streams read by real
Spark (local[2]), real Redis. Replays are read back from the files, with their original
columns; a file gone before its replay dead-letters its records, naming it.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer.spark import FaultTolerance, FileSource, Outcome, RateMicroBatchSource
from ftlayer.spark.references import location_id, with_references
from ftlayer.stage_rows import StageRow
from tests.spark.probe import Probe, first_seen
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

SCHEMA = "id long, key long, payload string"


def payload(i: int) -> str:
    return f"event {i} " + "x" * (i % 97)


def write_json(path: Path, ids: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp"
    rows = [{"id": i, "key": i % 29, "payload": payload(i)} for i in ids]
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)


def write_parquet(path: Path, ids: range) -> None:
    """The rows ``write_json`` writes, as Parquet, in row groups of 50 rows."""
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": pa.array(list(ids), pa.int64()),
                      "key": pa.array([i % 29 for i in ids], pa.int64()),
                      "payload": [payload(i) for i in ids]})  # fmt: skip
    tmp = path.parent / f".{path.name}.tmp"
    pq.write_table(table, tmp, row_group_size=50)
    tmp.rename(path)



def build(ft: FaultTolerance, probe: Probe, source: FileSource, fail_mod: int, unc_mod: int,
          record_key: str | None = None):
    """stage -> keyed shuffle -> stage failing ``id % fail_mod == 3`` once -> sink that
    records (id, payload) and leaves ``id % unc_mod == 7`` unconfirmed once."""

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        failed = first_seen(probe, "s2", ids, ids % fail_mod == 3)
        return Outcome(b, failed=failed, errors="stage 2 rejects it once")

    def sink(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        unc = first_seen(probe, "unc", ids, ids % unc_mod == 7)
        rows = [json.dumps([i, p]) for i, p in zip(ids.tolist(), b.column("payload").to_pylist(),
                                                   strict=True)]  # fmt: skip
        probe.r.rpush(f"{probe.prefix}:sink", *rows)
        return Outcome(None, unconfirmed=unc)

    return (
        ft.pipeline(source=0, reads=source, record_key=record_key,
                    immediate_replays=0)  # failures past the shuffle queue
        .map_batches(lambda b: b, SCHEMA)
        .partition_by(["key"], 4)
        .map_batches(stage2, SCHEMA)
        .sink_batches(sink)
    )


def sink_rows(probe: Probe) -> list[tuple[int, str]]:
    return [tuple(json.loads(x)) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1)]


@pytest.mark.parametrize(("fmt", "record_key"), [("json", None), ("json", "id"),
                                                 ("parquet", None)])  # fmt: skip
def test_replays_are_read_back_from_the_files_with_their_columns(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path, fmt: str,
    record_key: str | None,
) -> None:  # fmt: skip
    """Two files, a keyed shuffle, failures past the shuffle and unconfirmed sink rows:
    every record reaches the sink with the payload its file holds (a replay read back,
    not rebuilt), nothing pending at the end, no drain. While the failed records wait,
    Redis holds their references, and a row failed past the shuffle as that stage's input
    (a stage row). Catches: replays that lose or mix up
    their columns, a reference pointing at another row, records copied into Redis, a
    by-reference replay never resolved (pending forever); (``record_key``) failures past
    the shuffle, reported by key, mapped to no reference."""
    ft = make_ft(timeout_s=2.0, max_replays=3)
    n = 1200
    write = write_json if fmt == "json" else write_parquet
    write(tmp_path / "in" / f"a.{fmt}", range(0, n // 2))
    write(tmp_path / "in" / f"b.{fmt}", range(n // 2, n))
    files = FileSource(fmt, str(tmp_path / "in"), SCHEMA)
    pipeline = build(ft, probe, files, fail_mod=10, unc_mod=40, record_key=record_key)
    assert ft.layer is not None
    held: list[dict[str, Any]] = []

    def each(df: Any, batch_id: int) -> None:
        pipeline(df, batch_id)
        for shard in ft.layer.keyspace.shards:  # what a queued replay holds
            for item in ft.layer.client.lrange(shard.replay(0), 0, 2):
                frame = ft.layer.persistence.get(int.from_bytes(item[:8], "big"))
                if frame is not None:
                    held.append(frame.decode())

    query = (
        pipeline.stream(spark).writeStream.foreachBatch(each)
        .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start()
    )  # fmt: skip
    assert query.awaitTermination(120), "the availableNow query did not end"
    assert query.exception() is None, query.exception()
    rows = sink_rows(probe)
    got = Counter(i for i, _ in rows)
    assert set(got) == set(range(n)), "lost records"
    assert all(p == payload(i) for i, p in rows), "a replay came back with other columns"
    unconfirmed = {i for i in range(n) if i % 40 == 7}
    assert all(c == 1 for i, c in got.items() if i not in unconfirmed), "duplicates"
    st = ft.layer.stats()
    assert st.pending == 0 and st.dead_letters == 0 and st.failed_explicit == n // 10
    assert held, "no queued replay was seen"
    files = {location_id(p) for p in spark.read.format(fmt).load(str(tmp_path / "in")).inputFiles()}
    for h in held:  # a reference: the file's id and a position (and the key), no payload;
        # or a stage row: the reference and the row as the stage past the shuffle took it
        if isinstance(h, list):
            row = StageRow(*h)
            assert record_key is None and row.entry == 1 and row.format == "msgpack", h
            h = {"__ft_loc": row.location, "__ft_pos": row.position}
        assert set(h) == {"__ft_loc", "__ft_pos", *([record_key] if record_key else [])}, h
        assert h["__ft_loc"] in files and isinstance(h["__ft_pos"], int)


def test_a_file_gone_before_its_replay_dead_letters_its_records_naming_it(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Records left unconfirmed by the sink time out and replay; their file is deleted
    first: each becomes a dead letter whose error names the file; the other file's
    records complete. Catches: a missing file dropping its records (lost), failing the
    whole batch (the stream dies), or replaying for ever."""
    ft = make_ft(timeout_s=3.0, max_replays=3)
    write_json(tmp_path / "in" / "gone.json", range(0, 300))
    write_json(tmp_path / "in" / "kept.json", range(300, 600))
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)
    pipeline = build(ft, probe, files, fail_mod=10**9, unc_mod=20)
    query = (
        pipeline.stream(spark).writeStream.foreachBatch(pipeline)
        .trigger(processingTime="1 second")
        .option("checkpointLocation", str(tmp_path / "ck")).start()
    )  # fmt: skip
    assert ft.layer is not None
    try:
        until(lambda: len(sink_rows(probe)) >= 600, "the first batch", 60, 0.25)
        (tmp_path / "in" / "gone.json").unlink()  # before the unconfirmed rows time out
        until(lambda: ft.layer.stats().pending == 0, "nothing pending", 60, 0.25)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
    dead = ft.layer.persistence.dead_letters()
    gone = {i for i in range(300) if i % 20 == 7}
    assert len(dead) == len(gone)
    for d in dead:
        assert "gone.json" in d.history[-1].error and "no longer" in d.history[-1].error, d
    sunk = Counter(i for i, _ in sink_rows(probe))
    kept_unc = {i for i in range(300, 600) if i % 20 == 7}
    assert all(sunk[i] == 2 for i in kept_unc), "the other file's replays completed"


def test_rate_micro_batch_replays_are_rebuilt_as_spark_made_them(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """``rate-micro-batch`` kept by reference: a replay's row is rebuilt from its value
    (no read); Spark is the oracle: every row the sink gets, replays included, equals the
    row a plain query of the same source made for that value. Catches: a timestamp off by
    a batch, the wrong unit, a value mapped to another row."""
    opts = {"rows_per_batch": 150, "num_partitions": 3, "start_timestamp": 1_700_000_000_123,
            "advance_millis_per_batch": 2500}  # fmt: skip
    rate = RateMicroBatchSource(**opts)
    oracle: dict[int, Any] = {}

    def keep(df: Any, batch_id: int) -> None:
        oracle.update((r["value"], r["timestamp"]) for r in df.collect())

    plain = (rate.stream(spark).writeStream.foreachBatch(keep)
             .option("checkpointLocation", str(tmp_path / "ck0")).start())  # fmt: skip
    try:
        until(lambda: len(oracle) >= 600, "the plain query's rows", 60, 0.25)
    finally:
        plain.stop()

    ft = make_ft(timeout_s=2.0, max_replays=3)

    def stage2(b: pa.RecordBatch) -> Outcome:
        v = b.column("value").to_numpy()
        return Outcome(b, failed=first_seen(probe, "s2", v, v % 7 == 3), errors="once")

    def sink(b: pa.RecordBatch) -> None:
        ts = b.column("timestamp").cast(pa.int64()).to_pylist()  # microseconds
        rows = [json.dumps([v, t]) for v, t in zip(b.column("value").to_pylist(), ts,
                                                   strict=True)]  # fmt: skip
        probe.r.rpush(f"{probe.prefix}:sink", *rows)

    pipeline = (
        ft.pipeline(source=0, reads=rate)
        .map_batches(lambda b: b, "timestamp timestamp, value long")
        .partition_by(["value"], 2)
        .map_batches(stage2, "timestamp timestamp, value long")
        .sink_batches(sink)
    )
    query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
             .option("checkpointLocation", str(tmp_path / "ck1")).start())  # fmt: skip
    try:
        until(lambda: len({v for v, _ in sink_rows(probe)} & set(range(450))) == 450,
              "450 values in the sink, replays included", 90, 0.25)  # fmt: skip
    finally:
        query.stop()
    got = dict(sink_rows(probe))
    replayed = [v for v in range(450) if v % 7 == 3]
    assert set(replayed) <= set(got)
    for v in range(450):
        want = oracle[v]
        assert got[v] == int(want.timestamp() * 1_000_000), (v, got[v], want)


def test_a_files_location_id_is_sparks_hash_of_its_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark is the oracle: ``location_id`` of each path ``inputFiles`` lists equals what
    the JVM computes for its rows (``xxhash64(_metadata.file_path)``), names with spaces,
    percent signs and subdirectories included; and so does the location of every row's
    reference (``FileSource.reference``, from ``input_file_name()`` over the source's own
    scan, from ``_metadata`` otherwise). Catches: a listing
    spelling paths another way (``file:///`` beside ``file:/``, or unescaped), so replays
    would not find their files and dead-letter; a reference whose location changed
    spelling (stored references and the lineage ids made of them no longer matching)."""
    from pyspark.sql import functions as F  # noqa: N812

    write_json(tmp_path / "in" / "a.json", range(0, 3))
    write_json(tmp_path / "in" / "sub dir" / "b 100%.json", range(3, 6))
    df = spark.read.schema(SCHEMA).option("recursiveFileLookup", "true").json(str(tmp_path / "in"))
    listed = {location_id(p) for p in df.inputFiles()}
    rows = df.select(F.xxhash64(F.col("_metadata.file_path")).alias("h")).distinct().collect()
    assert listed == {r.h for r in rows} and len(listed) == 2
    for fmt in ("json", "parquet"):  # the reference's location: the same hash, every row
        if fmt == "parquet":
            write_parquet(tmp_path / "pq" / "sub dir" / "c 100%.parquet", range(6, 9))
        root = tmp_path / ("in" if fmt == "json" else "pq")
        source = FileSource(fmt, str(root), SCHEMA, recursiveFileLookup="true")
        read = spark.read.format(fmt).schema(SCHEMA).option("recursiveFileLookup", "true")
        scan = read.load(str(root))
        quick, _ = source.reference(scan, scanned=True)
        plain, _ = source.reference(scan)
        pairs = scan.select(quick.alias("quick"), plain.alias("plain"),
                            F.xxhash64(F.col("_metadata.file_path")).alias("h")).collect()
        assert pairs and all(r.quick == r.h == r.plain for r in pairs), pairs


def test_a_parquet_rows_position_is_its_index_whatever_the_splits(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark is the oracle: a Parquet row's reference is the same when the file is read
    whole and when it is cut into many splits (``maxPartitionBytes`` of 1 KB), and no two
    rows share one. Catches: a position that depends on the scan (a replay read back by
    another read would find another row, or none)."""
    write_parquet(tmp_path / "in" / "a.parquet", range(0, 2000))
    files = FileSource("parquet", str(tmp_path / "in"), SCHEMA)

    def refs(session: SparkSession) -> dict[int, tuple[int, int]]:
        df = session.read.schema(SCHEMA).parquet(str(tmp_path / "in"))
        got = with_references(files, df).select("id", "__ft_loc", "__ft_pos").collect()
        return {r["id"]: (r["__ft_loc"], r["__ft_pos"]) for r in got}

    split = spark.newSession()
    split.conf.set("spark.sql.files.maxPartitionBytes", "1024")
    split.conf.set("spark.sql.files.openCostInBytes", "1024")
    whole, cut = refs(spark), refs(split)
    assert split.read.parquet(str(tmp_path / "in")).rdd.getNumPartitions() > 4
    assert whole == cut and len(set(whole.values())) == 2000
