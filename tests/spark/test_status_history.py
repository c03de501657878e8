"""The status page's stage table and charts from a real pipeline: batches of a real Spark
job write their summaries to Redis (ftlayer.history), the leader sidecar samples the
counters, and the page -- in a real headless Chromium -- shows the stages' rows, failures
and times and draws the last hour. Its screenshot (benchmarks/results/status_page.png) is
regenerated with ``FTLAYER_STATUS_SCREENSHOT=benchmarks/results/status_page.png``."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer import EmbeddedRedis, FTConfig, FTLayer
from ftlayer.history import BATCHES, read_batches, stage_table
from ftlayer.service.http import ServiceServer
from ftlayer.service.sidecar import Sidecar
from ftlayer.spark import FaultTolerance, Outcome
from tests.toolkit import chromium

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

SCREENSHOT = os.environ.get("FTLAYER_STATUS_SCREENSHOT")
"""Where to keep the page's screenshot (the docs show benchmarks/results/status_page.png:
``FTLAYER_STATUS_SCREENSHOT=benchmarks/results/status_page.png`` regenerates it); unset, it
goes to the test's temporary directory, so a test run changes no tracked file."""
STAGE = "map_batches[0.0] price"
SINK = "sink[1.0] store"


def price(batch: pa.RecordBatch) -> Outcome:
    """Fails the orders whose id ends in 7 (about a tenth), every time: they dead-letter."""
    ids = batch.column("id").to_numpy()
    return Outcome(batch, failed=np.flatnonzero(ids % 10 == 7), errors="no price")


def store(batch: pa.RecordBatch) -> None:
    time.sleep(0.01)


@pytest.fixture
def served(redis_server: EmbeddedRedis) -> Iterator[tuple[FTConfig, ServiceServer, Sidecar]]:
    cfg = FTConfig(namespace=f"hist{uuid.uuid4().hex[:8]}", timeout_s=30, max_replays=0,
                   redis_url=redis_server.url)  # fmt: skip
    layer = FTLayer(redis_server.client(), cfg)
    sidecar = Sidecar(layer, lease_s=3.0)
    sidecar.sample_s = 0.5
    server = ServiceServer(sidecar, port=0).start()
    sidecar.start()
    try:
        yield cfg, server, sidecar
    finally:
        sidecar.stop()
        server.stop()
        layer.clear()


def _status(server: ServiceServer) -> dict:
    with urllib.request.urlopen(server.url + "/api/status", timeout=5) as r:
        return dict(json.load(r))


def test_stage_table_and_charts_from_real_batches(
    spark: SparkSession, served, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    cfg, server, _ = served
    with FaultTolerance(cfg, layer=FTLayer.open(cfg)) as ft:
        pipeline = (ft.pipeline(source=0, name="orders")
                    .map_batches(price, "id long, k long")
                    .partition_by(["k"], 2)
                    .sink_batches(store))  # fmt: skip
        for b in range(4):  # a few batches, the sidecar sampling between them
            df = spark.range(b * 1000, (b + 1) * 1000, numPartitions=2).selectExpr(
                "id", "id % 7 AS k")
            pipeline(df, b)
            time.sleep(0.6)
        time.sleep(1.2)  # a last sample after the last batch

    status = _status(server)
    rows = {r["stage"]: r for r in status["stages"]}
    assert set(rows) == {STAGE, SINK}, rows
    assert rows[STAGE]["rows_in"] == 4000 and rows[STAGE]["batches"] == 4
    assert rows[STAGE]["failed"] == 400 and rows[STAGE]["rows_out"] == 3600
    assert rows[STAGE]["dead_lettered"] == 400 and rows[STAGE]["replayed"] == 0  # no budget
    assert rows[SINK]["rows_in"] == 3600 and rows[SINK]["failed"] == 0
    assert rows[SINK]["p50_ms"] >= 10  # the sink sleeps 10 ms per Arrow batch
    charts = status["charts"]
    assert len(charts["t"]) >= 3, charts
    assert max(charts["completed_per_s"]) > 0 and sum(charts["completed_per_s"]) > 0
    assert max(charts["failed_per_s"]) > 0
    # the batch scope observes each completed row's latency at settlement: its batch's time
    assert status["latency_ms"]["count"] == 3600 and status["latency_ms"]["p99"] > 0
    assert any(p is not None and p > 0 for p in charts["p99_ms"]), charts["p99_ms"]

    browser = chromium()
    try:
        browser.get(server.url + "/")
        table = browser.find_element(By.ID, "stages")
        WebDriverWait(browser, 10).until(lambda b: "4,000" in table.text)
        heads = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "table th")]
        assert "replayed" in heads and "dead-lettered" in heads, heads
        assert STAGE in table.text and SINK in table.text and "3,600" in table.text
        line = browser.find_element(By.CSS_SELECTOR, 'svg[data-series="completed_per_s"] polyline')
        assert len(line.get_attribute("points").split()) >= 3
        logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert logs == [], logs
        shot = Path(SCREENSHOT) if SCREENSHOT else tmp_path / "status_page.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
    finally:
        browser.quit()


def flaky(batch: pa.RecordBatch, ctx) -> Outcome:
    """Fails the ids ending in 3 on their first attempt only: replayed at once, in the task."""
    rows = np.flatnonzero((batch.column("id").to_numpy() % 10 == 3) & (ctx.attempts == 1))
    return Outcome(batch, failed=rows, errors="flaky")


def poison(batch: pa.RecordBatch) -> Outcome:
    """After the shuffle: ids ending in 7 are bad input (dead-lettered at once), ids
    ending in 9 fail every time (queued, replayed, dead-lettered past the budget)."""
    ids = batch.column("id").to_numpy()
    bad, hopeless = np.flatnonzero(ids % 10 == 7), np.flatnonzero(ids % 10 == 9)
    return Outcome(batch, failed=np.concatenate([bad, hopeless]), errors="poison",
                   dead_letter=bad)  # fmt: skip


FLAKY, POISON = "map_batches[0.0] flaky", "map_batches[1.0] poison"


def test_each_stage_counts_its_failed_rows_replayed_or_dead_lettered(
    spark: SparkSession, redis_server: EmbeddedRedis
) -> None:
    """Each failed row is counted, in the stage it failed in, as replayed (at once in its
    task, or queued and claimed by a later batch) or dead-lettered, as Redis decided it.
    Catches: outcomes counted in the wrong stage, a replay's second failure counted as
    dead (or a dead letter as replayed), outcomes counted from the error texts."""
    cfg = FTConfig(namespace=f"hist{uuid.uuid4().hex[:8]}", timeout_s=30, max_replays=2,
                   redis_url=redis_server.url)  # fmt: skip
    with FaultTolerance(cfg, layer=FTLayer.open(cfg)) as ft:
        pipeline = (ft.pipeline(source=0, name="split")
                    .map_batches(flaky, "id long, k long")
                    .partition_by(["k"], 2)
                    .map_batches(poison, "id long, k long")
                    .sink_batches(store))  # fmt: skip
        df = spark.range(0, 1000, numPartitions=2).selectExpr("id", "id % 7 AS k")
        pipeline(df, 0)
        for b in (1, 2, 3):  # the queued replays ride the next batches (no new rows)
            pipeline(df.limit(0), b)
        results = list(ft.results)
        totals = ft.layer.stats()
    by_stage: dict[str, list[int]] = {}
    for r in results:
        for label, c in r.stages.items():
            got = by_stage.setdefault(label, [0, 0, 0])
            for i, v in enumerate((c.failed, c.replayed, c.dead_lettered)):
                got[i] += v
    # flaky: 100 rows fail once each and pass on their replay in the task
    assert by_stage[FLAKY] == [100, 100, 0], by_stage
    # poison: 100 dead at once; 100 fail on attempts 1, 2 and 3 (budget 2): replayed twice
    # each, then dead-lettered
    assert by_stage[POISON] == [100 + 300, 200, 200], by_stage
    assert totals.dead_lettered == 200
    layer = FTLayer(redis_server.client(), cfg)
    table = {r["stage"]: r for r in stage_table(read_batches(layer.client, layer.keyspace, 0))}
    assert (table[POISON]["replayed"], table[POISON]["dead_lettered"]) == (200, 200), table
    assert (table[FLAKY]["replayed"], table[FLAKY]["dead_lettered"]) == (100, 0), table
    layer.clear()


def test_the_history_is_bounded(redis_server: EmbeddedRedis) -> None:
    cfg = FTConfig(namespace=f"hist{uuid.uuid4().hex[:8]}")
    layer = FTLayer(redis_server.client(), cfg)
    from ftlayer.history import record_batch

    for b in range(BATCHES + 50):
        record_batch(layer.client, layer.keyspace, pipeline="p", source=0, batch_id=b,
                     elapsed_s=0.1, fresh=1, replayed=0, failed=0, written=1,
                     stages={"s": (1, 1, 0, 0, 0.001)})  # fmt: skip
    assert layer.client.llen(layer.keyspace.batches) == BATCHES
    kept = read_batches(layer.client, layer.keyspace, 0)
    assert [int(b["batch"]) for b in kept[:2]] == [50, 51]  # the oldest were dropped
    assert stage_table(kept)[0]["rows_in"] == BATCHES
    layer.clear()
    assert layer.client.llen(layer.keyspace.batches) == 0
