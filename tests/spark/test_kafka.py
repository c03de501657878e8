"""Kafka kept by reference: ftlayer's ``ftlayer-kafka`` source and KafkaSource, on a real
Kafka-protocol broker (tansu), real Spark (local[2]) and real Redis.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession

from ftlayer.spark import Outcome
from ftlayer.spark.kafka import KafkaSource
from tests.spark.probe import Probe, first_seen

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

SPARK_KAFKA_COLUMNS = [
    ("key", "binary"), ("value", "binary"), ("topic", "string"), ("partition", "int"),
    ("offset", "bigint"), ("timestamp", "timestamp"), ("timestampType", "int"),
]  # fmt: skip


def _topic(kafka: Any, n: int, partitions: int = 4, start: int = 0, name: str = "") -> str:
    name = name or f"ev-{uuid.uuid4().hex[:8]}"
    if not start:
        kafka.create_topic(name, partitions)
    kafka.produce(name, ((str(i % 13).encode(), json.dumps({"id": i, "key": i % 13}).encode())
                         for i in range(start, start + n)),
                  partition_of=lambda i: i % partitions)  # fmt: skip
    return name


def _collect(df: DataFrame, tmp: Path, name: str, **trigger: Any) -> list[dict[str, Any]]:
    """Run the stream ``df`` to the end of what is there (availableNow), each
    micro-batch's rows kept; returns them with their batch id."""
    out: list[dict[str, Any]] = []

    def each(batch: DataFrame, batch_id: int) -> None:
        for r in batch.collect():
            out.append({**r.asDict(), "batch": batch_id})

    (df.writeStream.foreachBatch(each).trigger(availableNow=True)
     .option("checkpointLocation", str(tmp / name)).start().awaitTermination())  # fmt: skip
    return out


def test_the_stream_reads_each_offset_once_with_sparks_kafka_columns(
    spark: SparkSession, kafka: Any, tmp_path: Path
) -> None:
    """1,000 records in 4 partitions read from ``earliest`` with ``maxOffsetsPerTrigger``
    300: Spark's Kafka columns, every (partition, offset) once, micro-batches of at most
    300; then 500 more, and the query restarted on its checkpoint reads only those.
    Catches: offsets not kept in the checkpoint (a restart reads again or skips), a range
    end read twice or never (off by one), the limit ignored, columns that differ from
    Spark's Kafka source."""
    topic = _topic(kafka, 1000)
    source = KafkaSource(kafka.bootstrap, [topic], startingOffsets="earliest",
                         maxOffsetsPerTrigger=300)  # fmt: skip
    stream = source.stream(spark)
    columns = [(f.name, f.dataType.simpleString()) for f in stream.schema.fields]
    assert columns == SPARK_KAFKA_COLUMNS
    first = _collect(stream, tmp_path, "ck")
    assert Counter((r["partition"], r["offset"]) for r in first) == {
        (p, o): 1 for p in range(4) for o in range(250)}
    sizes = Counter(r["batch"] for r in first)
    assert len(sizes) >= 4 and max(sizes.values()) <= 300, sizes
    r = next(r for r in first if r["partition"] == 1 and r["offset"] == 7)
    assert json.loads(r["value"]) == {"id": 29, "key": 29 % 13} and r["key"] == b"3"
    assert r["topic"] == topic and r["timestampType"] == 0 and r["timestamp"] is not None
    _topic(kafka, 500, start=1000, name=topic)
    again = _collect(source.stream(spark), tmp_path, "ck")
    assert sorted(json.loads(r["value"])["id"] for r in again) == list(range(1000, 1500))


def _parse(b: pa.RecordBatch) -> pa.RecordBatch:
    """Kafka rows -> ``id, key`` (their JSON values)."""
    rows = [json.loads(v) for v in b.column("value").to_pylist()]
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema([("id", pa.int64()),
                                                              ("key", pa.int64())]))


class _Sink:
    def __init__(self, probe: Probe) -> None:
        self.probe = probe

    def __call__(self, b: pa.RecordBatch) -> None:
        self.probe.write([{"id": i} for i in b.column("id").to_pylist()])


def _failing_once(probe: Probe, tag: str, every: int) -> Any:
    def stage(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        return Outcome(b, failed=first_seen(probe, tag, ids, ids % every == 3), errors="once")

    return stage


def test_records_failing_before_the_shuffle_replay_by_offset(
    spark: SparkSession, kafka: Any, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """A pipeline over KafkaSource whose first stage fails ids = 3 (mod 20) once, with no
    retry in its task: they are persisted as references (topic-partition, offset) and the
    next micro-batch reads them back by seeking, so the sink gets every record once.
    Redis holds no payload while records succeed (a reference is 16 bytes). Catches:
    replays that lose their offset (never come back, or come back as other records),
    payloads copied to Redis, a record written twice."""
    n = 2000
    topic = _topic(kafka, n)
    ft = make_ft(timeout_s=3.0, max_replays=3)
    source = KafkaSource(kafka.bootstrap, [topic], startingOffsets="earliest",
                         maxOffsetsPerTrigger=700)  # fmt: skip

    pipeline = (ft.pipeline(source=0, reads=source, name="kafka-replays",
                            immediate_replays=0)  # failures queue: no retry in the task
                .map_batches(_parse, "id long, key long")
                .map_batches(_failing_once(probe, "s1", 20), "id long, key long")
                .partition_by(["key"], 3)
                .sink_batches(_Sink(probe)))  # fmt: skip
    held: list[Any] = []

    def each(df: DataFrame, batch_id: int) -> None:
        pipeline(df, batch_id)
        for shard in ft.layer.keyspace.shards:  # what a queued replay holds
            for item in ft.layer.client.lrange(shard.replay(0), 0, -1):
                frame = ft.layer.persistence.get(int.from_bytes(item[:8], "big"))
                if frame is not None:
                    held.append(frame.decode())

    query = (pipeline.stream(spark).writeStream.foreachBatch(each)
             .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck"))
             .start())  # fmt: skip
    query.awaitTermination()
    assert query.exception() is None
    assert held and all(set(h) == {"__ft_loc", "__ft_pos"} for h in held), held[:3]
    got = Counter(int(x) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    read_back = sum(r.read_back for r in ft.results)
    runs = [(r.batch_id, r.fresh, r.replayed, r.read_back) for r in ft.results]
    assert read_back == n // 20, runs
    st = ft.layer.stats()
    assert st.pending == 0 and st.dead_letters == 0, st


def test_a_replay_whose_offset_is_gone_is_a_dead_letter_naming_it(
    spark: SparkSession, kafka: Any, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Records failing in the first micro-batch wait as references; then the topic is
    deleted and created again (what retention or compaction does to an offset: it is no
    longer there). Their replays find nothing at their offsets and are dead-lettered with
    an error naming topic, partition and offset; the rest reached the sink; nothing is
    pending. Catches: a gone offset read as another record, a replay waiting forever, a
    read that fails the batch, a dead letter that does not say which record."""
    n = 400
    topic = _topic(kafka, n)
    ft = make_ft(timeout_s=3.0, max_replays=3)
    source = KafkaSource(kafka.bootstrap, [topic], startingOffsets="earliest")
    failing = {i for i in range(n) if i % 50 == 3}

    pipeline = (ft.pipeline(source=0, reads=source, name="kafka-gone", immediate_replays=0)
                .map_batches(_parse, "id long, key long")
                .map_batches(_failing_once(probe, "s1", 50), "id long, key long")
                .sink_batches(_Sink(probe)))  # fmt: skip

    def each(df: DataFrame, batch_id: int) -> None:
        pipeline(df, batch_id)
        if batch_id == 0:
            kafka.delete_topic(topic)
            kafka.create_topic(topic, 4)

    query = (pipeline.stream(spark).writeStream.foreachBatch(each)
             .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck"))
             .start())  # fmt: skip
    assert query.awaitTermination(120), "the availableNow query did not end"
    assert query.exception() is None, query.exception()
    got = Counter(int(x) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))
    assert set(got) == set(range(n)) - failing and max(got.values()) == 1
    assert ft.layer is not None
    letters = ft.layer.persistence.dead_letters()
    assert len(letters) == len(failing) and ft.layer.stats().pending == 0
    want = {(p, o) for p in range(4) for o in range(n // 4) if (o * 4 + p) in failing}
    named = set()
    for d in letters:
        error = d.history[-1].error
        assert f"Kafka topic {topic!r} partition" in error and "is gone" in error, error
        part = int(error.split(" partition ")[1].split()[0])
        offset = int(error.split(" offset ")[1].split()[0])
        named.add((part, offset))
    assert named == want, "each dead letter names its record's partition and offset"


def test_a_topic_read_by_another_pipeline_is_refused(
    spark: SparkSession, kafka: Any, make_ft: Any, tmp_path: Path
) -> None:
    """A source of a namespace belongs to the first pipeline that runs it, and a Kafka
    source's identity includes its topics: another pipeline on the same topic, and the
    same pipeline pointed at another topic, are refused before they claim anything,
    naming both. Catches: two jobs taking each other's replays; references of one topic
    read back from another."""
    from ftlayer.errors import ConfigError

    topic, other = _topic(kafka, 40), _topic(kafka, 40)
    ft = make_ft(timeout_s=3.0)

    def pipeline(name: str, topics: list[str]) -> Any:
        source = KafkaSource(kafka.bootstrap, topics, startingOffsets="earliest")
        return (ft.pipeline(source=0, reads=source, name=name)
                .map_batches(lambda b: b.select(["offset"]), "offset long")
                .sink_batches(lambda b: None))  # fmt: skip

    first = pipeline("orders", [topic])
    query = (first.stream(spark).writeStream.foreachBatch(first).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "a")).start())  # fmt: skip
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    for name, topics in (("billing", [topic]), ("orders", [other])):
        # refused where its stream is made, before a query starts or anything is claimed
        with pytest.raises(ConfigError, match=r"belongs to pipeline \[orders @ .* @ kafka:"):
            pipeline(name, topics).stream(spark)


def test_a_records_reference_is_sparks_hash_of_its_topic_partition_and_its_offset(
    spark: SparkSession, kafka: Any
) -> None:
    """Spark is the oracle: the location a KafkaSource gives a row in the JVM
    (``xxhash64("<topic>-<partition>")``) is the id Python computes for its topic and
    partition, for every partition, found without asking Kafka; the position is the
    offset. The rows of Spark's own Kafka connector have the same columns, so the same
    expression gives them the same references. Catches: a replay whose location maps to no
    partition (never read back) or to another one."""
    from ftlayer.spark.kafka.source import _PARTITIONS, FORMAT, partition_location, register
    from ftlayer.spark.references import with_references

    topic = _topic(kafka, 200, partitions=6)
    source = KafkaSource(kafka.bootstrap, [topic])
    register(spark)
    rows = with_references(source, spark.read.format(FORMAT)
                           .option("kafka.bootstrap.servers", kafka.bootstrap)
                           .option("subscribe", topic).load()).collect()  # fmt: skip
    assert len(rows) == 200 and {r["partition"] for r in rows} == set(range(6))
    for r in rows:
        assert r["__ft_loc"] == partition_location(topic, r["partition"])
        assert r["__ft_pos"] == r["offset"]
    _PARTITIONS.clear()
    source.remember(spark, [rows[0]["__ft_loc"]])  # computed from the topic's name
    assert _PARTITIONS[rows[0]["__ft_loc"]] == (topic, rows[0]["partition"])
    assert source.location_name(rows[0]["__ft_loc"]) == (
        f"Kafka topic {topic!r} partition {rows[0]['partition']}")


def test_sparks_kafka_connector_reads_replays_back_by_partition_ranges() -> None:
    """``connector="spark"`` (Spark's own Kafka source, where its jar is installed: not on
    this project's machines) reads replays back with one range per partition, from the
    smallest wanted offset to past the largest, gone offsets left out instead of failing
    the batch. Catches: an ending offset that drops the last wanted record, a range that
    fails on an offset gone by retention."""
    from ftlayer.spark.kafka.source import spark_read_options

    opts = spark_read_options({"ev": {"3": [17, 5, 900], "0": [2]}, "other": {"1": [40]}})
    assert json.loads(opts["assign"]) == {"ev": [0, 3], "other": [1]}
    assert json.loads(opts["startingOffsets"]) == {"ev": {"3": 5, "0": 2}, "other": {"1": 40}}
    assert json.loads(opts["endingOffsets"]) == {"ev": {"3": 901, "0": 3}, "other": {"1": 41}}
    assert opts["failOnDataLoss"] == "false"
    with pytest.raises(Exception, match="connector is 'ftlayer' or 'spark'"):
        KafkaSource("b:9092", ["ev"], connector="jvm")
