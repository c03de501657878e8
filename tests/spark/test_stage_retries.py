"""A row failing past a shuffle is replayed at once, at its stage, in the task that holds
it (real Spark local[2], real Redis): the stages before the shuffle do not run again, a
fanned-out row's siblings are not sent again, the attempts count against the budget, and
a stage whose rows mostly fail lets them wait in the replay queue (its breaker).

Each test counts calls per record in Redis from inside the stages (tests.spark.probe), so
"did not run again" is observed, not inferred.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer.history import read_batches, stage_table
from ftlayer.spark import ErrorPolicy, FaultTolerance, Outcome
from tests.spark.probe import Counted, FailsOnce, FanOut, Probe, calls, first_seen, times_seen
from tests.toolkit import source_df

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

S2 = "map_batches[1.0] stage2"


class DownStream:
    """A stage calling a downstream that is down while the key ``down`` exists: it fails
    every row then; each call is counted per id under ``s2``."""

    def __init__(self, probe: Probe, down: str) -> None:
        self.probe, self.down = probe, down
        self.__name__ = "stage2"

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        times_seen(self.probe, "s2", ids)
        is_down = bool(self.probe.r.exists(self.down))
        return Outcome(b, failed=np.full(len(ids), is_down), errors="downstream is down")


def dead_letters(ft: FaultTolerance) -> dict[int, Any]:
    assert ft.layer is not None
    return {d.frame.decode()["id"]: d for d in ft.layer.persistence.dead_letters()}


def test_a_failed_child_past_the_shuffle_replays_alone_at_its_stage(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Stage 1 (before the shuffle) makes two children of ids = 0 (mod 5); stage 2 (after
    it) fails the second child of ids = 1 (mod 13) once, and id 501 every time. Catches:
    a failure past the shuffle queued for a later batch (or replayed from the source: stage
    1 would run again), a failed child's sibling sent again (written twice), attempts in
    the task not counted against max_replays (id 501 replayed on from the queue) or missing
    from the layer's counters."""
    ft = make_ft(max_replays=2, timeout_s=5.0)
    n, poison = 2000, 501  # not fanned out: one row
    ids_all = np.arange(n)
    fan = set(ids_all[ids_all % 5 == 0].tolist())
    flaky = {i for i in range(n) if i % 13 == 1 and i in fan}  # their 2nd child fails once

    stage1 = FanOut(probe, 29)

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids, copy = b.column("id").to_numpy(), b.column("copy").to_numpy()
        times_seen(probe, "s2", ids[copy == 1])
        failed = first_seen(probe, "f2", ids, (ids % 13 == 1) & (copy == 1))
        failed = np.union1d(failed, np.flatnonzero(ids == poison))
        return Outcome(b, failed=failed, errors="stage 2 fails it")

    def sink(b: pa.RecordBatch) -> None:
        keys = [f"{i}:{c}" for i, c in zip(b.column("id").to_pylist(),
                                           b.column("copy").to_pylist(), strict=True)]  # fmt: skip
        probe.r.rpush(f"{probe.prefix}:sink", *keys)

    pipeline = (ft.pipeline().map_batches(stage1, "id long, key long, copy long")
                .partition_by(["key"], 4).map_batches(stage2, "id long, key long, copy long")
                .sink_batches(sink))  # fmt: skip
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert res.fold_ok and res.fresh == n
    # flaky children once each; the poison row twice (max_replays=2), then dead-lettered
    assert res.immediate_replays == len(flaky) + 2, res
    assert res.stages[S2].replayed == len(flaky) + 2 and res.failed == 1, res.stages[S2]
    st = ft.layer.stats()
    assert st.queued_replays == 0 and st.pending == 0 and st.dead_letters == 1, st
    assert st.failed_explicit == len(flaky) + 3, st  # every attempt counted
    assert set(calls(probe, "s1").values()) == {1}, "a stage before the shuffle ran again"
    second = calls(probe, "s2")
    assert {i: second[i] for i in flaky} == dict.fromkeys(flaky, 2), "one retry each"
    got = Counter(probe.strings("sink"))
    want = {f"{i}:0" for i in range(n)} | {f"{i}:1" for i in fan}
    want.discard(f"{poison}:0")
    assert set(got) == want, "lost rows, or a dead letter written"
    assert max(got.values()) == 1, [k for k, c in got.items() if c > 1][:5]
    letter = dead_letters(ft)[poison]
    assert letter.attempts == 3 and len(letter.history) == 1, letter.history
    assert "stage 2 fails it" in letter.history[0].error


def test_a_stage_that_mostly_fails_is_retried_at_once_when_its_breaker_never_opens(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """``breaker_share=1.0``: a stage failing every row the first time is not held; each
    row is replayed at once and lands. Catches: the breaker opening when told never to."""
    ft = make_ft(max_replays=3, timeout_s=5.0)
    n = 800

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        times_seen(probe, "s2", ids)
        return Outcome(b, failed=first_seen(probe, "f2", ids, np.ones(len(ids), bool)),
                       errors="fails the first time")  # fmt: skip

    pipeline = (ft.pipeline().partition_by(["key"], 4)
                .map_batches(stage2, "id long, key long, amount long",
                             errors=ErrorPolicy(breaker_share=1.0))
                .sink_batches(lambda b: probe.r.rpush(f"{probe.prefix}:sink",
                                                      *b.column("id").to_pylist())))  # fmt: skip
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert res.stages[S2].held == 0 and res.immediate_replays == n, res.stages[S2]
    assert res.failed == 0 and ft.layer.stats().queued_replays == 0
    assert set(calls(probe, "s2").values()) == {2}
    assert sorted(probe.ids()) == list(range(n))


class Retried:
    """A batch stage failing the rows whose ``id % 20 == fails`` the first time it sees
    them; each call noted under ``tag``: 1 when every row of it was seen before (a replay
    at once), else 0."""

    def __init__(self, probe: Probe, tag: str, fails: int) -> None:
        self.probe, self.tag, self.fails = probe, tag, fails
        self.__name__ = f"retried_{tag}"

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        seen = times_seen(self.probe, self.tag, ids)
        self.probe.r.rpush(f"{self.probe.prefix}:calls_{self.tag}", int((seen > 1).all()))
        failed = first_seen(self.probe, f"f_{self.tag}", ids, ids % 20 == self.fails)
        return Outcome(b, failed=failed, errors="fails the first time")


def test_a_tasks_failed_rows_are_replayed_together_not_per_input_batch(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Spark hands each task batches of 100 rows here; 5 % of the rows of a stage before
    the shuffle and of one after it fail once. Each task replays its failed rows at once,
    gathered: one more call of the stage a task, not one for each input batch (the fixed
    cost of a call on a few rows, paid 30 times). Catches: replays at once made per input
    batch, or rows lost or doubled when gathered."""
    ft = make_ft(max_replays=3)
    n, key = 3000, "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "100")
    cols = "id long, key long, amount long"

    def sink(b: pa.RecordBatch) -> None:
        probe.r.rpush(f"{probe.prefix}:sink", *b.column("id").to_pylist())

    try:
        pipeline = (ft.pipeline().map_batches(Retried(probe, "s1", 0), cols)
                    .partition_by(["key"], 2).map_batches(Retried(probe, "s2", 7), cols)
                    .sink_batches(sink))  # fmt: skip
        res = ft.run_batch(pipeline, source_df(spark, n, parts=3), 0)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    assert sorted(probe.ids()) == list(range(n))
    assert res.failed == 0 and res.immediate_replays == 2 * n // 20, res
    for tag, tasks in (("s1", 3), ("s2", 2)):
        kinds = Counter(probe.ids(f"calls_{tag}"))
        assert kinds[0] >= 15 and 1 <= kinds[1] <= tasks, (tag, kinds)
        assert set(calls(probe, tag).values()) <= {1, 2}


def test_a_python_stage_among_dataframe_stages_replays_its_tasks_failures_together(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """The same over DataFrame stages: a Python stage past the shuffle, given batches of
    100 rows, fails 5 % of them once; each task replays its failed rows together, once,
    and every row lands in the Parquet sink once. Catches: replays at once made per input
    batch there, or gathered rows lost, doubled or answered without their identity."""
    from pyspark.sql import functions as F  # noqa: N812

    ft = make_ft(max_replays=3)
    n, key, out = 3000, "spark.sql.execution.arrow.maxRecordsPerBatch", tmp_path / "out"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "100")
    try:
        pipeline = (ft.pipeline(name="frames")
                    .transform(lambda df: df.withColumn("twice", F.col("id") * 2))
                    .partition_by(["key"], 2)
                    .map_batches(Retried(probe, "s2", 7), "id long, key long, amount long, "
                                                         "twice long")
                    .sink_dataframe(lambda df, _: df.write.parquet(str(out))))  # fmt: skip
        res = ft.run_batch(pipeline, source_df(spark, n), 0)
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)
    got = Counter(r["id"] for r in spark.read.parquet(str(out)).select("id").collect())
    assert set(got) == set(range(n)) and max(got.values()) == 1
    assert res.failed == 0 and ft.layer.stats().queued_replays == 0, res
    kinds = Counter(probe.ids("calls_s2"))
    assert kinds[0] >= 15 and 1 <= kinds[1] <= 2, kinds
    assert set(calls(probe, "s2").values()) <= {1, 2}


def test_replay_from_source_retries_nothing_past_the_shuffle(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """``replay_from="source"`` (Storm's rule): a row failing once after the shuffle is
    not retried there; it replays from its source record in a later batch, through
    stage 1 again, and lands once. Catches: the option ignored (retried at the stage),
    a replay that skips the stages before the failing one."""
    ft = make_ft(max_replays=3, timeout_s=5.0)
    n = 600

    schema = "id long, key long, amount long"
    pipeline = (ft.pipeline(replay_from="source").map_batches(Counted(probe, "s1"), schema)
                .partition_by(["key"], 4).map_batches(FailsOnce(probe, 7, 3), schema)
                .sink_batches(lambda b: probe.r.rpush(f"{probe.prefix}:sink",
                                                      *b.column("id").to_pylist())))  # fmt: skip
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    flaky = {i for i in range(n) if i % 7 == 3}
    assert res.immediate_replays == 0 and res.failed == len(flaky), res
    assert ft.drain(timeout_s=60, pipeline=pipeline).drained
    assert Counter(probe.ids("sink")) == Counter(range(n)), "lost or duplicated"
    seen = calls(probe, "s1")
    assert {i for i, c in seen.items() if c == 2} == flaky, "stage 1 did not run again"


def test_an_outage_holds_rows_until_the_breaker_probes_and_charges_no_attempt(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """A stage past the shuffle whose downstream is down (a flag in Redis) fails every
    row. In batch 0 its rows fail (one attempt each), none is replayed at once, and its
    breaker opens; batch 1, run while the breaker is open, does not call the stage: its
    rows and batch 0's replays are held (no attempt charged). At the breaker's due time a
    batch probes it (still down): each held row is called once, and the breaker reopens.
    The downstream comes back; the next probe lands everything, and the breaker closes
    (how long it stays open: test_held_replays). Catches: a down downstream hammered
    (more than one call per row per probe), rows that never reached the stage charged an
    attempt, held rows not due at the breaker's probe, the breaker not reopening or never
    closing, held rows not counted and shown."""
    ft = make_ft(max_replays=3, timeout_s=10.0)
    n, down = 400, f"{probe.prefix}:down"
    probe.r.set(down, 1)

    stage2 = DownStream(probe, down)
    pipeline = (ft.pipeline().partition_by(["key"], 4)
                .map_batches(stage2, "id long, key long, amount long",
                             errors=ErrorPolicy(breaker_open_s=6.0, breaker_max_open_s=6.0))
                .sink_batches(lambda b: probe.r.rpush(f"{probe.prefix}:sink",
                                                      *b.column("id").to_pylist())))  # fmt: skip
    first = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert first.stages[S2].failed == n and first.immediate_replays == 0, first.stages
    second = ft.run_batch(pipeline, source_df(spark, 2 * n).where(f"id >= {n}"), 1)
    assert second.replayed == n and second.stages[S2].held == 2 * n, second.stages
    assert set(calls(probe, "s2")) == set(range(n)), "called while its breaker was open"
    st = ft.layer.stats()
    assert (st.held, st.failed_explicit, st.queued_replays) == (2 * n, n, 2 * n), st
    shown = stage_table(read_batches(ft.layer.client, ft.layer.keyspace, 0.0))
    assert {r["stage"]: r["held"] for r in shown}[S2] == 2 * n, shown
    key = ft.layer.keyspace.breakers(0)
    until_s, open_s = json.loads(ft.layer.client.hget(key, S2))
    assert open_s == 6.0
    # held for the breaker's probe: due when it ends (not claimable before: test_held_replays)
    delayed, due = ft.layer.persistence.delayed(0)
    assert delayed == 2 * n and due is not None and abs(due - until_s) < 0.01, (due, until_s)
    time.sleep(max(0.0, due - time.time()) + 0.2)
    probed = ft.run_batch(pipeline, spark.range(0).selectExpr("id", "id as key",
                          "id as amount"), 3)  # fmt: skip
    assert probed.replayed == 2 * n and probed.stages[S2].failed == 2 * n, probed.stages
    assert json.loads(ft.layer.client.hget(key, S2))[0] > until_s  # open again

    probe.r.delete(down)
    report = ft.drain(timeout_s=60)  # held again until the probe, which lands them
    assert report.drained and report.dead_lettered == 0, report
    assert ft.layer.client.hget(key, S2) is None, "the breaker did not close"
    assert sorted(probe.ids()) == list(range(2 * n))
    got = calls(probe, "s2")
    assert max(got.values()) <= 3 and {got[i] for i in range(n)} == {3}, "hammered"
    st = ft.layer.stats()
    assert (st.pending, st.dead_letters, st.failed_explicit) == (0, 0, 3 * n), st


def test_a_python_stage_among_dataframe_stages_replays_at_its_stage(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """DataFrame stages, a keyed shuffle, then a Python stage failing ids = 3 (mod 7) once
    and id 77 every time, into a Parquet sink. Catches: the Python stage's failures queued
    instead of replayed in its task, the stage before the shuffle run again, a retried
    row written twice or lost, the attempts used in the task not reaching the dead letter
    (id 77 replayed on from the queue past max_replays)."""
    from pyspark.sql import functions as F  # noqa: N812

    ft = make_ft(max_replays=2, timeout_s=5.0)
    n, poison, out = 700, 77, tmp_path / "out"

    def stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        times_seen(probe, "s1", b.column("id").to_numpy())
        return b

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        times_seen(probe, "s2", ids)
        failed = np.union1d(first_seen(probe, "f2", ids, ids % 7 == 3),
                            np.flatnonzero(ids == poison))  # fmt: skip
        return Outcome(b, failed=failed, errors="stage 2 fails it")

    schema = "id long, key long, amount long, twice long"
    pipeline = (ft.pipeline(name="frames")
                .transform(lambda df: df.withColumn("twice", F.col("id") * 2))
                .map_batches(stage1, schema).partition_by(["key"], 3)
                .map_batches(stage2, schema)
                .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert (res.fresh, res.failed) == (n, 1), res
    st = ft.layer.stats()
    assert st.queued_replays == 0 and st.pending == 0 and st.dead_letters == 1, st
    assert set(calls(probe, "s1").values()) == {1}, "a stage before the shuffle ran again"
    second = calls(probe, "s2")
    flaky = {i for i in range(n) if i % 7 == 3}
    assert {i: second[i] for i in flaky} == dict.fromkeys(flaky, 2)
    assert second[poison] == 3  # its first attempt and max_replays=2 more, in the task
    got = Counter(r["id"] for r in spark.read.parquet(str(out)).select("id").collect())
    assert set(got) == set(range(n)) - {poison} and max(got.values()) == 1
    letter = dead_letters(ft)[poison]
    assert letter.attempts == 3, letter.history


def test_an_outage_of_a_python_stage_among_dataframe_stages_holds_its_rows(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """The outage test on DataFrame stages with a Python stage past the shuffle into
    Parquet: the batch that finds it down opens its breaker, the next batch does not call
    it (its rows and the replays are held), and after its breaker's time a drain lands
    everything once. Catches: the breaker not opening over DataFrame stages' counts, the
    Python step ignoring its open breaker, held rows charged (max_replays=1 would
    dead-letter batch 0's rows) or lost."""
    from pyspark.sql import functions as F  # noqa: N812

    ft = make_ft(max_replays=1, timeout_s=10.0)
    n, down, out = 300, f"{probe.prefix}:down", tmp_path / "out"
    probe.r.set(down, 1)

    stage2 = DownStream(probe, down)
    schema = "id long, key long, amount long, twice long"
    pipeline = (ft.pipeline(name="frames")
                .transform(lambda df: df.withColumn("twice", F.col("id") * 2))
                .partition_by(["key"], 3)
                .map_batches(stage2, schema, errors=ErrorPolicy(breaker_open_s=1.0))
                .sink_dataframe(lambda df, _: df.write.mode("append").parquet(str(out))))
    first = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert first.stages[S2].failed == n, first.stages
    second = ft.run_batch(pipeline, source_df(spark, 2 * n).where(f"id >= {n}"), 1)
    assert second.replayed == n and second.stages[S2].held == 2 * n, second.stages
    assert set(calls(probe, "s2")) == set(range(n)), "called while its breaker was open"
    st = ft.layer.stats()
    assert (st.held, st.failed_explicit, st.queued_replays) == (2 * n, n, 2 * n), st
    probe.r.delete(down)
    report = ft.drain(timeout_s=60, pipeline=pipeline)  # held until the probe lands them
    assert report.drained and report.dead_lettered == 0, report
    got = Counter(r["id"] for r in spark.read.parquet(str(out)).select("id").collect())
    assert set(got) == set(range(2 * n)) and max(got.values()) == 1
    assert max(calls(probe, "s2").values()) <= 2
