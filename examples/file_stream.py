"""A file-source Structured Streaming job with ftlayer: kill it at any moment, restart it
with the same checkpoint, and nothing is lost.

New JSON files dropped into ``--input`` are orders; each micro-batch goes through an
ftlayer pipeline (a pricing stage, a keyed shuffle, a sink writing JSON lines into
``--output``). Spark's checkpoint (``--checkpoint``) remembers which files were read;
ftlayer remembers, in Redis, every record not yet written: a batch the job was killed in
is re-run by Spark after the restart, and records that were in flight time out and are
replayed. The sink is at least once: after a kill, a record may be written twice (readers
deduplicate by ``id``; a real sink upserts by key).

From a checkout (Python >= 3.10, Java 17)::

    pip install -e .
    ftlayer redis &                        # prints a URL; Redis must outlive the job
    python examples/file_stream.py --redis-url redis://127.0.0.1:PORT/0 \\
        --input /tmp/orders/in --checkpoint /tmp/orders/ckpt --output /tmp/orders/out
    # drop files into /tmp/orders/in (one JSON object per line: {"id":1,"customer":7,
    # "amount":12}); Ctrl-C or kill -9 the job; start it again: it carries on.

``--once`` processes what is there now, drains and exits (0 when nothing is pending).
The job rotates timeouts itself (``rotate=True``); with an ``ftlayer serve`` sidecar on the
same namespace, pass ``--no-rotate``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from ftlayer import FTConfig
from ftlayer.spark import FaultTolerance

SCHEMA = "id long, customer long, amount long"


def price(batch: pa.RecordBatch) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [batch.column("id"), batch.column("customer"), pc.multiply(batch.column("amount"), 1.2)],
        names=["id", "customer", "total"],
    )


class JsonLinesSink:
    """One file per call, written to a temporary name and renamed: a reader never sees a
    half-written file, and a killed task leaves none behind under the final name."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def __call__(self, batch: pa.RecordBatch) -> None:
        os.makedirs(self.folder, exist_ok=True)
        name = os.path.join(self.folder, f"part-{uuid.uuid4().hex}.jsonl")
        with open(name + ".tmp", "w") as f:
            for row in batch.to_pylist():
                f.write(json.dumps(row) + "\n")
        os.replace(name + ".tmp", name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--input", required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--output", required=True)
    ap.add_argument("--redis-url", required=True, help="a Redis that outlives the job")
    ap.add_argument("--namespace", default="example-file-stream")
    ap.add_argument("--timeout-s", type=float, default=10.0)
    ap.add_argument("--files-per-batch", type=int, default=1)
    ap.add_argument("--once", action="store_true", help="process what is there, drain, exit")
    ap.add_argument("--no-rotate", action="store_true", help="an ftlayer serve sidecar rotates")
    args = ap.parse_args()

    spark = (SparkSession.builder.master("local[2]").appName("ftlayer-file-stream")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    ft = FaultTolerance(FTConfig(namespace=args.namespace, redis_url=args.redis_url,
                                 timeout_s=args.timeout_s),
                        rotate=not args.no_rotate)  # fmt: skip
    pipeline = (
        ft.pipeline(source=0)
        .map_batches(price, "id long, customer long, total double")
        .partition_by(["customer"], 4)
        .sink_batches(JsonLinesSink(args.output))
    )
    stream = (spark.readStream.schema(SCHEMA)
              .option("maxFilesPerTrigger", args.files_per_batch).json(args.input))  # fmt: skip
    writer = stream.writeStream.foreachBatch(pipeline).option("checkpointLocation",
                                                              args.checkpoint)  # fmt: skip
    query = (writer.trigger(availableNow=True) if args.once
             else writer.trigger(processingTime="1 second")).start()  # fmt: skip
    print(f"streaming {args.input} -> {args.output} (checkpoint {args.checkpoint})", flush=True)
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    drained = ft.drain(timeout_s=max(60.0, 4 * args.timeout_s), pipeline=pipeline)
    assert ft.layer is not None
    st = ft.layer.stats()
    print(f"batches={len(ft.results)} records={sum(r.fresh for r in ft.results)} "
          f"completed={st.completed} dead_letters={st.dead_letters} "
          f"pending={drained.pending}", flush=True)  # fmt: skip
    ft.close()
    spark.stop()
    return 0 if drained.drained else 1


if __name__ == "__main__":
    sys.exit(main())
