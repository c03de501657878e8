"""A Python worker killed with ``kill -9`` inside a flush.

The executors reach Redis through a loopback TCP proxy. The first call of one script (the
task flush of ``ack_scope="task"``, the segment write of a vectorized source task) is
passed to Redis, which runs it, and its reply is held: the worker waits inside its flush.
The test finds the process holding that connection and kills it with SIGKILL. Redis has
applied the dead attempt's write; Spark re-runs the task (``task_retries``). Nothing may be
lost, nothing may complete before its sink wrote it, and after a drain nothing is pending.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer import EmbeddedRedis, FTConfig, FTLayer
from ftlayer.scripts import script_source
from ftlayer.spark import FaultTolerance
from tests.faults import TcpProxy, socket_owner
from tests.spark.probe import Probe

N = 3000


@pytest.fixture
def cleanup() -> Iterator[list[FaultTolerance]]:
    made: list[FaultTolerance] = []
    yield made
    for ft in made:
        assert ft.layer is not None
        ft.layer.clear()
        ft.close()


def _kill_the_held_worker(proxy: TcpProxy, killed: list[int]) -> None:
    if not proxy.held.wait(120):
        return
    pid = None
    deadline = time.monotonic() + 30  # the held worker waits for its reply as long as we look
    while pid is None and time.monotonic() < deadline:
        # /proc is read while the processes run (slowly under a loaded CI): look again
        pid = socket_owner(proxy.held_peer)
        if pid is None:
            time.sleep(0.05)
    if pid is not None and pid != os.getpid():
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    else:  # why, for the assertion's message (CI missed the worker twice under load)
        killed.append(-1 if pid is None else 0)
    proxy.mode = "forward"


SOURCE_TASKS = 3


@pytest.mark.parametrize(
    ("ack_scope", "script", "who"),
    [
        ("task", "flush", "source"),  # a source task: its persists and emits applied
        ("task", "flush", "sink"),  # a sink task: its rows written, its acks applied
        ("batch", "segment_put", "source"),  # a source task: segment and summary stored
    ],
)
def test_a_worker_killed_inside_its_flush_loses_nothing(
    spark: SparkSession,
    probe: Probe,
    task_retries: int,
    redis_server: EmbeddedRedis,
    ack_scope: str,
    script: str,
    who: str,
    cleanup: list[FaultTolerance],
) -> None:
    """Catches: a retried task's records completing early through the dead attempt's
    applied write (sink missing ids), the dead attempt's records pending forever, and
    a retry that double-counts (fold not 0)."""
    sinks = f"{probe.prefix}:sink_pids"  # Python workers that ran the sink (direct Redis)

    def arm_if(port: int) -> bool:  # the source stage ends before the sink stage starts
        return who == "source" or probe.r.sismember(sinks, str(socket_owner(port)))

    def write(ids: list[int]) -> None:
        if ids:
            probe.r.sadd(sinks, os.getpid())
            probe.r.rpush(f"{probe.prefix}:sink", *ids)

    sha = redis_server.client().script_load(script_source(script))  # EVALSHA, not NOSCRIPT
    with TcpProxy(
        redis_server.port, marker=b"EVALSHA\r\n$40\r\n" + sha.encode(), limit=1, arm_if=arm_if
    ) as proxy:
        proxy.mode = "hold_replies"
        config = FTConfig(namespace=f"cw{uuid.uuid4().hex[:10]}", redis_url=proxy.url, timeout_s=2)
        # the driver talks to Redis directly; the executors (config.redis_url) via the proxy
        ft = FaultTolerance(config, layer=FTLayer(redis_server.client(), config), rotate=True)
        cleanup.append(ft)
        killed: list[int] = []
        killer = threading.Thread(target=_kill_the_held_worker, args=(proxy, killed))
        killer.start()
        df = spark.range(N).select("id", (F.col("id") % 23).alias("key")).repartition(SOURCE_TASKS)
        if ack_scope == "task":
            pipeline = (
                ft.pipeline(ack_scope="task")
                .map(lambda r: {"id": r["id"], "key": r["key"]})
                .partition_by(["key"], 4)
                .sink(lambda rows: write([r["id"] for r in rows]), per="partition")
            )
        else:
            pipeline = (
                ft.pipeline()
                .map_batches(lambda b: b, "id long, key long")
                .partition_by(["key"], 4)
                .sink_batches(lambda b: write(b.column("id").to_pylist()))
            )
        result = ft.run_batch(pipeline, df, 0)
        killer.join(timeout=5)
        assert proxy.swallowed == 1 and killed and killed[0] > 0, (
            f"a worker was killed inside its flush: held port {proxy.held_peer}, "
            f"{'no process held it' if killed[:1] == [-1] else 'the test process held it'}"
            if killed and killed[0] <= 0 else "a worker was killed inside its flush")
        report = ft.drain(timeout_s=60)
    got = Counter(probe.ids())
    assert set(got) == set(range(N)), f"lost: {sorted(set(range(N)) - set(got))[:10]}"
    assert report.drained and report.pending == 0 and report.dead_lettered == 0, report
    st = ft.layer.stats()
    assert st.pending == 0 and st.queued_replays == 0 and st.unsettled_segments == 0
    dups = sum(got.values()) - N
    print(f"{ack_scope}/{who}: killed pid {killed}, fresh={result.fresh}, dups={dups}")
    if ack_scope == "task":  # the dead attempt's write was applied: what it did comes back
        assert dups > 0  # (source: its records time out and replay; sink: its retry)
    else:  # a retried source task's segment replaces the dead attempt's (same ids)
        assert dups == 0
