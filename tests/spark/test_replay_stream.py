"""Replays as a Spark streaming source (ftlayer.spark.replay_stream): real Spark
(local[2]), real Redis, real file streams; no ``drain()`` anywhere a test says so.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer import EmbeddedRedis
from ftlayer.errors import ConfigError
from ftlayer.spark import FaultTolerance, Outcome
from tests.serving import Serve
from tests.spark.probe import Probe, first_seen
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark


def stamp(probe: Probe, what: str, ids: np.ndarray) -> None:
    """Record when each id did ``what`` (the first time only)."""
    if len(ids):
        now = time.time()
        with probe.r.pipeline(transaction=False) as p:
            for i in ids.tolist():
                p.hsetnx(f"{probe.prefix}:{what}", str(i), repr(now))
            p.execute()


def write_json(path: Path, ids: range, keys: int = 29) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"id": i, "key": i % keys}) + "\n" for i in ids))
    tmp.rename(path)


def pipeline_of(ft: FaultTolerance, probe: Probe, fail_mod: int, unc_mod: int = 0) -> Any:
    """map -> keyed shuffle -> map failing ``id % fail_mod == 3`` once -> sink leaving
    ``id % unc_mod == 7`` unconfirmed once (they time out and replay). A failed or
    unconfirmed row's ``failed_at`` is stamped when it fails, its ``done_at`` only when a
    run of it reaches the sink and is not left unconfirmed (for those: their replay)."""

    def stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        return b

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        failed = first_seen(probe, "s2", ids, ids % fail_mod == 3)
        stamp(probe, "failed_at", ids[failed])
        return Outcome(b, failed=failed, errors="stage 2 rejects it once")

    def sink(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        unc = first_seen(probe, "unc", ids, ids % unc_mod == 7) if unc_mod else []
        stamp(probe, "failed_at", ids[unc])
        probe.r.rpush(f"{probe.prefix}:sink", *ids.tolist())
        stamp(probe, "done_at", np.delete(ids, unc))  # the unconfirmed: when replayed
        return Outcome(None, unconfirmed=unc)

    return (
        ft.pipeline(source=0, immediate_replays=0)  # failures wait for the replay stream
        .map_batches(stage1, "id long, key long")
        .partition_by(["key"], 4)
        .map_batches(stage2, "id long, key long")
        .sink_batches(sink)
    )


def sink_ids(probe: Probe) -> Counter[int]:
    return Counter(int(x) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))


def by_batch(query: Any) -> dict[int, Any]:
    """The query's recent progress reports by batch id."""
    return {p["batchId"]: p for p in query.recentProgress}


@pytest.mark.slow
def test_a_quiet_stream_replays_failures_and_timeouts_without_new_input(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """One file, then nothing: every record failing after the shuffle (queued at once)
    and every sink row left unconfirmed (a timeout, rotated by the replay stream itself:
    no sidecar, no rotate=True) reaches the sink while the query runs, each within the
    stated bound T*B/(B-1) + two trigger intervals of its failure, and each timeout replay
    only after it waited out timeout_s. Catches: queued replays waiting for new input,
    timeouts never rotated without a sidecar or rotated late (a slow rotation, wrong
    buckets), timeouts failed before timeout_s, replays lost or left pending, replays run
    twice into the sink (explicit failures)."""
    timeout_s, buckets, trigger_s = 3.0, 3, 1.0
    ft = make_ft(timeout_s=timeout_s, buckets=buckets, max_replays=3)
    n = 2000
    write_json(tmp_path / "in" / "a.json", range(n))
    pipeline = pipeline_of(ft, probe, fail_mod=10, unc_mod=50)
    ran: dict[int, tuple[float, float]] = {}  # batch id -> foreachBatch's start and end

    def timed(df: Any, batch_id: int) -> None:
        t0 = time.time()
        pipeline(df, batch_id)
        ran[batch_id] = (t0, time.time())

    stream = spark.readStream.schema("id long, key long").json(str(tmp_path / "in"))
    query = (
        pipeline.with_replays(stream)
        .writeStream.foreachBatch(timed)
        .trigger(processingTime=f"{trigger_s:g} seconds")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        until(lambda: len(sink_ids(probe)) == n, "every record in the sink", 60, 0.25)
        assert ft.layer is not None
        until(lambda: ft.layer.stats().pending == 0, "nothing pending", 30, 0.25)
        until(lambda: ran.keys() <= by_batch(query).keys(), "every batch's progress", 30, 0.1)
        progress = by_batch(query)
    finally:
        query.stop()
    got = sink_ids(probe)
    assert set(got) == set(range(n)), "lost records"
    unconfirmed = {i for i in range(n) if i % 50 == 7}
    explicit = {i for i in range(n) if i % 10 == 3}
    assert all(c == 1 for i, c in got.items() if i not in unconfirmed), "duplicates"
    assert all(got[i] == 2 for i in unconfirmed)  # written, unconfirmed, replayed
    failed_at = {int(k): float(v) for k, v in probe.r.hgetall(f"{probe.prefix}:failed_at").items()}
    done_at = {int(k): float(v) for k, v in probe.r.hgetall(f"{probe.prefix}:done_at").items()}
    assert set(failed_at) == explicit | unconfirmed, "a failure not stamped"
    assert set(done_at) == set(range(n)), "a row, or an unconfirmed row's replay, not stamped"
    # Each failure's clock starts when Redis learns of it: when its batch settles, at the
    # batch's end (a row failing in an early task waits for the batch's other tasks
    # first: Spark's time, not the replays'). The first batch reads the file and starts
    # Spark's workers; it holds no replay, and every replay comes after it settled. A
    # replay runs in the batch whose foreachBatch holds its done_at; that batch's trigger
    # (its progress timestamp) began before the replay stream claimed it.
    assert ran[0][0] < min(failed_at.values()), ran
    assert ran[0][1] < min(done_at[i] for i in failed_at), ran
    began = {b: datetime.fromisoformat(q["timestamp"]).timestamp() for b, q in progress.items()}
    took = {b: q["durationMs"]["triggerExecution"] / 1000 for b, q in progress.items()}
    lat, claimed, allowed = {}, {}, {}
    for i, failed in failed_at.items():
        settled = min(end for _, end in ran.values() if end >= failed)
        k = next(b for b, (start, end) in ran.items() if start <= done_at[i] <= end)
        lat[i] = done_at[i] - settled
        claimed[i] = began[k] - settled
        # Due T*B/(B-1) after settling at the latest (a timeout; an explicit failure at
        # once), then the next trigger: within trigger_s of that, or of the end of the
        # batch running then (only the one before the replay's can be: the trigger after
        # it would have claimed the replay)
        due = settled + (timeout_s * buckets / (buckets - 1) if i in unconfirmed else 0.0)
        allowed[i] = max(due, began[k - 1] + took[k - 1]) + trigger_s - settled
    # 0.25 s in the checks below: the stamps are wall-clock times taken around Redis calls
    # in three processes (a batch's end after its settle call returned; a trigger's start
    # before Spark listed the input files and the replay stream rotated and claimed).
    # A timeout replay was measured, not the row's first write: its deadline, set when
    # its batch settles, is at least timeout_s later, and no trigger claims it before.
    waited = min(claimed[i] for i in unconfirmed)
    assert waited >= timeout_s - 0.25, f"a timeout claimed {waited:.2f}s after it settled"
    # Claimed by the first trigger after it was due (a timeout: the rotation on time and
    # its buckets right) or after its failure (an explicit one).
    late = {i: (round(claimed[i], 2), round(allowed[i], 2)) for i in lat
            if claimed[i] > allowed[i] + 0.25}  # fmt: skip
    assert not late, f"replays claimed late (s after settling, allowed): {late}, took {took}"
    # End to end, the stated bound: T*B/(B-1) + two trigger intervals. A trigger interval
    # is the time from one micro-batch's start to the next: trigger_s while Spark keeps up,
    # a trigger's own duration (Spark's triggerExecution) when it falls behind (the next
    # starts at once), so on a busy machine slower batches stretch the two intervals,
    # never T*B/(B-1).
    interval = max([trigger_s] + [d for b, d in took.items() if b > 0])
    bound = timeout_s * buckets / (buckets - 1) + 2 * interval
    worst = max(lat, key=lat.__getitem__)
    kind = "timeout" if worst in unconfirmed else "explicit failure"
    assert lat[worst] <= bound + 0.25, (
        f"{kind} {worst} replayed {lat[worst]:.2f}s after its batch settled > {bound:.2f}s "
        f"+ 0.25s (micro-batches took {took}s)"
    )
    st = ft.layer.stats()
    assert st.pending == 0 and st.queued_replays == 0 and st.dead_letters == 0


def test_available_now_runs_until_nothing_is_pending(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """``trigger(availableNow=True)`` ends only when every record of the source completed:
    replays of failures and of timeouts included, no ``drain()``. Catches: the query
    ending with replays queued or records pending, a replay stream that never ends."""
    ft = make_ft(timeout_s=2.0, max_replays=3)
    n = 600
    write_json(tmp_path / "in" / "a.json", range(n))
    pipeline = pipeline_of(ft, probe, fail_mod=6, unc_mod=40)
    stream = spark.readStream.schema("id long, key long").json(str(tmp_path / "in"))
    query = (
        pipeline.with_replays(stream)
        .writeStream.foreachBatch(pipeline)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    assert query.awaitTermination(90), "the availableNow query did not end"
    assert ft.layer is not None
    st = ft.layer.stats()
    assert st.pending == 0 and st.queued_replays == 0, st
    assert set(sink_ids(probe)) == set(range(n))


def test_a_second_pipeline_on_the_same_source_is_refused(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Two pipelines on one namespace and source index, with other schemas: the second is
    refused before it claims anything, with a line naming both; a failed record of the
    first is still the first's. Catches: replays silently taken by another job."""
    ft_a = make_ft(timeout_s=5.0)
    ft_b = FaultTolerance(ft_a.config)  # another job on the same namespace
    try:
        a = pipeline_of(ft_a, probe, fail_mod=10)
        df = spark.range(100).selectExpr("id", "id % 29 as key")
        ft_a.run_batch(a, df, 0)
        assert ft_a.layer is not None and ft_a.layer.stats().queued_replays == 10

        def sink(b: pa.RecordBatch) -> None:
            probe.r.rpush(f"{probe.prefix}:b", b.num_rows)

        b = ft_b.pipeline(source=0).sink_batches(sink)
        other = spark.range(5).selectExpr("cast(id as string) as name", "id as n")
        with pytest.raises(ConfigError, match="source 0 of namespace .* belongs to pipeline"):
            ft_b.run_batch(b, other, 0)
        with pytest.raises(ConfigError, match="belongs to pipeline"):
            b.with_replays(spark.readStream.schema("name string, n long").json(str(tmp_path)))
        assert ft_a.layer.stats().queued_replays == 10  # nothing claimed by b
        assert probe.r.llen(f"{probe.prefix}:b") == 0
        named = ft_b.pipeline(source=0, name="b").sink_batches(sink)
        with pytest.raises(ConfigError, match=r"this is \[b @ struct<name:string,n:bigint>\]"):
            ft_b.run_batch(named, other, 0)
        ft_b.run_batch(ft_b.pipeline(source=1).sink_batches(sink), other, 0)  # its own source
        assert ft_a.drain(timeout_s=60).drained
        assert set(sink_ids(probe)) == set(range(100))
    finally:
        ft_b.close()


def test_streamed_replays_of_a_batch_longer_than_the_timeout_are_kept_alive(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """A micro-batch that runs streamed replays for longer than their timeout (a rotation
    every 0.5 s meanwhile): the driver keeps them alive, so none times out and none
    reaches the sink twice. Catches: streamed replays left out of the batch's heartbeat."""
    ft = make_ft(timeout_s=1.0, rotate=True, max_replays=3)
    n = 300
    write_json(tmp_path / "in" / "a.json", range(n))

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        return Outcome(b, failed=first_seen(probe, "s2", ids, ids % 5 == 3), errors="once")

    def slow_sink(b: pa.RecordBatch) -> None:
        ids = b.column("id").to_numpy()
        if (ids % 5 == 3).any():  # a batch of replays: longer than their timeout
            time.sleep(2.5)
        probe.r.rpush(f"{probe.prefix}:sink", *ids.tolist())

    pipeline = (
        ft.pipeline(source=0)
        .map_batches(lambda b: b, "id long, key long")
        .partition_by(["key"], 2)
        .map_batches(stage2, "id long, key long")
        .sink_batches(slow_sink)
    )
    stream = spark.readStream.schema("id long, key long").json(str(tmp_path / "in"))
    query = (
        pipeline.with_replays(stream).writeStream.foreachBatch(pipeline)
        .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start()
    )  # fmt: skip
    assert query.awaitTermination(90), "the availableNow query did not end"
    assert ft.layer is not None
    st = ft.layer.stats()
    got = sink_ids(probe)
    assert st.failed_timeout == 0, st
    assert set(got) == set(range(n)) and max(got.values()) == 1
    assert st.pending == 0


def test_a_query_without_the_replay_stream_says_why_its_replays_wait(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path,
    redis_server: EmbeddedRedis, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """A query written as jobs were before the replay stream (the source's stream straight
    into foreachBatch), 200 of 2,000 rows failing once after the shuffle, then no new
    input: its replays wait -- and it says so, once, on the driver and on the status page,
    naming the fix. Built with the replay stream, the same pipeline runs them, and the
    warning goes; static batches and drain()'s are never warned. Catches (on main: 200
    pending and queued, nothing said): a stall without a word, a warning repeated every
    batch, a warning on a pipeline that carries the replay stream or is not streaming."""
    ft = make_ft(timeout_s=30)
    n = 2000
    write_json(tmp_path / "in" / "a.json", range(n))
    pipeline = pipeline_of(ft, probe, fail_mod=10)
    layer = ft.layer
    assert layer is not None

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records
                if "does not carry the replay stream" in r.getMessage()]  # fmt: skip

    def run(stream: Any, name: str) -> Any:
        return (stream.writeStream.foreachBatch(pipeline).trigger(processingTime="0.5 seconds")
                .option("checkpointLocation", str(tmp_path / name)).start())  # fmt: skip

    caplog.set_level(logging.WARNING, logger="ftlayer.unreplayed")
    old_style = run(spark.readStream.schema("id long, key long").json(str(tmp_path / "in")),
                    "ck1")  # fmt: skip
    try:
        until(lambda: len(sink_ids(probe)) == n - 200, "the rows that did not fail", 60, 0.25)
        until(lambda: layer.stats().queued_replays == 200, "200 replays queued", 30, 0.25)
        time.sleep(2)  # quiet input: triggers find nothing, the replays wait
        assert layer.stats().queued_replays == 200 and len(sink_ids(probe)) == n - 200
        with Serve(redis_server.url, ft.config.namespace, tmp_path / "serve.log",
                   timeout_s=30) as serve:  # fmt: skip
            code, body = serve.get("/api/status")
        assert code == 200, body
        warned = [w for w in json.loads(body)["warnings"] if "replay stream" in w]
        assert len(warned) == 1 and "200 replays queued" in warned[0], warned
        assert "pipeline.stream(spark)" in warned[0]
    finally:
        old_style.stop()
    assert len(said()) == 1, said()  # once, however many batches ran
    assert "pipeline.with_replays(stream)" in said()[0] and "source 0" in said()[0]

    (tmp_path / "quiet").mkdir()
    fixed = run(pipeline.with_replays(spark.readStream.schema("id long, key long")
                                      .json(str(tmp_path / "quiet"))), "ck2")  # fmt: skip
    try:
        until(lambda: set(sink_ids(probe)) == set(range(n)), "the replays in the sink", 60, 0.25)
    finally:
        fixed.stop()
    assert not layer.client.hgetall(layer.keyspace.unreplayed), "the note outlived the fix"
    pipeline(spark.createDataFrame([(n + i, i) for i in range(10)], "id long, key long"), 99)
    ft.drain(timeout_s=60)  # the static batch's failed row, by drain()'s own batches
    assert set(sink_ids(probe)) == set(range(n + 10))
    assert len(said()) == 1, said()
