"""The driver side of ``ack_scope="task"`` (deprecated): row stages over ``df.rdd``, each
task acking its records in Redis with one flush at its end (ftlayer.spark.row_tasks).

Deprecated because the batch engine (ftlayer.spark.engine) runs the same row stages,
compiled to batch stages, with Spark's own shuffle, under Spark Connect, with sources
kept by reference, lineage ids and the replay stream, and with O(tasks) Redis calls per
batch instead of O(records). Migrating: drop ``ack_scope="task"``; the stages and the
sink stay as they are.

Placement: ``key`` columns give each record its hash code (Spark's ``hash(key)``, in the
JVM). With ``partitions=n`` the source stage is keyed: fresh rows are placed by
``df.repartition(n, *key)`` and replays by ``HashPartitioner(n).select(hash_code)`` -- the
same partition. Without it, replays return to their original partition (modulo the batch's
partition count). After a ``partition_by(cols, n)``, fresh and replayed records alike are
placed by the ``partitioners`` mirror of ``repartition(n, *cols)`` (types from the input
schema, or ``types=``), so every record of a key meets in the partition Spark assigns it.

Invariant: the batch function returns after every task flushed, so Spark commits the
batch's offsets only when each of its records is complete or persisted with a live
timeout (invariant 1).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ftlayer.errors import ConfigError
from ftlayer.payloads import decode_record, field_codecs
from ftlayer.spark.intake import reject
from ftlayer.spark.report import report
from ftlayer.spark.results import BatchResult
from ftlayer.spark.row_tasks import (
    HASH_COL,
    TaskPlan,
    TaskSummary,
    run_shuffled_task,
    run_source_task,
)
from partitioners import HashPartitioner

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.spark.engine import BatchEngine
    from ftlayer.spark.pipeline import Pipeline

__all__ = ["DEPRECATION", "run_task_scope"]

log = logging.getLogger(__name__)

DEPRECATION = ("ack_scope='task' is deprecated and will be removed: the default "
               "ack_scope='batch' runs the same row stages (drop the argument; see "
               "docs/spark-pipeline.md, 'Task scope')")  # fmt: skip


def _identity(k: int) -> int:
    return k


def run_task_scope(engine: BatchEngine, pipeline: Pipeline, df: DataFrame,
                   batch_id: Any) -> BatchResult:  # fmt: skip
    """One batch of ``pipeline`` (fresh rows of ``df`` + claimed replays) to the end.
    Raises if the Spark job fails (the claimed replays then time out and come back; Spark
    re-runs the batch's fresh rows)."""
    started = time.monotonic()
    spark = df.sparkSession
    result = BatchResult(batch_id)
    plan = _plan(engine, pipeline, df.schema)
    engine._backpressure(pipeline.source, batch_id)
    fresh = _keyed(engine, pipeline, df)
    if type(fresh).__module__.startswith("pyspark.sql.connect"):
        raise ConfigError("ack_scope='task' needs df.rdd, which Spark Connect does not have: "
                          "use the default ack_scope='batch'")  # fmt: skip
    rdd = fresh.rdd
    n = rdd.getNumPartitions()
    groups = _claim(engine, pipeline, plan, max(n, 1), result)
    if n == 0:
        if not groups:
            return report(engine.layer, pipeline, result, started)
        rdd, n = spark.sparkContext.parallelize([], 1), 1
    bc = spark.sparkContext.broadcast(groups) if groups else None
    try:
        out = rdd.mapPartitionsWithIndex(partial(run_source_task, plan, bc))
        for stage in range(1, len(plan.segments)):
            n_out = plan.segments[stage - 1].shuffle_n
            out = out.partitionBy(n_out, _identity).mapPartitionsWithIndex(
                partial(run_shuffled_task, plan, stage))  # fmt: skip
        summaries: list[TaskSummary] = out.collect()
    finally:
        if bc is not None:
            bc.unpersist()
    for s in summaries:
        result.tasks += 1
        result.add(s, acked=s.stage == 0)  # a source record is acked in the source stage
    return report(engine.layer, pipeline, result, started)


def _plan(engine: BatchEngine, pipeline: Pipeline, schema: Any) -> TaskPlan:
    names = set(schema.fieldNames())
    segments = []
    for seg in pipeline.segments:
        if seg.shuffle_n and seg.shuffle_types is None and set(seg.shuffle_cols) <= names:
            types = tuple(schema[c].dataType.simpleString() for c in seg.shuffle_cols)
            seg = replace(seg, shuffle_types=types)
        segments.append(seg)
    return TaskPlan(engine.config, pipeline.source, tuple(segments), pipeline.on_error,
                    field_codecs(schema), pipeline.key, pipeline.errors)  # fmt: skip


def _keyed(engine: BatchEngine, pipeline: Pipeline, df: DataFrame) -> DataFrame:
    """The input with Spark's ``hash(key)`` column, placed by key when keyed."""
    from pyspark.sql import functions as F  # noqa: N812

    if not pipeline.key:
        return df
    if pipeline.partitions:
        df = df.repartition(pipeline.partitions, *pipeline.key)
    if not engine.config.enabled:
        return df
    return df.withColumn(HASH_COL, F.hash(*pipeline.key))


def _claim(engine: BatchEngine, pipeline: Pipeline, plan: TaskPlan, n: int,
           result: BatchResult) -> dict[int, list[tuple[int, int, Any]]]:  # fmt: skip
    """Claim this source's replays, decode them as records and group them by target
    partition (those that do not decode are rejected by the intake's rule)."""
    layer = engine.layer
    if layer is None:
        return {}
    claimed = layer.claim_replays(pipeline.source, engine.replay_limit)
    keyed = HashPartitioner(pipeline.partitions) if pipeline.partitions else None
    groups: dict[int, list[tuple[int, int, Any]]] = {}
    bad = []
    for c in claimed:
        try:
            record = decode_record(c.frame.payload, plan.codecs, c.frame.describe())
        except Exception as e:
            bad.append((c.record_id, f"{c.frame.describe()}: undecodable replay payload: {e}"))
            continue
        if keyed is not None:
            target = keyed.select(c.frame.hash_code, c.original_partition)[0]
        else:
            target = max(c.original_partition, 0) % n
        groups.setdefault(target, []).append((c.record_id[0], c.record_id[1], record))
    reject(layer, bad, result, f"batch_id={result.batch_id} ")
    if claimed:
        log.info("replays claimed batch_id=%s source=%d claimed=%d undecodable=%d",
                 result.batch_id, pipeline.source, len(claimed), len(bad))  # fmt: skip
    return groups
