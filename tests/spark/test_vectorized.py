"""The vectorized path end to end (map_batches / map_pandas / sink_batches): real Spark
(local[2]), real Redis (one server, and a 3-master cluster), no mocks.

Every test checks the outcome from the sink's side -- which source ids reached it, how
often -- against the dead letters and the FT layer's stats: nothing lost (every id reached
the sink or is a dead letter), nothing left pending, and no segment (``:seg:``) or task
summary (``:sum:``) left in Redis once the batches settled. Each test names, in a comment,
the product breaks it catches.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.errors import ConfigError
from ftlayer.segments import SUMMARY_TTL_MS
from ftlayer.spark import FaultTolerance, Outcome
from tests.spark.probe import Probe, times_seen
from tests.toolkit import source_df, until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

S1 = "map_batches[0.0] stage1"
S2 = "map_batches[1.0] stage2"


# -- helpers (run in Spark's workers: they only touch Redis through a Probe) -------------
def first_times(probe: Probe, tag: str, ids: np.ndarray) -> np.ndarray:
    """For each id, True when this is the first time ``tag`` saw it (one round trip)."""
    if len(ids) == 0:
        return np.zeros(0, bool)
    with probe.r.pipeline(transaction=False) as p:
        for i in ids.tolist():
            p.sadd(f"{probe.prefix}:{tag}", i)
        return np.array(p.execute(), dtype=bool)


def first_seen(probe: Probe, tag: str, ids: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Indices of the rows where ``where`` holds whose id ``tag`` sees for the first time."""
    cand = np.flatnonzero(where)
    return cand[first_times(probe, tag, ids[cand])]


def push(probe: Probe, what: str, values: list[Any]) -> None:
    if values:
        probe.r.rpush(f"{probe.prefix}:{what}", *[str(v) for v in values])


def ids_of(batch: pa.RecordBatch) -> np.ndarray:
    return batch.column("id").to_numpy()


# -- helpers (driver side) ---------------------------------------------------------------
def leftover_keys(ft: FaultTolerance, part: str) -> list[bytes]:
    assert ft.layer is not None
    pattern = f"ft:{{{ft.config.namespace}:*{part}*"
    return list(ft.layer.client.scan_iter(match=pattern, count=1000))


def assert_settled(ft: FaultTolerance) -> None:
    """No segment and no task summary of this namespace is left in Redis."""
    assert leftover_keys(ft, ":seg:") == []
    assert leftover_keys(ft, ":sum:") == []


def dead_letters(ft: FaultTolerance) -> dict[int, Any]:
    assert ft.layer is not None
    return {d.frame.decode()["id"]: d for d in ft.layer.persistence.dead_letters()}


def _backend(backend: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """make_ft overrides: the session's single Redis (also ``keyed``), or the 3-master
    cluster."""
    if backend in ("single", "keyed"):
        return {}
    return {"redis_url": request.getfixturevalue("redis_cluster").url}


# -- 1 and 9: explicit per-row failures through a keyed shuffle, single server / cluster --
@pytest.mark.parametrize("backend", ["single", "cluster", "keyed"])
def test_explicit_failures_replay_through_a_shuffle(
    spark: SparkSession,
    make_ft: Any,
    probe: Probe,
    backend: str,
    request: pytest.FixtureRequest,
) -> None:
    """Catches: failed rows acked instead of replayed (lost), failed rows' outputs not
    dropped (written twice), residues mapped to the wrong segment row (the wrong record
    replays: lost + duplicate), per-row error texts misaligned with their rows, replays
    never completed (pending > 0), replay budget off by one, segments or summaries not
    deleted at settlement, (cluster) keys of one script call in different slots, and
    (keyed: ``record_key="id"``, no id column) a failure past the shuffle -- of a fresh
    row or of a replay -- mapped by its key to the wrong record, or to none."""
    ft = make_ft(max_replays=3, timeout_s=5.0, **_backend(backend, request))
    n = 3000
    ids_all = np.arange(n)
    poison = set(ids_all[ids_all % 997 == 5].tolist())
    a7 = set(ids_all[(ids_all % 7 == 3)].tolist()) - poison  # fail once in stage 1
    b11 = set(ids_all[(ids_all % 11 == 4)].tolist()) - poison  # fail once in stage 2

    def stage1(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        bad = ids % 997 == 5
        first = first_seen(probe, "s1", ids, (ids % 7 == 3) & ~bad)
        # unsorted indices with one error each, to check errors stay with their rows
        failed = np.concatenate([np.flatnonzero(bad), first])[::-1]
        errors = [f"poison {i}" if i % 997 == 5 else f"first try {i}" for i in ids[failed]]
        out = pa.RecordBatch.from_arrays(
            [b.column("id"), b.column("key"), pc.multiply(b.column("amount"), 1.5)],
            names=["id", "key", "total"],
        )
        return Outcome(out, failed=failed, errors=errors)

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        mask = np.zeros(len(ids), bool)
        mask[first_seen(probe, "s2", ids, ids % 11 == 4)] = True
        out = pa.RecordBatch.from_arrays(
            [b.column("id"), b.column("key"), pc.multiply(b.column("total"), 0.2)],
            names=["id", "key", "vat"],
        )
        return Outcome(out, failed=mask, errors="stage 2 rejects it once")

    def sink(b: pa.RecordBatch) -> None:
        push(probe, "sink", ids_of(b).tolist())

    record_key = "id" if backend == "keyed" else None
    pipeline = (
        ft.pipeline(source=0, immediate_replays=0, record_key=record_key)  # failures queue
        .map_batches(stage1, "id long, key long, total double")
        .partition_by(["key"], 4)
        .map_batches(stage2, "id long, key long, vat double")
        .sink_batches(sink)
    )
    first = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert first.fold_ok and first.fresh == n and first.replayed == 0
    assert first.stages[S1].failed == len(poison | a7)
    assert first.stages[S2].failed == len(b11 - a7)
    assert first.failed == len(poison | a7 | b11)
    assert first.written == n - first.failed
    st = ft.layer.stats()
    assert st.pending == st.queued_replays == first.failed  # failed rows replay at once

    report = ft.drain(timeout_s=120)
    assert report.drained and report.pending == 0, report
    dead = dead_letters(ft)
    assert set(dead) == poison
    for i, d in dead.items():
        assert len(d.history) == 4, d.history  # first try + max_replays
        assert all(h.error == f"poison {i}" for h in d.history), d.history
    got = Counter(probe.ids())
    assert set(got) | poison == set(range(n)), "lost records"
    assert set(got) & poison == set()
    assert max(got.values()) == 1, "a record reached the sink twice"
    st = ft.layer.stats()
    assert st.pending == 0 and st.dead_letters == len(poison)
    assert st.failed_explicit == 4 * len(poison) + len(a7) + len(b11)
    assert st.completed == n - len(poison)
    assert_settled(ft)


# -- 1b: failures before the first shuffle are replayed at once, in the source task ------
def test_failures_in_the_source_task_replay_at_once(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: a failed fresh row not replayed in its task (it would wait for the queue),
    the wrong rows replayed (failure indices not mapped back through fan-out to input
    rows: lost + duplicates), a row replayed past its budget, attempts used at the
    source not counted against max_replays (a poison row replayed 3 more times from the
    queue), one history entry not holding the attempt count, immediate attempts missing
    from the Redis counters; and failures after the shuffle not replayed at once in the
    task that holds them, or replayed from the source (the stages before the shuffle run
    again for them)."""
    ft = make_ft(max_replays=3, timeout_s=5.0)
    n = 3000
    all_ids = np.arange(n)
    poison = set(all_ids[all_ids % 997 == 5].tolist())
    twice = set(all_ids[all_ids % 7 == 3].tolist()) - poison  # fail 2 attempts, then pass
    fan = set(all_ids[all_ids % 13 == 6].tolist()) - poison - twice  # 2 children each
    late = set(all_ids[all_ids % 11 == 4].tolist()) - poison - fan  # fail once, after shuffle

    def stage1(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        seen = times_seen(probe, "s1", ids)
        failed = np.flatnonzero((ids % 997 == 5) | (np.isin(ids, list(twice)) & (seen <= 2)))
        errors = [f"attempt {seen[i]} of {ids[i]}" for i in failed]
        is_fan = np.isin(ids, list(fan))
        parents = np.sort(np.concatenate([np.arange(len(ids)), np.flatnonzero(is_fan)]))
        second = np.zeros(len(parents), bool)
        second[1:] = parents[1:] == parents[:-1]
        out = pa.RecordBatch.from_arrays(
            [pa.array(ids[parents]), pa.array(ids[parents] % 29), pa.array(second)],
            names=["id", "key", "second"],
        )
        return Outcome(out, parents=parents, failed=failed, errors=errors)

    def stage1b(b: pa.RecordBatch) -> Outcome:  # before the shuffle: fails 2nd children once
        second = np.flatnonzero(b.column("second").to_numpy(zero_copy_only=False))
        seen = times_seen(probe, "s1b", ids_of(b)[second])
        return Outcome(b, failed=second[seen == 1], errors="second child fails once")

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        mask = np.zeros(len(ids), bool)
        mask[first_seen(probe, "s2", ids, np.isin(ids, list(late)))] = True
        return Outcome(b, failed=mask, errors="stage 2 rejects it once")

    def sink(b: pa.RecordBatch) -> None:
        push(probe, "sink", [f"{i}:{int(s)}" for i, s in
                             zip(ids_of(b).tolist(), b.column("second").to_pylist(), strict=True)])

    pipeline = (
        ft.pipeline(source=0)
        .map_batches(stage1, "id long, key long, second boolean")
        .map_batches(stage1b, "id long, key long, second boolean")
        .partition_by(["key"], 4)
        .map_batches(stage2, "id long, key long, second boolean")
        .sink_batches(sink)
    )
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert res.fold_ok and res.fresh == n and res.replayed == 0
    # the source task replayed: twice 2x, a fanned-out row once, a poison row 3x (budget)
    # ... and the late rows once each, in the task past the shuffle that held them
    assert res.immediate_replays == 2 * len(twice) + len(fan) + 3 * len(poison) + len(late)
    assert res.stages[S1].failed == 2 * len(twice) + 4 * len(poison)
    assert res.stages["map_batches[0.1] stage1b"].failed == len(fan)
    assert res.stages[S2].failed == res.stages[S2].replayed == len(late), res.stages[S2]
    assert res.failed == len(poison)
    st = ft.layer.stats()
    assert st.dead_letters == len(poison)  # attempts spent at the source count
    assert st.queued_replays == 0  # failures after the shuffle replayed where they were
    calls = probe.r.hgetall(f"{probe.prefix}:s1")
    once = late - twice - poison  # the stage before the shuffle did not run again
    assert {int(calls[str(i).encode()]) for i in once} == {1}
    dead = dead_letters(ft)
    assert set(dead) == poison
    for i, d in dead.items():
        assert len(d.history) == 1 and d.attempts == 4, d.history
        assert d.history[0].error.endswith(f"attempt 4 of {i}"), d.history

    report = ft.drain(timeout_s=120)
    assert report.drained and report.pending == 0, report
    got = Counter(probe.strings("sink"))
    firsts = {int(k.split(":")[0]) for k in got if k.endswith(":0")}
    assert firsts | poison == set(range(n)), "lost records"
    assert {int(k.split(":")[0]) for k in got if k.endswith(":1")} == fan
    # at-least-once: a fanned-out row's first child was written by the failed attempt
    # and again by its replay; nothing else twice (late rows: their first write failed)
    dups = {k for k, c in got.items() if c > 1}
    assert dups == {f"{i}:0" for i in fan}, sorted(dups)[:10]
    st = ft.layer.stats()
    assert st.pending == 0 and st.dead_letters == len(poison)
    assert st.failed_explicit == 4 * len(poison) + 2 * len(twice) + len(fan) + len(late)
    assert_settled(ft)


# -- 2: a row that makes a batch function raise is isolated by bisection -------------------
@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_a_raising_row_fails_alone_by_bisection(
    spark: SparkSession, make_ft: Any, probe: Probe, backend: str, request: pytest.FixtureRequest
) -> None:
    """Catches: an exception failing the whole batch (or task) instead of its row, the
    halves' outputs misassembled after bisection (rows lost or doubled), the exception
    text missing from the failure history, bisection in the sink writing rows twice, and
    bisections not counted (or counted far beyond one row's log2(n) levels)."""
    ft = make_ft(max_replays=1, timeout_s=5.0, **_backend(backend, request))
    n, bad1, bad2 = 3000, 1234, 2345

    def stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        if (ids_of(b) == bad1).any():
            raise ValueError(f"poison row {bad1}")
        return pa.RecordBatch.from_arrays(
            [b.column("id"), b.column("key"), pc.add(b.column("amount"), 1)],
            names=["id", "key", "total"],
        )

    def sink(b: pa.RecordBatch) -> None:
        if (ids_of(b) == bad2).any():  # raises before it writes anything
            raise RuntimeError(f"sink refuses {bad2}")
        push(probe, "sink", ids_of(b).tolist())

    pipeline = (
        ft.pipeline()
        .map_batches(stage1, "id long, key long, total double")
        .partition_by(["key"], 4)
        .sink_batches(sink)
    )
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert res.fold_ok and res.failed == 2 and res.written == n - 2
    s1, snk = res.stages[S1], res.stages["sink[1.0] sink"]
    # bad1 fails in the source task, bad2 in the sink's past the shuffle: each replayed
    # there at once (max_replays=1), each fails again
    assert s1.failed == 2 and s1.rows_out == n - 1 and res.immediate_replays == 2
    # one poison row in a task of ~n/3 rows: two calls per halving level
    assert 0 < s1.bisections <= 2 * math.ceil(math.log2(n)), s1
    assert snk.failed == 2 and 0 < snk.bisections <= 2 * math.ceil(math.log2(n)), snk
    assert any(f"ValueError: poison row {bad1}" in e for e in res.errors), res.errors
    report = ft.drain(timeout_s=60)
    assert report.drained and report.dead_lettered == 2, report
    dead = dead_letters(ft)
    assert set(dead) == {bad1, bad2}
    # each dead-lettered at settlement, one history entry standing for its two attempts
    assert len(dead[bad1].history) == 1 and dead[bad1].attempts == 2, dead[bad1].history
    assert len(dead[bad2].history) == 1 and dead[bad2].attempts == 2, dead[bad2].history
    history = dead[bad1].history
    assert all(f"{S1}: ValueError: poison row {bad1}" in h.error for h in history), history
    assert all(f"RuntimeError: sink refuses {bad2}" in h.error for h in dead[bad2].history)
    got = Counter(probe.ids())
    assert set(got) == set(range(n)) - {bad1, bad2}
    assert max(got.values()) == 1
    assert ft.layer.stats().pending == 0
    assert_settled(ft)


# -- 3: fan-out and filtering with parents= -------------------------------------------------
def test_fan_out_and_filtering_with_parents(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: children's ids not folded (records stay pending or complete too early),
    filtered rows (0 children) left pending, a failed child not failing its source record,
    the replay of a fanned-out record not re-emitting all of its children, and stage
    counts that do not match rows in/out."""
    ft = make_ft(timeout_s=5.0)
    n = 2000
    ids_all = np.arange(n)
    kept = set(ids_all[ids_all % 5 != 0].tolist())
    flaky = {i for i in kept if i % 13 == 1}  # child 1 fails once in stage 2

    def stage1(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        parents = np.repeat(np.flatnonzero(ids % 5 != 0), 2)
        out = pa.RecordBatch.from_arrays(
            [
                pa.array(ids[parents]),
                b.column("key").take(pa.array(parents)),
                pa.array(np.tile([0, 1], len(parents) // 2)),
            ],
            names=["id", "key", "copy"],
        )
        return Outcome(out, parents=parents)

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids, copy = ids_of(b), b.column("copy").to_numpy()
        failed = first_seen(probe, "child", ids, (ids % 13 == 1) & (copy == 1))
        return Outcome(b, failed=failed, errors="child 1 fails once")

    def sink(b: pa.RecordBatch) -> None:
        push(
            probe,
            "sink",
            [f"{i}:{c}" for i, c in zip(ids_of(b), b.column("copy").to_numpy(), strict=True)],
        )

    pipeline = (
        ft.pipeline(immediate_replays=0)  # a failed child fails its record, which queues
        .map_batches(stage1, "id long, key long, copy long")
        .partition_by(["key"], 3)
        .map_batches(stage2, "id long, key long, copy long")
        .sink_batches(sink)
    )
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert res.fold_ok and res.fresh == n and res.failed == len(flaky)
    assert (res.stages[S1].rows_in, res.stages[S1].rows_out) == (n, 2 * len(kept))
    assert res.stages[S2].rows_in == 2 * len(kept)
    assert res.stages[S2].rows_out == 2 * len(kept) - len(flaky)
    assert res.written == 2 * len(kept) - len(flaky)
    st = ft.layer.stats()
    # only the sources of failed children are pending: filtered ones completed
    assert st.pending == st.queued_replays == len(flaky)
    assert st.completed == n - len(flaky)

    report = ft.drain(timeout_s=60)
    assert report.drained and report.dead_lettered == 0, report
    got = Counter(x.decode() for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))
    want = Counter({f"{i}:{c}": 1 for i in kept for c in (0, 1)})
    for i in flaky:  # the replay re-emits both children; child 0 was written already
        want[f"{i}:0"] = 2
    assert got == want
    st = ft.layer.stats()
    assert st.pending == 0 and st.completed == n
    assert_settled(ft)


def test_fan_out_alone_leaves_nothing_pending(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: a batch of only fan-out and filtering (no failure) leaving anything
    pending, or the fold not returning to 0 when children outnumber parents."""
    ft = make_ft(timeout_s=30.0)
    n = 1500

    def stage1(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        reps = (ids % 4).astype(np.int64)  # 0, 1, 2 or 3 children each
        parents = np.repeat(np.arange(len(ids)), reps)
        out = pa.RecordBatch.from_arrays(
            [pa.array(ids[parents]), b.column("key").take(pa.array(parents))],
            names=["id", "key"],
        )
        return Outcome(out, parents=parents)

    def sink(b: pa.RecordBatch) -> None:
        push(probe, "sink", ids_of(b).tolist())

    pipeline = ft.pipeline().map_batches(stage1, "id long, key long").sink_batches(sink)
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    want = Counter({i: i % 4 for i in range(n) if i % 4})
    assert res.fold_ok and res.failed == 0 and res.written == sum(want.values())
    assert Counter(probe.ids()) == want
    st = ft.layer.stats()
    assert st.pending == 0 and st.completed == n
    assert_settled(ft)


def test_the_collector_is_on_while_a_batchs_spark_job_runs(spark: SparkSession,
                                                          make_ft: Any) -> None:
    """ftlayer holds Python's cyclic collector off only while its own driver code plans
    and settles a batch (ftlayer.gc_pause), not while the batch's Spark job runs -- which
    may take minutes, and other threads of the driver go on making garbage. A thread
    samples the collector while the job's stage sleeps 1.5 s: on in most samples, and on
    after the batch. Catches: the whole batch run with the collector off."""
    import gc
    import threading

    ft = make_ft()

    def slow(b: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(1.5)  # one partition of one batch: the job lasts at least this long
        return b.select(["id", "key"])

    samples: list[bool] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            samples.append(gc.isenabled())

    pipeline = ft.pipeline().map_batches(slow, "id long, key long").sink_batches(lambda b: None)
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        res = ft.run_batch(pipeline, source_df(spark, 200, parts=1), 0)
    finally:
        stop.set()
        thread.join(5)
    assert res.fold_ok and res.failed == 0
    assert len(samples) > 50 and sum(samples) > 0.8 * len(samples), \
        (sum(samples), len(samples))
    assert gc.isenabled()


# -- 4: unconfirmed sink writes stay pending, time out and replay ---------------------------
@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_unconfirmed_sink_rows_time_out_and_replay(
    spark: SparkSession, make_ft: Any, probe: Probe, backend: str, request: pytest.FixtureRequest
) -> None:
    """Catches: unconfirmed rows acked (lost), or failed instead of left pending (they
    would replay at once, not after their timeout), the ack value of a pending residue
    wrong (it never completes when replayed: drain times out), a replay that is
    unconfirmed again completed or lost, and the summary of a pipeline without a shuffle
    (returned as the task's result) mishandled."""
    ft = make_ft(timeout_s=2.0, **_backend(backend, request))
    n = 1800
    unc = {i for i in range(n) if i % 9 == 0}
    twice = {i for i in unc if i % 27 == 0}  # unconfirmed again when replayed

    def stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        return b.select(["id", "key"])

    def sink(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        cand = np.flatnonzero(ids % 9 == 0)
        seen = times_seen(probe, "unc", ids[cand])
        lost = cand[seen <= np.where(ids[cand] % 27 == 0, 2, 1)]
        keep = np.ones(len(ids), bool)
        keep[lost] = False
        push(probe, "sink", ids[keep].tolist())
        return Outcome(unconfirmed=lost)

    pipeline = ft.pipeline().map_batches(stage1, "id long, key long").sink_batches(sink)
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert res.fold_ok and res.unconfirmed == len(unc) and res.failed == 0
    assert res.written == n - len(unc)
    st = ft.layer.stats()
    assert st.pending == len(unc) and st.queued_replays == 0, "left pending, not acked/failed"
    assert st.failed_explicit == 0

    report = ft.drain(timeout_s=60)
    assert report.drained and report.dead_lettered == 0, report
    st = ft.layer.stats()
    assert st.failed_timeout == len(unc) + len(twice)
    assert st.failed_explicit == 0 and st.pending == 0
    got = Counter(probe.ids())
    assert set(got) == set(range(n)) and max(got.values()) == 1
    assert_settled(ft)


# -- 5: replays land where Spark places their key --------------------------------------------
def test_replays_land_where_spark_places_their_key(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: replays entering a keyed source, or crossing a partition_by, at another
    partition than fresh rows of their key (e.g. a Python-side partitioner that differs
    from Spark's Murmur3 hash, or replays bypassing the repartition). Spark's own
    ``repartition(n, "key")`` is the oracle."""
    ft = make_ft(timeout_s=5.0)
    n = 3000
    replayed = {i for i in range(n) if i % 6 == 1}

    def stage1(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        pid = TaskContext.get().partitionId()
        push(probe, "s1", [f"{k}:{pid}" for k in b.column("key").to_pylist()])
        failed = first_seen(probe, "failed", ids, ids % 6 == 1)
        return Outcome(b.select(["id", "key"]), failed=failed, errors="once")

    def sink(b: pa.RecordBatch) -> None:
        pid = TaskContext.get().partitionId()
        ids = ids_of(b)
        push(probe, "sink", ids.tolist())
        push(
            probe,
            "s2",
            [f"{k}:{pid}:{i}" for k, i in zip(b.column("key").to_pylist(), ids, strict=True)],
        )

    pipeline = (
        ft.pipeline(key="key", partitions=3, immediate_replays=0)  # replays queue
        .map_batches(stage1, "id long, key long")
        .partition_by(["key"], 4)
        .sink_batches(sink)
    )
    df = spark.range(n).select("id", (F.col("id") * 7919 % 101).alias("key"))
    res = ft.run_batch(pipeline, df, 0)
    assert res.failed == len(replayed)
    report = ft.drain(timeout_s=60)
    assert report.drained, report
    assert sorted(probe.ids()) == list(range(n))

    keys = sorted({i * 7919 % 101 for i in range(n)})

    def oracle(parts: int) -> dict[int, int]:
        kdf = spark.createDataFrame([(k,) for k in keys], "key long").repartition(parts, "key")
        pairs = kdf.rdd.mapPartitionsWithIndex(lambda p, it: [(r.key, p) for r in it]).collect()
        return dict(pairs)

    for what, parts in (("s1", 3), ("s2", 4)):
        want = oracle(parts)
        assert len(set(want.values())) > 1  # the keys do spread over partitions
        seen: dict[int, set[int]] = {}
        rows = probe.strings(what)
        for s in rows:
            k, p = s.split(":")[:2]
            seen.setdefault(int(k), set()).add(int(p))
        assert {k: {p} for k, p in want.items()} == seen, what
    # the replayed rows themselves were placed and checked after the shuffle
    placed = {int(s.split(":")[2]) for s in probe.strings("s2")}
    assert replayed <= placed
    assert len(probe.strings("s1")) == n + len(replayed)
    assert_settled(ft)


# -- 6: a task that crashes mid-batch ---------------------------------------------------------
@pytest.mark.parametrize("backend", ["single", "cluster"])
def test_crashed_tasks_retried_by_spark_lose_nothing(
    spark: SparkSession,
    make_ft: Any,
    probe: Probe,
    task_retries: int,
    backend: str,
    request: pytest.FixtureRequest,
) -> None:
    """Catches: the summary of a crashed attempt counted (fold not 0, or rows counted
    twice), a retried attempt's ids differing from the first's (fold not 0: everything
    kept pending), the crashed attempt's rows lost, and replays injected into a batch
    whose task crashed never completing. At-least-once: duplicates come only from the
    crashed sink's already-written half."""
    ft = make_ft(timeout_s=5.0, **_backend(backend, request))
    n = 4000
    flaky = {i for i in range(n) if i % 10 == 3}

    def stage1(b: pa.RecordBatch) -> Outcome:
        if probe.r.set(f"{probe.prefix}:crash:stage1", 1, nx=True):
            os._exit(1)  # the first task to get here dies, nothing flushed
        ids = ids_of(b)
        failed = first_seen(probe, "failed", ids, ids % 10 == 3)
        return Outcome(b.select(["id", "key"]), failed=failed, errors="once")

    def sink(b: pa.RecordBatch) -> None:
        ids = ids_of(b).tolist()
        half = len(ids) // 2
        push(probe, "sink", ids[:half])
        if probe.r.set(f"{probe.prefix}:crash:sink", 1, nx=True):
            os._exit(1)  # dies after writing half of its rows
        if any(i in flaky for i in ids) and probe.r.set(f"{probe.prefix}:crash:replay", 1, nx=True):
            os._exit(1)  # a task of a batch holding replays dies the same way
        push(probe, "sink", ids[half:])

    pipeline = (
        ft.pipeline(immediate_replays=0)  # flaky rows replay in a later batch
        .map_batches(stage1, "id long, key long")
        .partition_by(["key"], 4)
        .sink_batches(sink)
    )
    res = ft.run_batch(pipeline, source_df(spark, n, parts=4), 0)
    assert res.fold_ok, res
    assert res.fresh == n and res.failed == len(flaky)
    report = ft.drain(timeout_s=90)
    assert report.drained and report.pending == 0 and report.dead_lettered == 0, report
    for what in ("stage1", "sink", "replay"):
        assert probe.r.get(f"{probe.prefix}:crash:{what}"), f"no crash in {what}"
    assert all(r.fold_ok for r in ft.results)
    got = Counter(probe.ids())
    lost = set(range(n)) - set(got)
    dups = sum(c - 1 for c in got.values())
    print(f"crash test: lost={len(lost)} duplicates={dups}")
    assert lost == set()
    assert max(got.values()) <= 2
    assert dups <= n // 2  # only what a crashed sink attempt wrote before it died
    assert ft.layer.stats().pending == 0
    assert_settled(ft)


# -- 7: FT off ----------------------------------------------------------------------------
def test_ft_off_runs_the_same_pipeline_without_redis(
    spark: SparkSession, make_ft: Any, probe: Probe, redis_server: Any
) -> None:
    """Catches: status="off" still touching Redis (segments, summaries, replays), or
    giving different sink output than FT on for the same deterministic pipeline."""
    n = 2000
    outputs: dict[str, Counter[str]] = {}
    for status in ("off", "on"):
        ft = make_ft(status=status)
        tag = Probe(probe.url, f"{probe.prefix}{status}")

        def stage1(b: pa.RecordBatch) -> Outcome:
            ids = ids_of(b)
            parents = np.repeat(np.arange(len(ids)), np.where(ids % 5 == 0, 0, 2))
            out = pa.RecordBatch.from_arrays(
                [pa.array(ids[parents]), b.column("key").take(pa.array(parents))],
                names=["id", "key"],
            )
            return Outcome(out, parents=parents, failed=ids % 7 == 3, errors="always")

        def sink(b: pa.RecordBatch, tag: Probe = tag) -> None:
            push(tag, "sink", ids_of(b).tolist())

        pipeline = (
            ft.pipeline()
            .map_batches(stage1, "id long, key long")
            .partition_by(["key"], 3)
            .map_batches(lambda b: b, "id long, key long")
            .sink_batches(sink)
        )
        res = ft.run_batch(pipeline, source_df(spark, n), 0)
        outputs[status] = Counter(x.decode() for x in tag.r.lrange(f"{tag.prefix}:sink", 0, -1))
        tag.r.delete(f"{tag.prefix}:sink")
        want = {i for i in range(n) if i % 5 != 0 and i % 7 != 3}
        assert res.written == 2 * len(want), (status, res)
        assert outputs[status] == Counter({str(i): 2 for i in want})
        if status == "off":
            assert ft.layer is None and res.redis_calls == 0
            ns = ft.config.namespace
            assert list(redis_server.client().scan_iter(match=f"*{ns}*")) == []
        else:
            assert_settled(ft)
    assert outputs["off"] == outputs["on"]


# -- 8: pandas stages and a pandas sink ------------------------------------------------------
def test_map_pandas_and_a_pandas_sink(spark: SparkSession, make_ft: Any, probe: Probe) -> None:
    """Catches: pandas outputs not converted to the declared schema, pandas masks for
    failed= / parents= mishandled, and a pandas sink's failed rows not replayed."""
    ft = make_ft(timeout_s=5.0)
    n = 2000

    def price(pdf: pd.DataFrame) -> Outcome:
        out = pd.DataFrame({"id": pdf["id"], "key": pdf["key"], "total": pdf["amount"] * 1.1})
        cand = (pdf["id"] % 17 == 2).to_numpy()
        mask = np.zeros(len(pdf), bool)
        mask[first_seen(probe, "p1", pdf["id"].to_numpy(), cand)] = True
        return Outcome(out, failed=mask, errors="pandas stage rejects it once")

    def drop_thirds(pdf: pd.DataFrame) -> Outcome:
        keep = (pdf["id"] % 3 != 0).to_numpy()
        out = pdf[keep].assign(total=lambda d: d["total"].round(2)).reset_index(drop=True)
        return Outcome(out, parents=np.flatnonzero(keep))

    def sink(pdf: pd.DataFrame) -> Outcome:
        ids = pdf["id"].to_numpy()
        failed = first_seen(probe, "psink", ids, ids % 19 == 4)
        ok = np.ones(len(pdf), bool)
        ok[failed] = False
        push(
            probe, "sink", [f"{i}:{t:.2f}" for i, t in zip(ids[ok], pdf["total"][ok], strict=True)]
        )
        return Outcome(failed=failed, errors="pandas sink rejects it once")

    pipeline = (
        ft.pipeline(immediate_replays=0)  # the failed rows queue and replay in a drain
        .map_pandas(price, "id long, key long, total double")
        .partition_by(["key"], 3)
        .map_pandas(drop_thirds, "id long, key long, total double")
        .sink_batches(sink, pandas=True)
    )
    res = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert res.fold_ok and res.failed > 0
    report = ft.drain(timeout_s=60)
    assert report.drained and report.dead_lettered == 0, report
    want = Counter({f"{i}:{round((i % 100) * 1.1, 2):.2f}": 1 for i in range(n) if i % 3})
    assert Counter(probe.strings("sink")) == want
    st = ft.layer.stats()
    assert st.pending == 0 and st.completed == n
    # once in the first stage, once in the sink (some rows both)
    assert st.failed_explicit == len(range(2, n, 17)) + sum(1 for i in range(4, n, 19) if i % 3)
    assert_settled(ft)


# -- 10: a batch re-run under the same id after its Spark job failed ---------------------
def test_a_failed_batch_rerun_under_the_same_id(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: the segments of a failed run settled as complete (or replayed) alongside
    the re-run's (records written three times, or pending forever), replays claimed by
    the failed run lost instead of timing out, and segments of the failed run left in
    Redis after the re-run settled the batch."""
    ft = make_ft(timeout_s=2.0)
    n = 2000

    def stage1(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        failed = first_seen(probe, "failed", ids, ids % 8 == 5)
        return Outcome(b.select(["id", "key"]), failed=failed, errors="once")

    def broken(b: pa.RecordBatch) -> pa.RecordBatch:
        if (b.column("key").to_numpy() == 3).any():
            raise RuntimeError("the batch's job fails")
        return b

    def sink(b: pa.RecordBatch) -> None:
        push(probe, "sink", ids_of(b).tolist())

    def build(stage2: Any) -> Any:
        return (
            ft.pipeline(on_error="fail_batch", immediate_replays=0)
            .map_batches(stage1, "id long, key long")
            .partition_by(["key"], 4)
            .map_batches(stage2, "id long, key long")
            .sink_batches(sink)
        )

    good, bad = build(lambda b: b), build(broken)
    first = ft.run_batch(good, spark.range(n).select("id", (F.col("id") % 29).alias("key")), 6)
    assert first.failed == len(range(5, n, 8))  # queued: batch 7 claims them
    df7 = spark.range(n, 2 * n).select("id", (F.col("id") % 29).alias("key")).repartition(3)
    with pytest.raises(Exception, match="the batch's job fails"):
        ft.run_batch(bad, df7, 7)
    assert ft.layer.segments.indexed(), "the failed run left segments"
    orphans = set(leftover_keys(ft, ":sum:"))  # summaries of the failed run's source tasks
    again = ft.run_batch(good, df7, 7)
    assert again.fold_ok and again.fresh == n
    report = ft.drain(timeout_s=60)
    assert report.drained and report.dead_lettered == 0, report
    got = Counter(probe.ids())
    assert set(range(2 * n)) - set(got) == set(), "lost records"
    assert max(got.values()) <= 2, "a record was written more than twice"
    # only records of batch 7's failed run (fresh or claimed replays) may be written twice
    twice = {i for i, c in got.items() if c == 2}
    assert twice <= set(range(n, 2 * n)) | set(range(5, n, 8))
    assert ft.layer.stats().pending == 0
    assert ft.layer.segments.indexed() == []
    assert leftover_keys(ft, ":seg:") == []
    # The re-run does not delete the failed run's task summaries: by design
    # (ftlayer/segments.py, SUMMARY_TTL_MS) they expire after 24 h. Nothing else is left.
    left = set(leftover_keys(ft, ":sum:"))
    assert left <= orphans, left - orphans
    assert all(0 < ft.layer.client.pttl(k) <= SUMMARY_TTL_MS for k in left)


# -- documented: a segment whose batch never settles times out -----------------------------
def test_a_segment_whose_batch_never_settles_times_out(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """ftlayer/segments.py: "A segment its batch never settles times out as a whole: the
    sidecar settles it with every row failed (reason ``timeout``), so they replay."
    Catches: unsettled segments (a failed batch that is never re-run) left in Redis
    forever, their rows never replayed, with nothing pending to say so."""
    ft = make_ft(timeout_s=1.0, rotate=True)
    n = 600

    def stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        return b.select(["id", "key"])

    def broken(b: pa.RecordBatch) -> pa.RecordBatch:
        if not probe.r.exists(f"{probe.prefix}:healed"):
            raise RuntimeError("the batch's job fails")
        return b

    def sink(b: pa.RecordBatch) -> None:
        push(probe, "sink", ids_of(b).tolist())

    pipeline = (
        ft.pipeline(on_error="fail_batch")
        .map_batches(stage1, "id long, key long")
        .partition_by(["key"], 2)
        .map_batches(broken, "id long, key long")
        .sink_batches(sink)
    )
    with pytest.raises(Exception, match="the batch's job fails"):
        ft.run_batch(pipeline, source_df(spark, n), 0)
    assert ft.layer.segments.indexed(), "the failed run left segments"
    probe.r.set(f"{probe.prefix}:healed", 1)

    def timed_out() -> bool:
        if not ft.layer.segments.indexed():
            return True
        ft.layer.expire_due()
        return False

    # 10 s: well past timeout_s * buckets / (buckets - 1)
    until(timed_out, "the unsettled segments to time out", 10, 0.2)
    report = ft.drain(timeout_s=60)
    assert report.drained, report
    assert set(probe.ids()) == set(range(n))
    assert leftover_keys(ft, ":seg:") == []
    left = leftover_keys(ft, ":sum:")  # the failed run's: they expire (SUMMARY_TTL_MS)
    assert all(0 < ft.layer.client.pttl(k) <= SUMMARY_TTL_MS for k in left)


# -- record_key: the records' own id column instead of ftlayer's ---------------------------
def test_a_record_key_replaces_the_id_column_and_keys_shared_or_bad_lose_nothing(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Pipeline(record_key=...). Catches: the id column still added (the point of the
    option), a row with a null or negative key run on instead of dead-lettered with an
    error naming it (a negative key would read as a marker past the shuffle), rows
    sharing a key where one fails past the shuffle -- only one replayed, the other
    completed without reaching the sink (lost) --, an unconfirmed sink row found by its
    key acked instead of left pending, and a fan-out row's key residue mapped wrongly."""
    ft = make_ft(timeout_s=2.0, max_replays=2)
    n = 1200
    df = source_df(spark, n).select(
        F.when(F.col("id") == 7, F.lit(None)).when(F.col("id") == 8, F.lit(-3))
        .when(F.col("id") % 100 == 50, F.col("id") - 1).otherwise(F.col("id")).alias("rid"),
        "id", "key", "amount",
    )  # fmt: skip
    dup = {i for i in range(n) if i % 100 in (49, 50)}  # pairs sharing rid = i - i % 100 + 49
    fail_once = {i for i in range(n) if i % 100 == 50} | {i for i in range(n) if i % 31 == 3}
    unc_once = {i for i in range(n) if i % 37 == 5} - fail_once - dup

    def stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        assert "__ft_src" not in b.schema.names
        return b

    def stage2(b: pa.RecordBatch) -> Outcome:
        assert "__ft_src" not in b.schema.names
        ids = ids_of(b)
        mask = np.zeros(len(ids), bool)
        mask[first_seen(probe, "s2", ids, np.isin(ids, list(fail_once)))] = True
        return Outcome(b, failed=mask, errors="fails once past the shuffle")

    def sink(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        lost = first_seen(probe, "unc", ids, np.isin(ids, list(unc_once)))
        keep = np.ones(len(ids), bool)
        keep[lost] = False
        push(probe, "sink", ids[keep].tolist())
        return Outcome(unconfirmed=lost)

    schema = "rid long, id long, key long, amount long"
    pipeline = (
        ft.pipeline(record_key="rid")
        .map_batches(stage1, schema)
        .partition_by(["key"], 3)
        .map_batches(stage2, schema)
        .sink_batches(sink)
    )
    first = ft.run_batch(pipeline, df, 0)
    assert first.fold_ok and first.fresh == n
    report = ft.drain(timeout_s=60)
    assert report.drained and report.pending == 0, report
    dead = dead_letters(ft)
    assert set(dead) == {7, 8}
    assert "record_key 'rid' is None: a record key must be" in dead[7].history[-1].error
    assert "record_key 'rid' is -3: a record key must be a non-negative integer" in (
        dead[8].history[-1].error
    )
    # a bad key is its lineage id, null read as -1 (not a cast of NaN)
    assert (dead[7].frame.lineage, dead[8].frame.lineage) == (-1, -3)
    got = Counter(probe.ids())
    assert set(got) | {7, 8} == set(range(n)), "lost records"
    assert max(v for k, v in got.items() if k not in dup) == 1
    # a row whose key-mate failed past the shuffle replays with it (at least once)
    assert all(got[i] == 2 for i in dup if i % 100 == 49)
    assert_settled(ft)


def test_a_stage_that_changes_the_record_key_fails_its_batch(
    spark: SparkSession, make_ft: Any
) -> None:
    """Catches: a changed key accepted (a failure past the shuffle would then replay
    another record, and the one that failed would count as complete: lost), and
    record_key settings the path cannot honour accepted."""
    ft = make_ft(timeout_s=5.0)

    def bump(b: pa.RecordBatch) -> pa.RecordBatch:
        return pa.RecordBatch.from_arrays(
            [pc.add(b.column("id"), 1), b.column("key")], names=["id", "key"]
        )

    def sink(b: pa.RecordBatch) -> None:
        pass

    pipeline = (ft.pipeline(record_key="id").map_batches(bump, "id long, key long")
                .partition_by(["key"], 2).map_batches(lambda b: b, "id long, key long")
                .sink_batches(sink))  # fmt: skip
    with pytest.raises(Exception, match="changed record_key 'id' of a row"):
        ft.run_batch(pipeline, source_df(spark, 300), 0)
    with pytest.raises(ConfigError, match="must be an int64"):
        ft.run_batch(
            ft.pipeline(record_key="id").map_batches(lambda b: b, "id double, key long")
            .sink_batches(sink), source_df(spark, 10), 1,
        )  # fmt: skip
    with pytest.raises(ConfigError, match="record_key"):
        ft.pipeline(record_key="id", ack_scope="task")


# -- segment codecs --------------------------------------------------------------------------
@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_every_segment_codec_gives_back_the_rows_it_stored(
    spark: SparkSession, make_ft: Any, probe: Probe, codec: str
) -> None:
    """FTConfig.segment_codec: the driver reads each codec's segments back when rows fail
    after the shuffle (their replays are made from the segment's rows). Catches: a codec
    whose segments cannot be read (residues neither replayed nor pending: lost), and
    replayed rows whose values differ from the stored ones (a column or row mixed up)."""
    ft = make_ft(timeout_s=5.0, segment_codec=codec)
    n = 900

    def stage1(b: pa.RecordBatch) -> pa.RecordBatch:
        return b

    def stage2(b: pa.RecordBatch) -> Outcome:
        ids = ids_of(b)
        seen = times_seen(probe, "s2", ids)
        return Outcome(b, failed=(ids % 5 == 1) & (seen == 1), errors="fails once")

    def sink(b: pa.RecordBatch) -> None:
        rows = zip(ids_of(b).tolist(), b.column("key").to_pylist(),
                   b.column("amount").to_pylist(), strict=True)  # fmt: skip
        push(probe, "rows", [f"{i}:{k}:{a}" for i, k, a in rows])

    pipeline = (
        ft.pipeline(immediate_replays=0)
        .map_batches(stage1, "id long, key long, amount long")
        .partition_by(["key"], 2)
        .map_batches(stage2, "id long, key long, amount long")
        .sink_batches(sink)
    )
    first = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert first.failed == len(range(1, n, 5)) and first.fold_ok
    assert ft.drain(timeout_s=60).drained
    got = Counter(probe.r.lrange(f"{probe.prefix}:rows", 0, -1))
    assert got == Counter(f"{i}:{i % 29}:{i % 100}".encode() for i in range(n))
    assert_settled(ft)


# -- a batch longer than the timeout --------------------------------------------------------
def test_a_live_batch_longer_than_its_timeout_is_not_timed_out(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """The driver touches its batch's segments while the Spark job runs, so a rotation
    that runs meanwhile (here every 0.5 s) does not time out rows of a live batch.
    Catches: no heartbeat (every row of the slow batch times out and is written twice),
    a heartbeat that touches other batches' segments or never stops."""
    n = 600
    ft = make_ft(timeout_s=1.0, rotate=True)

    def slow_sink(b: pa.RecordBatch) -> None:
        time.sleep(2.5)  # each sink task outlives the timeout (1 to 1.5 s) twice over
        push(probe, "sink", ids_of(b).tolist())

    pipeline = (ft.pipeline(source=0).map_batches(stage_copy, "id long, key long, amount long")
                .partition_by(["key"], 2).sink_batches(slow_sink))  # fmt: skip
    result = ft.run_batch(pipeline, source_df(spark, n), 0)
    assert result.fold_ok and result.written == n
    time.sleep(1.6)  # a rotation after the batch: nothing of it may be left to expire
    report = ft.drain(timeout_s=30, pipeline=pipeline)
    st = ft.layer.stats()
    sink = Counter(int(x) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))
    assert st.failed_timeout == 0, st
    assert report.drained and st.pending == 0 and st.unsettled_segments == 0
    assert set(sink) == set(range(n)) and max(sink.values()) == 1
    assert_settled(ft)


def stage_copy(b: pa.RecordBatch) -> pa.RecordBatch:
    return b


def test_the_documented_example_runs(spark: SparkSession, capsys: pytest.CaptureFixture) -> None:
    """docs/vectorized.md's (and the README's) example, as written: a file of 500 orders
    kept by reference, 6 on hold (failed, replayed twice, dead-lettered), 494 written, and
    the availableNow query ends with nothing pending (no drain)."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "vectorized.md"
    code = re.search(r"```python\n(.*?)```", doc.read_text(), re.S)
    assert code is not None and len(code.group(1).strip().splitlines()) < 25
    scope: dict[str, Any] = {}
    exec(compile(code.group(1), str(doc), "exec"), scope)
    out = capsys.readouterr().out
    assert "completed=494 dead_letters=6 pending=0" in out
    first = scope["ft"].results[0]
    assert (first.fresh, first.failed, first.written) == (500, 6, 494)
    scope["ft"].close()
