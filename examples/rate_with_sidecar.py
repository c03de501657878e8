"""A ``rate``-source streaming job whose timeouts an ``ftlayer serve`` sidecar rotates.

Spark's rate source makes ``--rows-per-second`` rows; each micro-batch goes through an
ftlayer pipeline whose sink "loses" a share of its writes (never confirms them: a network
blip to a real sink). Those records stay pending until the sidecar times them out and they
are replayed in a later batch. After ``--seconds`` of streaming (counted from the first
finished micro-batch) the query stops, the job drains, and prints how many rows Spark
produced, how many reached the sink and how many were lost (0).

From a checkout (Python >= 3.10, Java 17), in three terminals::

    pip install -e .
    ftlayer redis                                           # prints redis://127.0.0.1:PORT/0
    ftlayer serve --redis-url redis://127.0.0.1:PORT/0 --namespace example-rate --timeout-s 3
    python examples/rate_with_sidecar.py --redis-url redis://127.0.0.1:PORT/0 --seconds 30

Open the sidecar's status page (``ftlayer status --open``) while it runs.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import pyarrow as pa
import redis
from pyspark.sql import SparkSession

from ftlayer import FTConfig
from ftlayer.spark import FaultTolerance, Outcome


class RedisSetSink:
    """Adds each row's ``value`` to a Redis set; a share of the writes is never confirmed
    (``Outcome(unconfirmed=...)``): those records time out and are replayed."""

    def __init__(self, url: str, key: str, drop: float) -> None:
        self.url, self.key, self.drop = url, key, drop

    def __call__(self, batch: pa.RecordBatch) -> Outcome:
        lost = np.random.default_rng().random(batch.num_rows) < self.drop
        values = batch.column("value").to_numpy()[~lost]
        if len(values):
            redis.Redis.from_url(self.url).sadd(self.key, *values.tolist())
        return Outcome(unconfirmed=np.flatnonzero(lost))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--namespace", default="example-rate")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--rows-per-second", type=int, default=2000)
    ap.add_argument("--drop-rate", type=float, default=0.01)
    ap.add_argument("--timeout-s", type=float, default=3.0, help="as the sidecar's")
    args = ap.parse_args()

    spark = (SparkSession.builder.master("local[2]").appName("ftlayer-rate")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
    spark.sparkContext.setLogLevel("ERROR")
    # no rotate=True: the sidecar owns the clock of this namespace
    ft = FaultTolerance(FTConfig(namespace=args.namespace, redis_url=args.redis_url,
                                 timeout_s=args.timeout_s))  # fmt: skip
    key = f"example-rate:{args.namespace}:sink"
    client = redis.Redis.from_url(args.redis_url)
    client.delete(key)
    pipeline = (ft.pipeline(source=0)
                .sink_batches(RedisSetSink(args.redis_url, key, args.drop_rate)))  # fmt: skip
    stream = (spark.readStream.format("rate")
              .option("rowsPerSecond", args.rows_per_second).load())  # fmt: skip
    query = stream.writeStream.foreachBatch(pipeline).trigger(processingTime="1 second").start()
    started = time.monotonic()  # --seconds of streaming, from the first finished batch:
    while not ft.results and query.isActive and time.monotonic() - started < 300:
        time.sleep(0.1)  # Spark's start (slow on a busy machine) is not part of them
    time.sleep(args.seconds)
    query.stop()
    produced = sum(r.fresh for r in ft.results)
    drained = ft.drain(timeout_s=max(60.0, 10 * args.timeout_s), pipeline=pipeline)
    assert ft.layer is not None
    st = ft.layer.stats()
    # the rate source numbers its rows 0, 1, 2, ...: the batches that finished produced
    # exactly 0..produced-1 (a batch the stop cut short is re-read by nobody: its rows
    # never counted as produced, though some may have reached the sink)
    # at least once: a record whose write landed in a batch the stop interrupted is
    # replayed, and may end in the sink and in the dead letters too (not lost, not twice)
    in_sink = {int(v) for v in client.smembers(key) if int(v) < produced}
    dead = {d.frame.decode()["value"] for d in ft.layer.persistence.dead_letters()
            if d.frame and d.frame.decode()["value"] < produced}  # fmt: skip
    lost = produced - len(in_sink | dead)
    print(f"produced={produced} in_sink={len(in_sink)} replayed={st.replayed} "
          f"timed_out={st.failed_timeout} dead_letters={st.dead_letters} "
          f"pending={drained.pending} lost={lost}", flush=True)  # fmt: skip
    client.delete(key)
    ft.close()
    spark.stop()
    return 0 if lost == 0 and drained.drained else 1


if __name__ == "__main__":
    sys.exit(main())
