"""The streaming yardstick's events in Kafka (``stream_overhead --source kafka``): the same
W-byte events as the JSON files of ``benchmarks._wide``, as JSON values of a topic of
PARTITIONS partitions on a throwaway broker (tansu), and the stages that turn Kafka rows
into the events' columns (``id``, ``key``, ``payload``) -- a DataFrame one and an Arrow one,
used alike by the plain queries and ftlayer's.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from benchmarks._paired import PARTITIONS
from benchmarks._wide import event_lines

__all__ = ["KAFKA_COLUMNS", "arrow_events", "df_events", "produce_events", "stream"]

KAFKA_COLUMNS = ("value", "topic", "partition", "offset", "timestamp", "timestampType")
"""The Kafka columns an events stage drops (``key`` it replaces with the event's)."""
_EVENTS = pa.schema([("id", pa.int64()), ("key", pa.int64()), ("payload", pa.string())])


def produce_events(kafka: Any, topic: str, n: int, width: int) -> None:
    """``n`` events of ``width`` bytes into a new topic of PARTITIONS partitions, event i
    in partition i % PARTITIONS."""
    kafka.create_topic(topic, PARTITIONS)
    kafka.produce(topic, ((None, line.encode()) for line in event_lines(0, n, width)),
                  partition_of=lambda i: i % PARTITIONS)  # fmt: skip


def stream(spark: Any, bootstrap: str, topic: str, per_batch: int) -> Any:
    """The plain query's stream: the same Python Kafka source ftlayer reads, the same
    options (from the earliest offset, ``per_batch`` offsets a micro-batch)."""
    from ftlayer.spark.kafka.source import FORMAT, register

    register(spark)
    return (spark.readStream.format(FORMAT).option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", per_batch).load())  # fmt: skip


def df_events(df: Any) -> Any:
    """Kafka rows -> the events' columns, in the JVM (``from_json`` of the value)."""
    from pyspark.sql import functions as F  # noqa: N812

    event = F.from_json(F.col("value").cast("string"), "id long, key long, payload string")
    return (df.withColumn("id", event["id"]).withColumn("key", event["key"])
            .withColumn("payload", event["payload"]).drop(*KAFKA_COLUMNS))  # fmt: skip


def arrow_events(b: pa.RecordBatch) -> pa.RecordBatch:
    """Kafka rows -> the events' columns, in Python (``json.loads`` of each value)."""
    rows = [json.loads(v) for v in b.column("value").to_pylist()]
    return pa.RecordBatch.from_pylist(rows, schema=_EVENTS)
