"""A batch run's fields reach the tasks of Python stages whose ``mapInArrow`` is built once
per query (ftlayer.spark.run_fields): real Spark (local[2]), real Redis, real files.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.spark import BatchContext, FileSource
from ftlayer.spark.run_fields import RunFields, fields_set, map_in_arrow

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

SCHEMA = "id long, key long, amount string"


def write_json(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": i, "key": i % 7, "amount": f"{i}.5"}) + "\n"
                            for i in range(n)))  # fmt: skip


@pytest.mark.parametrize("kind", ["dataframe", "vectorized"])
def test_a_python_stage_knows_its_batch_run(
    spark: SparkSession, make_ft: Any, probe: Any, tmp_path: Path, kind: str
) -> None:
    """A Python stage that takes a context -- after a DataFrame stage, or in a pipeline of
    batch stages with a keyed shuffle -- runs batches 3, 4, then 4 again (Spark running its
    last batch again). Every task of a run sees its batch id, its run id (another each
    run) and ``written_before`` False on a first run, True on the re-run; every record is
    acked. Catches: a batch told another batch's id or run (a function built once per query
    keeping the first batch's fields), a re-run taken for a first run (an idempotent sink
    appending again), segments filed under another batch (records not acked)."""
    write_json(tmp_path / "in" / "a.json", 60)
    files = FileSource("json", str(tmp_path / "in"), SCHEMA)

    def seen(b: pa.RecordBatch, ctx: BatchContext) -> pa.RecordBatch:
        before = ctx.written_before
        state = "none" if before is None else "all" if before.all() else \
            "no" if not before.any() else "some"  # fmt: skip
        probe.r.rpush(f"{probe.prefix}:ctx", f"{ctx.batch_id}/{ctx.run_id}/{state}")
        return b

    ft = make_ft(timeout_s=5.0)
    pipeline = ft.pipeline(reads=files, name=f"ctx-{kind}")
    if kind == "dataframe":
        amt = F.col("amount").cast("double")
        pipeline = (pipeline.transform(lambda df: df.withColumn("amt", amt))
                    .map_batches(seen, "id long, key long, amount string, amt double")
                    .sink_dataframe(lambda df, _: df.write.format("noop").mode("overwrite")
                                    .save()))  # fmt: skip
    else:
        pipeline = (pipeline.map_batches(lambda b: b, SCHEMA).partition_by(["key"], 3)
                    .map_batches(seen, SCHEMA).sink_batches(lambda b: None))  # fmt: skip
    runs = []
    for batch_id in (3, 4, 4):
        probe.r.delete(f"{probe.prefix}:ctx")
        df = spark.read.schema(SCHEMA).json(str(tmp_path / "in"))
        assert ft.run_batch(pipeline, df, batch_id).acked == 60
        got = {x.decode() for x in probe.r.lrange(f"{probe.prefix}:ctx", 0, -1)}
        assert len(got) == 1, got  # every task of the run saw the same
        runs.append(got.pop().split("/"))
    assert [r[0] for r in runs] == ["3", "4", "4"]
    assert [r[2] for r in runs] == ["no", "no", "all"]
    assert len({r[1] for r in runs}) == 3 and "0" not in {r[1] for r in runs}
    assert ft.layer.stats().pending == 0


def test_a_job_without_its_run_fields_fails_rather_than_guess(spark: SparkSession) -> None:
    """A function built once per query that files its work under its run (a vectorized
    segment) run by a job that does not carry the run's fields fails its task, naming
    them; the same job with them set runs. Catches: a task filing a segment under an empty
    batch key or salt 0 (its records never settled, or another run's settled instead)."""
    from ftlayer.spark.vector_plan import VectorPlan

    class Needs:
        """Stands for a segment's function: what its plan's ``in_task`` gives it."""

        def __init__(self, plan: Any) -> None:
            self.plan = plan

        def __call__(self, batches: Any) -> Any:
            plan = self.plan.in_task()
            for b in batches:
                yield pa.RecordBatch.from_arrays(
                    [pa.array([plan.batch_key] * b.num_rows), pa.array([plan.salt] * b.num_rows)],
                    names=["key", "salt"])  # fmt: skip

    plan = VectorPlan(None, 0, "", 0, (), "fail", 0, (), ())  # type: ignore[arg-type]
    run = RunFields("17", 99, 5, False)
    df = spark.range(4)
    out = map_in_arrow(df, ("needs",), lambda r: (Needs(plan.for_run(r)), "key string, salt long"),
                       run, {})  # fmt: skip
    with pytest.raises(Exception, match="found no batch run's fields"):
        out.collect()
    with fields_set(spark, run):
        rows = out.collect()
    assert {(r.key, r.salt) for r in rows} == {("17", 99)}
