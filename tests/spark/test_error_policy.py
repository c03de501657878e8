"""Error policy and stage contexts end to end: real Spark (local[2]), real Redis.

ErrorPolicy: retries with backoff before a record fails, exception types that go straight
to the dead letters (no retry, no replay), ``on_dead_letter`` callbacks on the driver;
stage contexts: record ids, attempt numbers (fresh, replayed at once, claimed from the
replay queue), ``reset_timeout``. Each test names the product breaks it catches.
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import SparkSession

from ftlayer.errors import FailRecord
from ftlayer.spark import BatchContext, ErrorPolicy, FaultTolerance, RecordContext
from tests.spark.probe import Probe
from tests.toolkit import source_df

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

SCHEMA = "id long, key long, amount long"


def dead_ids(ft: FaultTolerance) -> dict[int, Any]:
    assert ft.layer is not None
    return {d.frame.decode()["id"]: d for d in ft.layer.persistence.dead_letters()}


def sink_ids(probe: Probe) -> Counter[int]:
    return Counter(int(x) for x in probe.r.lrange(f"{probe.prefix}:sink", 0, -1))


class FlakyError(Exception):
    """A transient error (a timeout of some remote service)."""


class BadInputError(ValueError):
    """No retry or replay can fix this record."""


def test_retries_with_backoff_absorb_transient_errors(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: no retry before bisection (transient errors cost bisection calls and fail
    rows), retries not bounded (a stage that fails forever never ends), and a retried
    batch counted twice. Control: the same stage without a policy fails rows."""
    n = 600

    def flaky(b: pa.RecordBatch) -> pa.RecordBatch:
        tc = TaskContext.get()
        calls = probe.r.incr(f"{probe.prefix}:calls:{tc.stageId()}:{tc.partitionId()}")
        if calls <= 2:  # the first two calls of each task time out
            raise FlakyError(f"service timed out (call {calls})")
        return b

    def sink(b: pa.RecordBatch) -> None:
        probe.r.rpush(f"{probe.prefix}:sink", *b.column("id").to_pylist())

    ft = make_ft(max_replays=2, timeout_s=30.0)
    policy = ErrorPolicy(retries=3, backoff_s=0.01, max_backoff_s=0.05)
    pipeline = ft.pipeline(source=0, errors=policy).map_batches(flaky, SCHEMA).sink_batches(sink)
    result = ft.run_batch(pipeline, source_df(spark, n, keys=13, parts=2), 0)
    counts = next(iter(result.stages.values()))
    assert result.failed == 0 and counts.bisections == 0, result
    assert sorted(sink_ids(probe)) == list(range(n))
    assert ft.layer is not None and ft.layer.stats().pending == 0

    # control: without retries the same stage fails rows (bisection cannot fix a flake
    # that hits every call of a task's first two)
    probe.r.delete(*probe.r.keys(f"{probe.prefix}:calls:*"))
    plain = make_ft(max_replays=2, timeout_s=30.0)
    pipe2 = plain.pipeline(source=0, immediate_replays=0).map_batches(flaky, SCHEMA)
    res2 = plain.run_batch(pipe2.sink_batches(sink), source_df(spark, n, keys=13, parts=2), 0)
    assert next(iter(res2.stages.values())).bisections > 0

    # a stage that always fails: retries end, its rows fail (and replay), nothing hangs
    def broken(b: pa.RecordBatch) -> pa.RecordBatch:
        raise FlakyError("always down")

    third = make_ft(max_replays=1, timeout_s=30.0)
    pipe3 = third.pipeline(source=0, errors=policy).map_batches(broken, SCHEMA)
    res3 = third.run_batch(pipe3.sink_batches(sink), source_df(spark, 40, keys=13, parts=2), 0)
    assert res3.failed == 40
    report = third.drain(timeout_s=60)
    assert report.drained and report.dead_lettered == 40


def test_dead_letter_types_skip_retries_and_replays_and_reach_the_callback(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: a dead_letter_on exception retried or replayed (history longer than one
    attempt, replay counters moving), other exceptions dead-lettered too early (they must
    replay), the DEAD_NOW mark lost between task and settlement, on_dead_letter not
    called, called twice for one dead letter (cursor not kept in Redis), or called with
    dead letters of another source."""
    n = 1000
    bad = {i for i in range(n) if i % 97 == 5}
    flaky = {i for i in range(n) if i % 89 == 7} - bad

    def stage(b: pa.RecordBatch, ctx: BatchContext) -> pa.RecordBatch:
        assert ctx.attempts is not None
        for i, attempt in zip(b.column("id").to_pylist(), ctx.attempts.tolist(), strict=True):
            if i in bad:
                raise BadInputError(f"record {i} has no price")
            if i in flaky and attempt == 1:  # its first attempt fails, whole or bisected
                raise KeyError(f"cache miss {i}")
        return b

    def sink(b: pa.RecordBatch) -> None:
        probe.r.rpush(f"{probe.prefix}:sink", *b.column("id").to_pylist())

    given: list[Any] = []
    ft = make_ft(max_replays=3, timeout_s=30.0)
    policy = ErrorPolicy(dead_letter_on=(BadInputError,))
    pipeline = (ft.pipeline(source=3, errors=policy, on_dead_letter=given.append)
                .map_batches(stage, SCHEMA).sink_batches(sink))  # fmt: skip
    result = ft.run_batch(pipeline, source_df(spark, n, keys=13, parts=2), 0)
    assert result.failed == len(bad), result  # flaky rows replayed at once, in the task
    assert result.immediate_replays == len(flaky)
    dead = dead_ids(ft)
    assert set(dead) == bad
    for i, d in dead.items():
        assert len(d.history) == 1 and d.history[0].attempt == 1, d.history
        assert f"BadInputError: record {i} has no price" in d.history[0].error
    st = ft.layer.stats()
    assert st.replayed == len(flaky), st  # the flaky ones only, at once in their task
    assert st.failed_explicit == len(bad) + len(flaky), st
    assert st.pending == 0 and st.dead_letters == len(bad), st
    assert sorted(d.frame.decode()["id"] for d in given) == sorted(bad)
    assert sorted(sink_ids(probe)) == sorted(set(range(n)) - bad)

    # a second batch gives nothing again; another pipeline object on the same namespace
    # (a restarted driver) starts from the cursor kept in Redis
    ft.run_batch(pipeline, source_df(spark, n, keys=13, parts=2).limit(0), 1)
    assert len(given) == len(bad)
    again: list[Any] = []
    ft2 = make_ft(namespace=ft.config.namespace, max_replays=3, timeout_s=30.0)
    p2 = ft2.pipeline(source=3, on_dead_letter=again.append).map_batches(stage, SCHEMA)
    ft2.run_batch(p2.sink_batches(sink), source_df(spark, 0, keys=13, parts=2), 2)
    assert again == []
    # another source's callback never sees source 3's dead letters
    other: list[Any] = []
    p3 = ft2.pipeline(source=4, on_dead_letter=other.append).map_batches(stage, SCHEMA)
    ft2.run_batch(p3.sink_batches(sink), source_df(spark, 0, keys=13, parts=2), 3)
    assert other == []


def test_row_stages_get_a_context_with_ids_and_attempts(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: a stage declaring ctx not given one, attempt numbers wrong for immediate
    replays or for replays claimed from the queue (the attempts column lost between the
    claim and the source stage), record ids not the ones ftlayer tracks, reset_timeout
    not callable in a task, and per-stage retries (errors= on map) not applied."""
    n = 400

    def price(r: dict[str, Any], ctx: RecordContext) -> dict[str, Any]:
        probe.r.rpush(f"{probe.prefix}:att", f"{r['id']}:{ctx.attempt}:{ctx.record_id}")
        ctx.reset_timeout()
        if r["id"] % 10 == 3 and ctx.attempt is not None and ctx.attempt < 3:
            raise FailRecord(f"try again {r['id']}")
        return {**r, "total": r["amount"] * 2}

    def lookup(r: dict[str, Any]) -> dict[str, Any]:
        if probe.r.hincrby(f"{probe.prefix}:lookups", str(r["id"]), 1) == 1:
            raise FlakyError("first lookup times out")
        return r

    def sink(r: dict[str, Any]) -> None:
        probe.r.rpush(f"{probe.prefix}:sink", r["id"])

    ft = make_ft(max_replays=5, timeout_s=30.0)
    pipeline = (ft.pipeline(source=0, immediate_replays=1)  # 1 at once, then the queue
                .map(price)
                .map(lookup, errors=ErrorPolicy(retries=1, backoff_s=0.001))
                .sink(sink))  # fmt: skip
    first = ft.run_batch(pipeline, source_df(spark, n, keys=13, parts=2), 0)
    threes = [i for i in range(n) if i % 10 == 3]
    assert first.immediate_replays == len(threes) and first.failed == len(threes)
    report = ft.drain(timeout_s=120, pipeline=pipeline)
    assert report.drained, report
    assert sorted(sink_ids(probe)) == list(range(n))
    st = ft.layer.stats()  # two failed attempts per "3": lookup's flakes failed nothing
    assert st.failed_explicit == 2 * len(threes) and st.pending == 0, st
    seen: dict[int, list[int]] = {}
    ids: dict[int, set[int]] = {}
    for item in probe.r.lrange(f"{probe.prefix}:att", 0, -1):
        i, att, rid = (int(x) for x in item.decode().split(":"))
        seen.setdefault(i, []).append(att)
        ids.setdefault(i, set()).add(rid)
    for i in range(n):
        want = [1, 2, 3] if i % 10 == 3 else [1]  # 1 fresh, 2 at once, 3 from the queue
        assert sorted(seen[i]) == want, (i, seen[i])
        assert all(rid != 0 for rid in ids[i])
        # an immediate replay keeps its batch-local id; one from the queue has a new id
        assert len(ids[i]) == len(want) - (i % 10 == 3), (i, ids[i])


def test_batch_stages_get_a_context_aligned_with_their_rows(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: a batch context not aligned with its batch (after a filter, after a
    shuffle, in the halves of a bisection), ids repeated within a batch, and attempts
    claimed to be known after a shuffle."""
    n = 800

    def check(b: pa.RecordBatch, ctx: BatchContext) -> pa.RecordBatch:
        assert len(ctx.record_ids) == b.num_rows
        assert len(set(ctx.record_ids.tolist())) == b.num_rows
        ctx.reset_timeout()
        where = "after" if ctx.stage else "before"
        probe.r.rpush(f"{probe.prefix}:ctx:{where}", *[
            f"{i}:{r}:{-1 if ctx.attempts is None else ctx.attempts[k]}"
            for k, (i, r) in enumerate(zip(b.column("id").to_pylist(),
                                           ctx.record_ids.tolist(), strict=True))
        ])  # fmt: skip
        if 13 in b.column("id").to_pylist() and ctx.stage == 1:
            raise RuntimeError("row 13 breaks the second stage")  # bisection isolates it
        return b

    def sink(b: pa.RecordBatch) -> None:
        probe.r.rpush(f"{probe.prefix}:sink", *b.column("id").to_pylist())

    ft = make_ft(max_replays=0, timeout_s=30.0)
    pipeline = (ft.pipeline(source=0).map_batches(check, SCHEMA).partition_by(["key"], 3)
                .map_batches(check, SCHEMA).sink_batches(sink))  # fmt: skip
    result = ft.run_batch(pipeline, source_df(spark, n, keys=13, parts=2), 0)
    assert result.failed == 1 and set(dead_ids(ft)) == {13}
    before = [x.decode().split(":") for x in probe.r.lrange(f"{probe.prefix}:ctx:before", 0, -1)]
    after = [x.decode().split(":") for x in probe.r.lrange(f"{probe.prefix}:ctx:after", 0, -1)]
    assert sorted(int(i) for i, _, _ in before) == list(range(n))
    assert {a for _, _, a in before} == {"1"} and {a for _, _, a in after} == {"-1"}
    by_id = {int(i): int(r) for i, r, _ in before}
    # after the shuffle each row carries its source id (bisection halves included)
    assert all(by_id[int(i)] == int(r) for i, r, _ in after)
    assert sorted(sink_ids(probe)) == sorted(set(range(n)) - {13})
    assert np.unique([int(r) for _, r, _ in before]).size == n


def test_task_scope_rows_dead_letter_and_retry_too(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Catches: ack_scope="task" ignoring the policy (fatal rows replayed, flaky rows
    failed), the 'dead letter now' reason not reaching the flush script, and a task-scope
    context without its record id."""
    n = 300

    def stage(r: dict[str, Any], ctx: RecordContext) -> dict[str, Any]:
        assert ctx.record_id
        if r["id"] % 50 == 1:
            raise BadInputError(f"bad {r['id']}")
        if probe.r.hincrby(f"{probe.prefix}:tries", str(r["id"]), 1) == 1:
            raise FlakyError("first try times out")
        return r

    def sink(r: dict[str, Any]) -> None:
        probe.r.rpush(f"{probe.prefix}:sink", r["id"])

    ft = make_ft(max_replays=3, timeout_s=30.0)
    policy = ErrorPolicy(retries=1, backoff_s=0.001, dead_letter_on=(BadInputError,))
    pipeline = ft.pipeline(source=0, ack_scope="task", errors=policy).map(stage).sink(sink)
    result = ft.run_batch(pipeline, source_df(spark, n, keys=13, parts=2), 0)
    bad = {i for i in range(n) if i % 50 == 1}
    assert result.failed == len(bad)
    dead = dead_ids(ft)
    assert set(dead) == bad and all(len(d.history) == 1 for d in dead.values())
    st = ft.layer.stats()
    assert st.replayed == 0 and st.pending == 0
    assert sorted(sink_ids(probe)) == sorted(set(range(n)) - bad)
