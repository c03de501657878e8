"""The plan phase of a batch: one :class:`~ftlayer.spark.vector_plan.VectorPlan` per batch
run, for every pipeline (batch stages, row stages compiled to batch stages, DataFrame
stages), with the schemas Spark and Arrow agree on, the columns a replay carries and an
entry before every segment (ftlayer.spark.entries).

Invariant: a plan is plain picklable data (no live client, no Spark object): every task of
the batch gets the same one, and a run's ``salt`` is fresh, so no two runs of a batch id
share a summary, an edge or a settlement token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from ftlayer.errors import ConfigError
from ftlayer.ids import new_ids
from ftlayer.lineage import copy_seed
from ftlayer.spark.entries import plan_entries
from ftlayer.spark.plan import Segment
from ftlayer.spark.policy import DEFAULT_POLICY, ErrorPolicy
from ftlayer.spark.vector_plan import (
    ATT_COL,
    CUR_COL,
    LIN_COL,
    REF_COLS,
    REPLAY_COLS,
    SRC_COL,
    VectorPlan,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.spark.pipeline import Pipeline

__all__ = ["arrow_schema", "lineage_seed", "new_salt", "plan_batch", "plan_frames",
           "spark_schema", "with_replay_columns", "without_replay_columns"]


def spark_schema(schema: pa.Schema) -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema, prefer_timestamp_ntz=False)


def with_replay_columns(df: DataFrame) -> DataFrame:
    """``df`` (fresh rows) with the columns a replay carries, null."""
    from pyspark.sql import functions as F  # noqa: N812

    return df.select("*", F.lit(None).cast("long").alias(SRC_COL),
                     F.lit(None).cast("int").alias(ATT_COL),
                     F.lit(None).cast("long").alias(CUR_COL),
                     F.lit(None).cast("long").alias(LIN_COL))  # fmt: skip


def without_replay_columns(schema: Any) -> Any:
    """A StructType without ftlayer's replay and reference columns: the source's own."""
    from pyspark.sql.types import StructType

    ours = (*REPLAY_COLS, *REF_COLS)
    return StructType([f for f in schema.fields if f.name not in ours])


_DDL: dict[str, Any] = {}


def arrow_schema(schema: Any, spark: Any) -> pa.Schema:
    """An Arrow schema from a StructType or a DDL string, all fields nullable (marker
    rows carry nulls in every user column). DDL is parsed by the session (the JVM, or the
    Spark Connect server: there is no local JVM there), once per string."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if isinstance(schema, str):
        if schema not in _DDL:
            _DDL[schema] = spark._parse_ddl(schema)
        schema = _DDL[schema]
    out = to_arrow_schema(schema, timezone="UTC")
    return pa.schema([f.with_nullable(True) for f in out])


def plan_batch(
    segments: tuple[Segment, ...],
    input_schema: Any,
    spark: Any,
    *,
    config: Any,
    source: int,
    batch_key: str,
    on_error: str,
    immediate_replays: int | None = None,
    errors: ErrorPolicy = DEFAULT_POLICY,
    record_key: str | None = None,
    lineage_seed: int = 0,
    run_again: bool = True,
) -> VectorPlan:
    """The plan of one run of a vectorized batch (a fresh salt per run)."""
    inputs = [arrow_schema(input_schema, spark)]
    outputs = []
    for i, seg in enumerate(segments):
        schemas = tuple(arrow_schema(op.schema, spark) for kind, op in seg.ops)
        if any(kind != "batches" for kind, _ in seg.ops):
            raise ConfigError("a vectorized pipeline takes batch stages only (map_batches)")
        outputs.append(schemas)
        exit_schema = schemas[-1] if schemas else inputs[-1]
        if seg.shuffle_n:
            missing = [c for c in seg.shuffle_cols if c not in exit_schema.names]
            if missing:
                raise ConfigError(
                    f"partition_by columns {missing} are not in segment {i}'s output "
                    f"{exit_schema.names}"
                )
            inputs.append(exit_schema)
    if record_key is not None:
        for schema in [*inputs, *(s for seg in outputs for s in seg)]:
            i = schema.get_field_index(record_key)
            if i < 0 or schema.field(i).type != pa.int64():
                raise ConfigError(
                    f"record_key {record_key!r} must be an int64 (long) column of the input "
                    f"and of every stage's output; not in {schema}"
                )
    salt = new_salt()
    budget = config.max_replays if immediate_replays is None else immediate_replays
    entries = plan_entries(segments, tuple(inputs), False, record_key)
    return VectorPlan(config, source, batch_key, salt, segments, on_error,
                      min(budget, config.max_replays), tuple(inputs), tuple(outputs),
                      errors, record_key, lineage_seed, run_again, entries)  # fmt: skip


def lineage_seed(df: DataFrame, source: int, batch_id: Any) -> int:
    """The seed of a batch's copied rows' lineage ids (ftlayer.lineage.copy_seed): from
    the streaming query's id (Spark keeps it in the checkpoint, so a batch re-run after a
    crash gets the same seed) when ``df`` is a micro-batch of a classic session's query;
    random otherwise (a pipeline called on a DataFrame, a Spark Connect session)."""
    try:
        query = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    except Exception:  # Spark Connect: no SparkContext behind the session
        query = None
    return copy_seed(query, source, batch_id)


def new_salt() -> int:
    """A batch run's random salt (63 bits): its summaries, edges and settle token."""
    return int(new_ids(1)[0] & np.uint64(0x7FFF_FFFF_FFFF_FFFF))


def plan_frames(pipeline: Pipeline, schema: Any, spark: Any, *, config: Any, batch_key: str,
                lineage_seed: int, run_again: bool) -> VectorPlan:  # fmt: skip
    """The plan of one run of a batch of DataFrame stages (``FrameRun.make_plan``): Spark
    plans the stages itself, so the plan holds the source's schema only. Its immediate
    replays are those of its Python stages (a DataFrame stage's failed rows wait for a
    later batch)."""
    if pipeline.record_key is not None:
        raise ConfigError("record_key takes pipelines of batch stages only (map_batches, "
                          "map_pandas), not DataFrame stages (transform, sink_dataframe)")
    segments = pipeline.segments
    inputs = (arrow_schema(schema, spark),)
    immediate = pipeline.immediate_replays
    budget = config.max_replays if immediate is None else immediate
    return VectorPlan(config, pipeline.source, batch_key, new_salt(), segments,
                      pipeline.on_error, min(budget, config.max_replays), inputs, (),
                      pipeline.errors, lineage_seed=lineage_seed, run_again=run_again,
                      entries=plan_entries(segments, inputs, True, None),
                      replay_from=pipeline.replay_from)  # fmt: skip
