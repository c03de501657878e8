"""A vectorized ftlayer pipeline on a plain DataFrame: map_batches -> keyed shuffle -> sink.

Each stage takes a whole Arrow record batch. The pricing stage fails some rows on purpose
(``Outcome(failed=...)``): those are replayed -- at once, in the task that read them -- and
the one order that can never be priced goes to the dead letters after its replay budget.
Nothing is lost: every order reaches the Parquet sink or the dead letters.

From a checkout (Python >= 3.10, Java 17)::

    pip install -e .
    python examples/vectorized_map_batches.py --orders 20000

Without ``--redis-url`` an embedded redis-server is started and stopped for the run.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer import EmbeddedRedis, FTConfig
from ftlayer.spark import BatchContext, ErrorPolicy, FaultTolerance, Outcome


def price(batch: pa.RecordBatch, ctx: BatchContext) -> Outcome:
    """Price every order. Order 13 never prices (it ends in the dead letters); every 50th
    fails on its first attempt only (``ctx.attempts``: 1 first, 2 for its replay)."""
    ids = batch.column("id").to_numpy()
    out = pa.RecordBatch.from_arrays(
        [batch.column("id"), batch.column("customer"), pc.multiply(batch.column("amount"), 1.2)],
        names=["id", "customer", "total"],
    )
    flaky = (ids % 50 == 0) & (ctx.attempts == 1) if ctx.attempts is not None else False
    failed = (ids == 13) | flaky
    return Outcome(out, failed=failed, errors="no price list for this customer yet")


class ParquetSink:
    """The sink: each Arrow batch becomes one Parquet file; its rows are acked when the
    write returns. A replay may write a row a second time (at least once): readers
    deduplicate by ``id``, or the sink writes idempotently (a MERGE, a keyed upsert)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, batch: pa.RecordBatch) -> None:
        os.makedirs(self.folder, exist_ok=True)
        pq.write_table(pa.Table.from_batches([batch]),
                       os.path.join(self.folder, f"part-{uuid.uuid4().hex}.parquet"))  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--orders", type=int, default=20_000)
    ap.add_argument("--redis-url", default=None, help="default: an embedded redis-server")
    ap.add_argument("--output", default=None, help="Parquet folder (default: a temp dir)")
    args = ap.parse_args()
    output = args.output or tempfile.mkdtemp(prefix="ftlayer-orders-")

    spark = (SparkSession.builder.master("local[2]").appName("ftlayer-example")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    embedded = None if args.redis_url else EmbeddedRedis().start()
    url = args.redis_url or embedded.url  # type: ignore[union-attr]
    ft = FaultTolerance(FTConfig(namespace="example-orders", redis_url=url, max_replays=2),
                        rotate=True)  # this driver rotates timeouts: no sidecar needed  # fmt: skip
    try:
        pipeline = (
            ft.pipeline(source=0, errors=ErrorPolicy(retries=1, backoff_s=0.05))
            .map_batches(price, "id long, customer long, total double")
            .partition_by(["customer"], 4)  # Spark's repartition(4, "customer")
            .sink_batches(ParquetSink(output))
        )
        orders = spark.range(args.orders).select(
            "id", (F.col("id") % 97).alias("customer"), (F.col("id") % 300).alias("amount")
        )
        result = ft.run_batch(pipeline, orders, batch_id=0)
        print(f"batch: fresh={result.fresh} failed={result.failed} "
              f"immediate_replays={result.immediate_replays} written={result.written} "
              f"redis_calls={result.redis_calls}")  # fmt: skip
        for name, counts in result.stages.items():
            print(f"  stage {name}: in={counts.rows_in} out={counts.rows_out} "
                  f"failed={counts.failed}")  # fmt: skip
        drained = ft.drain(timeout_s=120, pipeline=pipeline)
        assert ft.layer is not None
        st = ft.layer.stats()
        dead = ft.layer.persistence.dead_letters()
        lost = args.orders - st.completed - len(dead)
        print(f"drained={drained.drained} completed={st.completed} "
              f"dead_letters={len(dead)} pending={st.pending} lost={lost}")  # fmt: skip
        for d in dead:
            print(f"  dead letter {d.source_id:016x}: {d.frame.decode() if d.frame else '?'} "
                  f"after {d.attempts} attempts: {d.history[-1].error}")  # fmt: skip
        print(f"output: {output}")
        return 0 if lost == 0 and st.pending == 0 else 1
    finally:
        if ft.layer is not None:
            ft.layer.clear()
        ft.close()
        spark.stop()
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    sys.exit(main())
