"""ftlayer.spark end to end: real Spark (local[2]), real Redis, no mocks.

Each test runs few Spark jobs over many rows (jobs are slow to start, rows are cheap).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer import FailRecord
from ftlayer.spark import FaultTolerance
from tests.spark.probe import Probe, TaskKilled, spark_placement
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark-pipeline.md"


def acks_left(ft: FaultTolerance) -> int:
    assert ft.layer is not None
    return ft.layer.acker.size()


def test_the_documented_example_runs(spark: SparkSession, capsys: pytest.CaptureFixture) -> None:
    code = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S)
    assert code is not None
    lines = code.group(1).strip().splitlines()
    assert len(lines) < 25
    scope: dict[str, Any] = {}
    exec(compile(code.group(1), str(DOC), "exec"), scope)
    out = capsys.readouterr().out
    assert "DrainResult(drained=True, pending=0, dead_lettered=6" in out
    first = scope["ft"].results[0]
    assert (first.fresh, first.failed, first.written) == (500, 6, 494)


@pytest.mark.parametrize(
    ("backend", "scope"), [("single", "batch"), ("cluster", "batch"), ("single", "task")]
)
def test_end_to_end_with_every_kind_of_failure(
    spark: SparkSession,
    make_ft: Any,
    probe: Probe,
    task_retries: int,
    backend: str,
    scope: str,
    request: pytest.FixtureRequest,
) -> None:
    """Invariants 1, 6, 7 and 8.

    Explicit FailRecord, other exceptions, records never acked (time out), a claiming
    task that died, poison records (dead-lettered), and crashed tasks retried by Spark —
    all at once, with a shuffle. Every record reaches the sink or the dead-letter list.
    Row stages on batch-scope acking (failures take the replay queue:
    ``immediate_replays=0``) and on ``ack_scope="task"``."""
    where = (
        {} if backend == "single" else {"redis_url": request.getfixturevalue("redis_cluster").url}
    )
    ft = make_ft(timeout_s=3.0, max_replays=3, rotate=True, **where)
    layer = ft.layer
    n = 4000
    df = spark.range(n).select("id", (F.col("id") % 13).cast("int").alias("key"))
    placement = spark_placement(spark, 13, "int", 4)

    def stage1(r: dict[str, Any]) -> dict[str, Any]:
        tc = TaskContext.get()
        if tc.partitionId() == 0 and tc.attemptNumber() == 0 and r["id"] == 150:
            raise TaskKilled("source task crashes before its flush")
        if r["id"] % 997 == 0:
            raise FailRecord(f"poison {r['id']}")
        if r["id"] % 50 == 7 and probe.first_time("explicit", r["id"]):
            raise FailRecord(f"rejected {r['id']}")
        if r["id"] % 60 == 11 and probe.first_time("error", r["id"]):
            raise ValueError(f"boom {r['id']}")
        return {**r, "double": r["id"] * 2}

    def stage2(r: dict[str, Any]) -> dict[str, Any]:
        probe.check_partition(r, placement[r["key"]])
        tc = TaskContext.get()
        if tc.partitionId() == 1 and tc.attemptNumber() == 0 and r["id"] % 7 == 0:
            raise TaskKilled("task after the shuffle crashes before its flush")
        return r

    pipeline = (
        ft.pipeline(source=0, key=["key"], ack_scope=scope, immediate_replays=0)  # type: ignore[arg-type]
        .map(stage1)
        .partition_by(["key"], 4)
        .map(stage2)
        .sink(probe.write, per="partition")
    )
    # records persisted by a source task whose output was then lost: never acked
    h = layer.handler(partition=0)
    dropped = list(range(100_000, 100_030))
    for i in dropped:
        h.persist_record({"id": i, "key": i % 13}, hash_code=0, source=0, partition=i % 2)
    h.flush()

    result = ft.run_batch(pipeline, df, 0)
    assert result.fresh == n and result.failed > 0
    assert any("ValueError: boom" in e for e in result.errors)
    lost = layer.claim_replays(source=0, limit=5)  # a source task claims, then dies
    assert len(lost) == 5

    report = ft.drain(timeout_s=90)
    assert report.drained, report
    poison = {i for i in range(n) if i % 997 == 0}
    dead = {d.frame.decode()["id"]: d for d in layer.persistence.dead_letters()}
    assert set(dead) == poison
    assert all(len(d.history) == 4 and "poison" in d.history[-1].error for d in dead.values())
    delivered = set(probe.ids())
    assert delivered | poison == set(range(n)) | set(dropped)
    st = layer.stats()
    assert st.pending == 0 and st.failed_timeout >= len(dropped) + 5
    assert st.failed_explicit >= len(poison) * 4 + 80
    assert probe.strings("misplaced") == []
    # replayed records were placed (and checked) after the shuffle like fresh ones: those
    # failed in stage 1 reached it only as replays, the dropped ones only after timing out
    replayed = {int(i) for i in probe.members("explicit") | probe.members("error")} - poison
    assert len(replayed) > 100 and replayed | set(dropped) <= set(probe.ids("placed_ids"))
    assert probe.members("retried"), "no task was retried"

    def collected() -> bool:  # orphans (late XORs of retired ids) are collected by rotation
        if acks_left(ft) == 0:
            return True
        layer.expire_due()
        return False

    until(collected, lambda: f"the orphans collected ({acks_left(ft)} entries left)", 5.0)


def test_streaming_query_keyed_source_places_fresh_and_replayed_records(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Invariant 7.

    A real file-source query through foreachBatch, 3 micro-batches; the source stage is
    keyed (no shuffle in the pipeline): replays of a batch enter the next ones at the
    partition Spark assigns their key."""
    ft = make_ft(timeout_s=5.0)
    src = tmp_path / "in"
    src.mkdir()
    for f in range(3):
        lines = [f'{{"id": {i}, "key": {i * 7919 % 101}}}' for i in range(f * 500, f * 500 + 500)]
        (src / f"part-{f}.json").write_text("\n".join(lines))

    placement = spark_placement(spark, 101, "bigint", 3)

    def check(r: dict[str, Any]) -> dict[str, Any]:
        probe.check_partition(r, placement[r["key"]])
        if r["id"] % 40 == 3 and probe.first_time("fail", r["id"]):
            raise FailRecord("first attempt fails")
        return r

    pipeline = (ft.pipeline(key="key", partitions=3, immediate_replays=0)
                .map(check).sink(probe.write, per="partition"))  # fmt: skip
    stream = (
        spark.readStream.schema("id long, key long").option("maxFilesPerTrigger", 1).json(str(src))
    )
    query = (
        stream.writeStream.foreachBatch(pipeline)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    batches = ft.results[:3]
    assert [r.fresh for r in batches] == [500, 500, 500]
    assert batches[1].replayed == batches[0].failed > 0  # replays enter the next batch
    assert batches[2].replayed == batches[1].failed > 0
    report = ft.drain(timeout_s=30, query=query)
    assert report.drained and report.dead_lettered == 0
    assert sorted(probe.ids()) == list(range(1500))
    assert probe.strings("misplaced") == []
    assert probe.count("checked:replay") == 38


@pytest.mark.parametrize("shuffle", [False, True], ids=["narrow", "partition_by"])
def test_ft_off_gives_the_same_output_as_ft_on(
    spark: SparkSession, make_ft: Any, probe: Probe, shuffle: bool
) -> None:
    df = spark.range(1500).select(
        "id",
        (F.col("id") % 17).alias("key"),
        F.concat(F.lit("n"), F.col("id").cast("string")).alias("name"),
        F.timestamp_seconds(F.col("id") * 3600).alias("ts"),
        F.to_date(F.timestamp_seconds(F.col("id") * 86400)).alias("day"),
        (F.col("id") / 8).cast("decimal(12,3)").alias("amount"),
    )
    outputs = {}
    for status in ("on", "off"):
        ft = make_ft(status=status)
        p = ft.pipeline(key=["key"]).map(lambda r: {**r, "sq": r["id"] ** 2})
        p = p.filter(lambda r: r["id"] % 5 != 0).flat_map(lambda r: [r, {**r, "id": -r["id"]}])
        if shuffle:
            p = p.partition_by(["key"], 3)
        tag = Probe(probe.url, f"{probe.prefix}{status}")
        result = ft.run_batch(p.sink(tag.write_one), df, 0)
        assert result.failed == 0 and result.written == 2 * 1200
        outputs[status] = sorted(tag.strings("out"))
        tag.r.delete(f"{tag.prefix}:out")
        if ft.layer is not None:
            assert ft.layer.stats().pending == 0
    assert outputs["on"] == outputs["off"] and len(outputs["on"]) == 2400
