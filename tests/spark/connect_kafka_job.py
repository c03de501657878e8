"""Kafka kept by reference under Spark Connect: a run of connect_job.py (one Connect
server for every run of test_connect.py).

The topic holds 800 JSON events (``id``, ``key``) in 4 partitions. A pipeline over
``KafkaSource`` (ftlayer's Kafka source registered through the Connect session) parses
the values in a DataFrame stage; a Python stage fails ids = 3 (mod 20) on their first
attempt with nothing retried in its task (their replays are read back from Kafka by
seeking, in the batch the Connect server's Python process runs); a Parquet sink. Prints
one JSON object: the ids written, the replays read back, what is pending.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pyarrow as pa

from ftlayer import FTConfig
from ftlayer.history import read_batches
from ftlayer.spark import FaultTolerance, KafkaSource, Outcome


class FailOnce:
    """Fails ids = 3 (mod 20) the first time a batch holds them (their replays pass)."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        from ftlayer.connection import connect

        ids = b.column("id").to_pylist()
        cand = [i for i, v in enumerate(ids) if v % 20 == 3]
        r = connect(self.url)
        with r.pipeline(transaction=False) as p:
            for i in cand:
                p.sadd(self.key, ids[i])
            first = p.execute()
        return Outcome(b, failed=[i for i, new in zip(cand, first, strict=True) if new],
                       errors="first attempt fails")  # fmt: skip


def run(spark: Any, url: str, ns: str, bootstrap: str, topic: str) -> dict[str, Any]:
    """The run on the Connect session ``spark``: its RESULT."""
    from pyspark.sql import functions as F  # noqa: N812

    out: dict[str, Any] = {"connect": type(spark).__module__}
    ft = FaultTolerance(FTConfig(namespace=ns, redis_url=url, timeout_s=2, max_replays=2))
    events = KafkaSource(bootstrap, [topic], startingOffsets="earliest",
                         maxOffsetsPerTrigger=400)  # fmt: skip
    dest = tempfile.mkdtemp() + "/out"

    def parse(df: Any) -> Any:
        body = F.from_json(F.col("value").cast("string"), "id long, key long")
        return (df.withColumn("id", body["id"]).withColumn("key", body["key"])
                .drop("value", "topic", "partition", "offset", "timestamp", "timestampType"))

    pipeline = (
        ft.pipeline(reads=events, name="connect-kafka", immediate_replays=0)
        .transform(parse)
        .map_batches(FailOnce(url, f"{ns}:failed_once"), "id long, key long")
        .sink_dataframe(lambda df, _: df.write.mode("append").parquet(dest))
    )  # fmt: skip
    query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
             .option("checkpointLocation", tempfile.mkdtemp())
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(300)
    out["stream_exception"] = str(query.exception()) if query.exception() else None
    batches = read_batches(ft.layer.client, ft.layer.keyspace, 0)  # type: ignore[union-attr]
    out.update(read_back=sum(b.get("read_back", 0) for b in batches),
               written=[r["id"] for r in spark.read.parquet(dest).select("id").collect()],
               pending=ft.layer.stats().pending)  # type: ignore[union-attr]  # fmt: skip
    ft.close()
    return out
