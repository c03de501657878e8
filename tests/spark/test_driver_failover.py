"""The driver's writes wait out a master with no replica (``durability="replicated"``):
real Spark (local[2]), a real Redis master, its replica a real ``redis-server
--replicaof`` that is stopped before a batch and started again 2 s into it.

A vectorized batch's tasks write segments (no ``WAIT``); its driver completes the replays
the batch ran with one replicated flush per shard. With the replica gone that flush gets
no acknowledgement: on an executor the task would fail and Spark would run it again; the
driver has no one to run it again, so it waits (``FTConfig.driver_wait_s``) -- it used to
raise out of ``foreachBatch`` and end the streaming query.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer import EmbeddedRedis, FTConfig
from ftlayer.spark import FaultTolerance, Outcome
from tests.spark.probe import Probe, first_seen
from tests.toolkit import replica_linked, until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark


def test_the_driver_waits_for_a_replica_instead_of_ending_the_query(
    spark: SparkSession, probe: Probe, make_redis: Callable[..., EmbeddedRedis]
) -> None:
    """Catches: a FlushError on the driver (no replica acknowledged its flush) ending the
    batch, records completed twice or lost by the retried flush."""
    n = 600
    master = make_redis()
    replicaof = ("--replicaof", "127.0.0.1", str(master.port))
    first = make_redis(extra_args=replicaof)
    until(lambda: replica_linked(first), "the first replica's link to its master", 15, 0.05)
    ft = FaultTolerance(FTConfig(namespace="drv", redis_url=master.url, timeout_s=30.0,
                                 durability="replicated", replica_wait_s=0.2,
                                 driver_wait_s=30.0))  # fmt: skip
    second = EmbeddedRedis(extra_args=replicaof)  # started by a timer, 2 s into batch 1
    try:

        def stage(b: pa.RecordBatch) -> Outcome:
            ids = b.column("id").to_numpy()
            failed = first_seen(probe, "failed", ids, ids % 5 == 1)
            return Outcome(b, failed=failed, errors="fails once")

        def sink(b: pa.RecordBatch) -> None:
            probe.r.rpush(f"{probe.prefix}:sink", *b.column("id").to_pylist())

        pipeline = (ft.pipeline(source=0, immediate_replays=0)  # failures queue
                    .map_batches(lambda b: b, "id long, key long")
                    .partition_by(["key"], 3)
                    .map_batches(stage, "id long, key long")
                    .sink_batches(sink))  # fmt: skip
        df = spark.range(n).select("id", (F.col("id") % 7).alias("key"))
        ft.run_batch(pipeline, df, 0)  # a fifth of the records fail: queued replays
        assert ft.layer is not None and ft.layer.stats().queued_replays == n // 5
        first.stop()  # the master has no replica now
        timer = threading.Timer(2.0, second.start)
        timer.start()
        t0 = time.monotonic()
        result = ft.run_batch(pipeline, df.limit(0), 1)  # claims and runs the replays
        waited = time.monotonic() - t0
        timer.join()
        assert result.replayed == n // 5 and result.acked == n // 5, result
        assert waited >= 1.5, f"the driver's flush did not wait ({waited:.2f} s)"
        until(lambda: replica_linked(second), "the second replica's link to its master", 15, 0.05)
        st = ft.layer.stats()
        assert st.pending == 0 and st.queued_replays == 0, st
        got = sorted(int(x) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))
        assert got == list(range(n)), "lost or written twice"
    finally:
        second.stop()
        if ft.layer is not None:
            ft.layer.clear()
        ft.close()
