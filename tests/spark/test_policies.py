"""Bad input, error policies, backpressure, drain leftovers, worker-side rules."""

from __future__ import annotations

import logging
import pickle
import sys
import time
from collections import Counter
from typing import Any

import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer import ConfigError, FailRecord
from ftlayer.spark import FaultTolerance
from tests.spark.probe import Probe

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark


@pytest.mark.parametrize("scope", ["batch", "task"])
def test_bad_input_is_named_counted_and_everything_else_runs(
    spark: SparkSession, make_ft: Any, probe: Probe, scope: str
) -> None:
    """A key that does not fit its partition_by type fails its record; an undecodable
    replay is dead-lettered at once: both end in the dead-letter list with their failure history.
    With ``ack_scope="task"`` rows msgpack cannot carry (an array of decimals) are
    rejected at the source (named, counted, dead-lettered with their repr); the batch
    scope persists rows as Arrow and carries them. Nothing is acked to make them go
    away."""
    ft = make_ft(timeout_s=30, max_replays=1)
    layer = ft.layer
    h = layer.handler(partition=0)  # a persisted record whose payload is not msgpack
    garbage = h.persist(b"\xc1 not msgpack", hash_code=0, source=0, partition=0)
    h.fail(garbage, "set up")
    h.flush()

    df = spark.range(2000).select(
        "id",
        (F.col("id") % 11).cast("int").alias("key"),
        F.when(F.col("id") % 100 == 5, F.array(F.lit(1.5).cast("decimal(10,2)"))).alias("xs"),
    )

    def rekey(r: dict[str, Any]) -> dict[str, Any]:
        return {**r, "k2": {"bad": 1} if r["id"] % 100 == 7 else r["key"]}

    pipeline = (
        ft.pipeline(key=["key"], ack_scope=scope)  # type: ignore[arg-type]
        .map(rekey)
        .partition_by(["k2"], 3, types=["int"])
        .sink(probe.write, per="partition")
    )
    result = ft.run_batch(pipeline, df, 0)
    assert result.undecodable == 1
    rejected = {i for i in range(2000) if i % 100 == 5} if scope == "task" else set()
    assert result.rejected == len(rejected)
    if scope == "task":
        assert "source=0" in result.rejects[0] and "key={'key':" in result.rejects[0]
        assert "cannot be encoded as msgpack" in result.rejects[0]
    assert result.failed == 20
    assert any("partition_by['k2']" in e for e in result.errors)
    report = ft.drain(timeout_s=30)
    assert report.drained and report.dead_lettered == 21 + len(rejected)
    dead = layer.persistence.dead_letters()
    histories = [" | ".join(f.error for f in d.history) for d in dead]
    assert sum("undecodable replay payload" in t for t in histories) == 1
    assert sum("partition_by" in t for t in histories) == 20
    # rejected rows are dead letters (budget 0, never replayed), with the row's repr
    kept = [d for d in dead if "rejected: source=0" in d.history[0].error]
    assert len(kept) == len(rejected) and all(len(d.history) == 1 for d in kept)
    assert {int(d.frame.decode().split("'id': ")[1].split(",")[0]) for d in kept} == rejected
    bad_keys = {i for i in range(2000) if i % 100 == 7}
    assert sorted(probe.ids()) == sorted(set(range(2000)) - rejected - bad_keys)


def test_a_map_key_column_is_a_clear_config_error(spark: SparkSession, make_ft: Any) -> None:
    ft = make_ft()
    df = spark.range(3).select("id", F.create_map(F.lit("a"), F.col("id")).alias("m"))
    with pytest.raises(ConfigError, match="key column 'm' has type map"):
        ft.run_batch(ft.pipeline(key="m").sink(print), df, 0)
    with pytest.raises(ConfigError, match="not in the input"):
        ft.run_batch(ft.pipeline(key="nope").sink(print), df, 0)
    with pytest.raises(ConfigError, match="no sink"):
        ft.run_batch(ft.pipeline(), df, 0)
    # refused before anything ran: no record persisted, claimed, or left pending
    st = ft.layer.stats()
    assert (st.persisted, st.pending, st.unsettled_segments, st.replays_claimed) == (0, 0, 0, 0)
    assert ft.results == [] and not ft.layer.segments.indexed()


def test_fail_batch_lets_spark_retry_the_task_and_loses_nothing(
    spark: SparkSession, make_ft: Any, probe: Probe, task_retries: int
) -> None:
    ft = make_ft(timeout_s=30)

    def flaky(r: dict[str, Any]) -> dict[str, Any]:
        tc = TaskContext.get()
        if tc.partitionId() == 1 and tc.attemptNumber() == 0 and r["id"] > 1500:
            raise RuntimeError("executor trouble")  # kills the attempt: nothing flushed
        return r

    df = spark.range(0, 3000, numPartitions=2)
    p = ft.pipeline(on_error="fail_batch").map(flaky).sink(probe.write, per="partition")
    result = ft.run_batch(p, df, 0)
    assert result.failed == 0 and result.written == 3000
    assert sorted(probe.ids()) == list(range(3000))  # the failed attempt wrote nothing
    st = ft.layer.stats()
    assert st.pending == 0 and st.completed == 3000 and st.persisted == 3000


def test_replayed_records_look_like_fresh_ones(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Dates, timestamps, decimals and binary survive the msgpack round trip."""
    ft = make_ft()
    df = spark.range(200).select(
        "id",
        F.timestamp_seconds(F.col("id") * 7777).alias("ts"),
        F.to_date(F.timestamp_seconds(F.col("id") * 86400)).alias("day"),
        (F.col("id") / 7).cast("decimal(10,4)").alias("amount"),
        F.col("id").cast("string").cast("binary").alias("raw"),
        F.array(F.col("id"), F.lit(None)).alias("xs"),
    )

    def once(r: dict[str, Any]) -> dict[str, Any]:
        probe.write_one(r)
        if probe.first_time("seen", r["id"]):
            raise FailRecord("again")
        return r

    # immediate_replays=0: the replay comes back through its persisted segment
    ft.run_batch(ft.pipeline(immediate_replays=0).map(once).sink(lambda r: None), df, 0)
    assert ft.drain(timeout_s=30).drained
    seen = Counter(probe.strings("out"))
    # Spark is the oracle: each record as Row.asDict() gives it, seen fresh and replayed
    spark_rows = {repr(sorted(r.asDict(recursive=True).items())) for r in df.collect()}
    assert set(seen) == spark_rows and set(seen.values()) == {2}


def test_backpressure_waits_bounded_and_drain_reports_what_remains(
    spark: SparkSession, make_ft: Any, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant 10: a drain waits with a deadline and reports what is still pending;
    backpressure waits are bounded too. Nothing is dropped."""
    ft = make_ft(timeout_s=60, max_pending=2, backpressure_timeout_s=0.3)
    h = ft.layer.handler(partition=0)
    for i in range(3):  # pending, never acked, long timeout
        h.persist_record({"id": i}, source=0)
    h.flush()
    with caplog.at_level(logging.INFO, logger="ftlayer"):
        result = ft.run_batch(ft.pipeline().sink(probe.write, per="partition"), spark.range(10), 7)
    assert result.written == 10
    assert "backpressure" in caplog.text and "batch_id=7" in caplog.text
    report = ft.drain(timeout_s=0.5)
    assert not report.drained and report.pending == 3
    assert ft.layer.stats().pending == 3  # still there: reported, not dropped


def test_backpressure_never_waits_on_replays_only_a_batch_can_claim(
    spark: SparkSession, make_ft: Any, probe: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    """Queued replays are pending but not in flight; only the next
    batch's claim moves them. Counting them made the next batch (and every drain batch)
    wait out ``backpressure_timeout_s``; drain(timeout_s=3) took 13.5 s."""
    ft = make_ft(timeout_s=2, max_pending=5, backpressure_timeout_s=20)

    def once(r: dict[str, Any]) -> dict[str, Any]:
        if r["id"] % 5 == 0 and probe.first_time("failed", r["id"]):
            raise FailRecord("first attempt")
        return r

    pipeline = ft.pipeline(immediate_replays=0).map(once).sink(probe.write, per="partition")
    first = ft.run_batch(pipeline, spark.range(60), 0)
    assert first.failed == 12 and ft.layer.stats().queued_replays == 12  # 12 > max_pending
    with caplog.at_level(logging.INFO, logger="ftlayer"):
        second = ft.run_batch(pipeline, spark.range(60, 70), 1)
    assert second.replayed == 12 and "backpressure" not in caplog.text
    ft.run_batch(pipeline, spark.range(70, 130), 2)  # 12 more queued (and 2 from batch 1)
    assert ft.layer.stats().queued_replays == 12
    h = ft.layer.handler(partition=0)  # 6 in flight (> max_pending): lost, they time out
    for i in range(1000, 1006):
        h.persist_record({"id": i}, source=0)
    h.flush()
    started = time.monotonic()
    report = ft.drain(timeout_s=10)  # its batches never wait for room
    assert report.drained, report
    assert time.monotonic() - started < 10
    assert sorted(probe.ids()) == [*range(130), *range(1000, 1006)]


def test_ft_off_needs_no_redis_and_a_pickled_fault_tolerance_rebuilds_from_its_config(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    off = FaultTolerance(make_ft().config.__class__(status="off"))
    assert off.layer is None
    result = off.run_batch(off.pipeline().sink(probe.write, per="partition"), spark.range(5), 0)
    assert result.written == 5 and off.drain().drained
    # Spark Connect pickles the foreachBatch function (a Pipeline holding its
    # FaultTolerance) into a server process: the copy reconnects from the config
    ft = make_ft(rotate=True, replay_limit=77)
    copy = pickle.loads(pickle.dumps(ft))
    try:
        assert copy is not ft and copy.task_config == ft.task_config
        assert copy.replay_limit == 77 and copy._rotator is None
        assert copy.layer is not None and copy.layer.client is not ft.layer.client
        assert copy.layer.stats().pending == 0  # a live client of its own
    finally:
        copy.close()
