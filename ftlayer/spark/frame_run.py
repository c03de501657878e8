"""Driver side of DataFrame stages (``Pipeline.transform``, ``sink_dataframe``): a batch
runs as the user's own Spark plan, with no Python in its tasks.

Identity. Every row carries two int64 columns tagged with column metadata
(``{"ftlayer": "identity"}``): ``__ft_loc`` and ``__ft_pos``, a fresh row's reference
(its source is kept by reference: ftlayer.spark.references), a fresh copy's (null, its
batch-local id: ftlayer.spark.frame_tasks.CopySource), or a replay's (null, its record
id). Spark carries a column's metadata through projections, filters, joins,
unions and shuffles, and drops it from a column computed anew: a stage whose output lacks
the tagged columns dropped, recomputed or aggregated them, and is refused, named.

Failures. After each stage with ``failed=`` (and each Python stage:
ftlayer.spark.frame_tasks), an ``Observation`` collects the identity and error text of
the rows it marks, and counts its rows; the failed rows are filtered out. The observations
are filled by the job the sink runs (``df.write``): no second pass over the data, no
caching. An observation of the replays' branch collects the ids of the replays that ran.

Settling (after the sink returned, before the batch function returns, so Spark commits
the batch's offsets only then):

* fresh rows that failed become records kept by reference, queued for replay with their
  error (or dead-lettered past ``max_replays``): stored as a segment of failed rows and
  settled at once (lua/segment_settle.lua, under this run's salt), so a driver that dies
  in between leaves a segment the sidecar fails when it times out; copies were stored by
  the source pass, and their segments are settled the same way;
* replays that ran are completed, or failed with their error; one the job did not run
  (its row not found: the file deleted or rewritten) is dead-lettered, named.

Invariants: a fresh record kept by reference is stored in Redis only once it fails --
until then the batch Spark has not committed is its keeper (a driver that dies mid-batch
gets it run again from the query's checkpoint, like any micro-batch). A sink that raises
fails every record of the batch (they replay); nothing is acked that the sink did not
return for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ftlayer.errors import ConfigError, FTLayerError
from ftlayer.ids import LOCAL_BIT
from ftlayer.limits import DEAD_NOW
from ftlayer.spark.batch_plan import arrow_schema, spark_schema
from ftlayer.spark.frame_tasks import (
    DEAD_COL,
    ERROR_COL,
    FAILED_COL,
    CopySource,
    PythonStep,
    answer_type,
)
from ftlayer.spark.plan import (
    MAX_MESSAGES,
    SOURCE_STAGE,
    BatchStage,
    FrameStage,
    error_text,
    stage_name,
)
from ftlayer.spark.references import with_references
from ftlayer.spark.results import BatchResult, StageCounts
from ftlayer.spark.settle import Failure, Residues
from ftlayer.spark.vector_plan import LOC_COL, POS_COL, SRC_COL, stage_label

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from ftlayer.spark.engine import BatchRun

__all__ = ["IDENTITY", "FrameRun", "frame_label"]

log = logging.getLogger(__name__)

IDENTITY = {"ftlayer": "identity"}
"""The metadata of the identity columns (``__ft_loc``, ``__ft_pos``)."""


def frame_label(segment: int, op: int, fn: Any) -> str:
    """``transform[0.1] parse``: a DataFrame stage's name in errors and counts."""
    return f"transform[{segment}.{op}] {stage_name(fn)}"


@dataclass
class FrameRun:
    """The execute phase of one run of a batch of DataFrame stages."""

    run: BatchRun
    observed: list[tuple[str, Any]] = field(default_factory=list)
    """(stage label, Observation) of every stage with ``failed=``, in order, each
    counting the rows it sees (no stage has one: ("", a count at the sink's input))."""
    replays_observed: Any = None
    """The ids of the replays the job read (those read back: one not read was not found)."""
    plain_source: DataFrame | None = None
    """The batch's source rows without observations: read again only if the sink raised."""
    copies: bool = False
    """Its fresh rows are copies, stored by the source pass (frame_tasks.CopySource)."""
    sink_label: str = ""
    """A Python sink's label (its observation counts its failed rows only)."""
    ran: dict[int, int] = field(default_factory=dict)
    """The replays the job ran: source id -> current id."""

    @property
    def plan(self) -> Any:
        return self.run.plan

    @property
    def layer(self) -> Any:
        return self.run.layer

    @property
    def result(self) -> BatchResult:
        return self.run.result

    # -- the plan ----------------------------------------------------------------------
    def frame(self, df: DataFrame, key: tuple[str, ...], partitions: int | None,
              replay_limit: int, fresh: bool = True) -> DataFrame | None:  # fmt: skip
        """The rows that reach the sink: ``df``'s fresh rows (none with ``fresh=False``)
        and the batch's replays through the stages, identity kept, failures observed and
        filtered out. None: the batch has no rows at all.

        Observations cost: each one cuts Spark's generated code for its stage, so there
        is one per stage with
        ``failed=`` and none elsewhere on the fresh rows' path (the replays' branch has
        its own: replays are few; no stage has one: a count at the sink's input)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        plan, run = self.plan, self.run
        names = list(plan.inputs[0].names)
        spark = df.sparkSession
        streamed = SRC_COL in df.columns
        parts = []
        if fresh:
            rows = df.filter(F.col(SRC_COL).isNull()) if streamed else df
            if run.reads is not None:
                if LOC_COL not in rows.columns:
                    rows = with_references(run.reads, rows)
            elif self.layer is not None:  # copies: the one Python pass, storing them
                self.copies = True
                copy = CopySource(plan.config, plan.source, plan.batch_key, plan.salt,
                                  plan.lineage_seed)  # fmt: skip
                fields = [*plan.inputs[0], pa.field(LOC_COL, pa.int64()),
                          pa.field(POS_COL, pa.int64())]  # fmt: skip
                rows = rows.select(*names).mapInArrow(copy, spark_schema(pa.schema(fields)))
            else:  # FT off: nothing to name
                rows = rows.select(*names, F.lit(None).cast("long").alias(LOC_COL),
                                   F.lit(0).cast("long").alias(POS_COL))  # fmt: skip
            parts.append(rows.select(*names, F.col(LOC_COL).alias(LOC_COL, metadata=IDENTITY),
                                     F.col(POS_COL).alias(POS_COL, metadata=IDENTITY)))
        if run.intake is not None:
            run.intake.calls += 1
            self.layer.segments.drop_batch(plan.source, plan.batch_key)
            run.streamed = streamed
            run.replays = run.intake.streamed() if streamed else run.intake.claim(replay_limit)
            replays = run.intake.dataframe(spark, run.replays, run.reads)
            if replays is not None:
                self.replays_observed = Observation(f"ft-{plan.salt:x}-replays")
                replays = replays.select(
                    *names, F.lit(None).cast("long").alias(LOC_COL, metadata=IDENTITY),
                    F.col(SRC_COL).alias(POS_COL, metadata=IDENTITY))  # fmt: skip
                ids = F.array_join(F.collect_list(F.col(POS_COL).cast("string")), ",")
                parts.append(replays.observe(self.replays_observed, ids.alias("ids")))
        if not parts:
            return None
        out = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        self.plain_source = out
        if key and partitions:
            out = out.repartition(partitions, *key)
        for i, seg in enumerate(plan.segments):
            if i:
                prev = plan.segments[i - 1]
                out = out.repartition(prev.shuffle_n, *prev.shuffle_cols)
            for j, (kind, stage) in enumerate(seg.ops):
                if kind == "frame":
                    out = self._stage(out, frame_label(i, j, stage.fn), stage)
                else:
                    out = self._python(out, stage_label(i, j, stage.fn), stage,
                                       arrow_schema(stage.schema, spark))  # fmt: skip
        return out

    def _counted(self, df: DataFrame) -> DataFrame:
        """``df`` counted by an observation of its own if no stage observed the batch."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        if self.observed:
            return df
        obs = Observation(f"ft-{self.plan.salt:x}-count")
        self.observed.append(("", obs))
        return df.observe(obs, F.count(F.lit(1)).alias("rows"))

    def _stage(self, df: DataFrame, label: str, stage: FrameStage) -> DataFrame:
        from pyspark.sql import functions as F  # noqa: N812

        out = stage.fn(df)
        if not hasattr(out, "sparkSession") or not hasattr(out, "columns"):
            raise ConfigError(f"{label} returned {type(out).__name__}, not a DataFrame")
        schema = out.schema
        for name in (LOC_COL, POS_COL):
            if name not in out.columns or schema[name].metadata.get("ftlayer") != "identity":
                how = "dropped" if name not in out.columns else "recomputed or aggregated"
                raise ConfigError(
                    f"{label} {how} ftlayer's identity column {name!r}: a DataFrame stage "
                    "keeps __ft_loc and __ft_pos as they are (withColumn, select('*', ...), "
                    "filters and joins do) and works row by row (no aggregation)"
                )  # fmt: skip
        failed = _column(stage.failed, out)
        if failed is None:
            return out
        errors = stage.errors
        text = F.lit(label) if errors is None else F.concat_ws(
            ": ", F.lit(label), F.lit(errors) if isinstance(errors, str) else errors)  # fmt: skip
        out = out.withColumn(FAILED_COL, F.coalesce(failed, F.lit(False)))
        return self._observe(out, label, F.coalesce(text, F.lit(label)), F.lit(False))

    def _python(self, df: DataFrame, label: str, stage: BatchStage,
                output: pa.Schema | None) -> DataFrame:  # fmt: skip
        """A Python stage (a sink: ``output`` None) as a ``mapInArrow`` answering its
        outputs and its failed rows (ftlayer.spark.frame_tasks), observed and filtered."""
        from pyspark.sql import functions as F  # noqa: N812
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import StructType

        user = StructType([f for f in df.schema.fields if f.name not in (LOC_COL, POS_COL)])
        inputs = to_arrow_schema(user, timezone="UTC")
        plan = self.plan
        step = PythonStep(stage, label, inputs, output, stage.errors or plan.errors,
                          plan.run_again,
                          int(plan.batch_key) if plan.batch_key.isdigit() else None,
                          plan.salt)  # fmt: skip
        out = df.mapInArrow(step, answer_type(step))
        names = list(output.names) if output is not None else []
        out = out.select(*names, F.col(LOC_COL).alias(LOC_COL, metadata=IDENTITY),
                         F.col(POS_COL).alias(POS_COL, metadata=IDENTITY),
                         FAILED_COL, ERROR_COL, DEAD_COL)  # fmt: skip
        out = self._observe(out, label, F.col(ERROR_COL), F.col(DEAD_COL))
        return out.drop(ERROR_COL, DEAD_COL)

    def _observe(self, out: DataFrame, label: str, error: Column, dead: Column) -> DataFrame:
        """Observe the rows ``__ft_failed`` marks (their identity, error, whether they go
        straight to the dead letters) and the stage's count; leave the others. The flag
        is a column, observed, then filtered: the observation also keeps Spark from
        pushing the filter below the stage's projection (which would compute it twice)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        obs = Observation(f"ft-{self.plan.salt:x}-{len(self.observed)}")
        # as text: each failed row "location,position,error id" joined by ";", each
        # distinct error once as JSON (py4j passes a string as it is, where a pickled row
        # of lists crosses byte by byte)
        failed = F.col(FAILED_COL)
        err_id = F.xxhash64(error, dead)
        row = F.concat_ws(",", F.coalesce(F.col(LOC_COL).cast("string"), F.lit("")),
                          F.col(POS_COL).cast("string"), err_id.cast("string"))  # fmt: skip
        self.observed.append((label, obs))
        out = out.observe(
            obs, F.count(F.lit(1)).alias("rows"),
            F.array_join(F.collect_list(F.when(failed, row)), ";").alias("failed"),
            F.to_json(F.collect_set(F.when(failed, F.struct(
                err_id.alias("id"), error.alias("error"), dead.alias("dead"))))).alias("errors"))
        return out.filter(~failed).drop(FAILED_COL)

    # -- running and settling ----------------------------------------------------------
    def write(self, out: DataFrame, batch_id: Any) -> Residues:
        """Call the sink with ``out`` (the identity columns dropped unless it wants them);
        the batch's residues from the observations (the sink's failure fails every record
        of the batch)."""
        seg = self.plan.segments[-1]
        user_sink = seg.sink
        assert user_sink is not None
        out = self._counted(out)
        if seg.sink_lineage is not None:
            out = self._with_lineage(out, seg.sink_lineage)
        if seg.sink_per == "dataframe":
            given = out if seg.sink_ids else out.drop(LOC_COL, POS_COL)
            name = f"sink_dataframe {stage_name(user_sink)}"

            def write() -> None:
                user_sink(given, batch_id)
        else:  # a Python sink: its failed and unconfirmed rows are its answer
            label = stage_label(len(self.plan.segments) - 1, len(seg.ops), user_sink, True)
            sink = BatchStage(user_sink, None, pandas=seg.sink_pandas, errors=seg.sink_errors)
            answers = self._python(out, label, sink, None)
            name = self.sink_label = label

            def write() -> None:
                answers.write.format("noop").mode("overwrite").save()
        try:
            with _metrics_kept(out.sparkSession):
                write()
        except Exception as e:
            text = error_text(name, e)
            log.error("DataFrame sink failed batch_id=%s: every record of the batch "
                      "replays: %s", self.result.batch_id, text)  # fmt: skip
            return self._fail_everything(text)
        return self._residues_observed(name)

    def _with_lineage(self, out: DataFrame, name: str) -> DataFrame:
        """``out`` with each row's lineage id in column ``name`` (ftlayer.lineage),
        computed in the JVM from its identity: a reference's hash, a copy's batch-local
        id's, a replay's stored one (a broadcast join with the batch's replays; FT off:
        a hash of Spark's row id)."""
        from pyspark.sql import functions as F  # noqa: N812

        plan = self.plan
        loc, pos = F.col(LOC_COL), F.col(POS_COL)
        if self.layer is None:
            return out.withColumn(name, F.xxhash64(F.lit(plan.lineage_seed).cast("long"),
                                                   F.monotonically_increasing_id()))
        lin = (F.when(loc.isNotNull(), F.xxhash64(F.lit(plan.source).cast("long"), loc, pos))
               .when(pos < 0, F.xxhash64(F.lit(plan.lineage_seed).cast("long"), pos)))
        replays = self.run.replays
        if replays is not None and replays.table.num_rows:
            rid, rlin = "__ft_replay_id", "__ft_replay_lin"
            known = replays.lineage.rename_columns([rid, rlin])
            out = out.join(F.broadcast(out.sparkSession.createDataFrame(known)),
                           pos == F.col(rid), "left")  # fmt: skip
            return out.withColumn(name, lin.otherwise(F.col(rlin))).drop(rid, rlin)
        return out.withColumn(name, lin)

    def _residues_observed(self, sink: str) -> Residues:
        """Read the observations (the counts, the failed rows, the replays read): the
        batch's residues. ``fresh`` counts the rows the first observation saw (a stage filtering
        rows before it makes it smaller; those rows completed)."""
        first = _metrics(self.observed[0][1])
        if first is None:
            raise ConfigError(
                f"{sink} ran no DataFrame action on its DataFrame, so "
                "ftlayer cannot know what it wrote: write it with df.write (or collect, "
                "toArrow, count); df.foreach/foreachPartition and df.rdd do not report "
                "to Spark's observations")  # fmt: skip
        ran: list[int] = []
        if self.replays_observed is not None:
            got = _metrics(self.replays_observed)
            ran = [] if got is None else [int(x) & _U64 for x in got["ids"].split(",") if x]
        r = self.result
        r.replayed = len(ran)
        fresh: dict[tuple[int | None, int], Failure] = {}
        replays: dict[int, Failure] = {}
        r.fresh = max(int(first["rows"]) - len(ran), 0)
        for label, obs in self.observed:
            m = _metrics(obs)
            if m is None:  # the sink's action skipped this stage: nothing can be assumed
                raise FTLayerError(f"{label}'s rows were not all seen by the sink's job: "
                                   "the batch fails (Spark runs it again)")  # fmt: skip
            failed = [x.split(",") for x in (m.get("failed") or "").split(";") if x]
            stage = label or SOURCE_STAGE
            errors = {int(e["id"]): Failure(e["error"], 1 | DEAD_NOW if e["dead"] else 1, stage)
                      for e in json.loads(m.get("errors") or "[]")}  # fmt: skip
            for loc_text, pos_text, err in failed:
                why, pos = errors[int(err)], int(pos_text)
                loc = int(loc_text) if loc_text else None
                if _replay(loc, pos):
                    replays.setdefault(pos & _U64, why)
                else:
                    fresh.setdefault((loc, pos), why)
            rows = int(m["rows"])
            if label == self.sink_label:  # a Python sink answers its failed rows only
                rows = r.written
            if label:
                r.stages.setdefault(label, StageCounts()).add(
                    StageCounts(rows, rows - len(failed), len(failed)))  # fmt: skip
            r.written = rows - len(failed)
        return self._residues(set(ran), fresh, replays)

    def _fail_everything(self, text: str) -> Residues:
        """The sink raised: every record of the batch fails with its error (the source's
        identities read again: the failure path's one extra pass)."""
        r = self.result
        if self.plain_source is None:
            return Residues()
        ids = self.plain_source.select(LOC_COL, POS_COL).toArrow()
        loc = ids.column(LOC_COL).to_pylist()
        pos = ids.column(POS_COL).to_pylist()
        ran = {p & _U64 for lo, p in zip(loc, pos, strict=True) if _replay(lo, p)}
        why = Failure(text, 1, self.sink_label or SOURCE_STAGE)
        fresh = {(lo, p): why for lo, p in zip(loc, pos, strict=True) if not _replay(lo, p)}
        r.replayed, r.fresh = len(ran), len(fresh)
        r.errors.append(text)
        return self._residues(ran, fresh, dict.fromkeys(ran, why))

    def _residues(self, ran: set[int], fresh: dict[tuple[int | None, int], Failure],
                  replays: dict[int, Failure]) -> Residues:  # fmt: skip
        """Count the batch and make its residues: the replays that ran (``ran``, by
        source id), failed fresh rows (by identity: a reference, or a copy's batch-local
        id) and failed replays."""
        r = self.result
        r.failed = len(fresh) + len(replays)
        r.acked = r.fresh + r.replayed - r.failed
        for why in [*fresh.values(), *replays.values()][:MAX_MESSAGES]:
            if len(r.errors) < MAX_MESSAGES and why.error not in r.errors:
                r.errors.append(why.error)
        taken = self.run.replays.injected if self.run.replays is not None else {}
        self.ran = {s: c for s, c in taken.items() if s in ran}
        res = Residues(failed=dict(replays))
        for (loc, pos), why in fresh.items():
            if self.copies:
                res.failed[pos & _U64] = why
            elif loc is not None:
                res.by_reference[(loc, pos)] = why
        return res


_EXCLUDED = "spark.sql.adaptive.optimizer.excludedRules"
_EMPTY_RULE = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


@contextmanager
def _metrics_kept(spark: Any) -> Iterator[None]:
    """While the sink's job runs, adaptive execution may not cut a subplan it found empty
    (a shuffle every row failed before): the cut takes its observations with it, and the
    failures they saw would be lost. Restored after."""
    before = spark.conf.get(_EXCLUDED, None)
    rules = [r for r in (before or "").split(",") if r]
    if _EMPTY_RULE in rules:
        yield
        return
    spark.conf.set(_EXCLUDED, ",".join([*rules, _EMPTY_RULE]))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(_EXCLUDED)
        else:
            spark.conf.set(_EXCLUDED, before)


def _replay(loc: int | None, pos: int) -> bool:
    """A replay's identity: no location, and a persisted record id (not a batch-local
    id, which names a copied row of this batch's source pass)."""
    return loc is None and not pos & _U64 & _LOCAL


def _column(spec: Any, df: DataFrame) -> Column | None:
    from pyspark.sql import functions as F  # noqa: N812

    if spec is None:
        return None
    if isinstance(spec, str):
        return F.expr(spec)
    if callable(spec) and not type(spec).__name__ == "Column":
        return spec(df)
    return spec


def _metrics(obs: Any) -> dict[str, Any] | None:
    """An observation's metrics, or None if no action filled them (never blocks)."""
    jo = getattr(obs, "_jo", None)
    if jo is not None:  # classic PySpark: get blocks until the first action ends
        if not jo.future().isCompleted():
            return None
        row = jo.getRow()
        if row.length() == 0:  # the action ran a plan without this observation
            raise FTLayerError("Spark's job for the sink did not run ftlayer's observation "
                               f"{jo.name()} (its subplan was cut): nothing can be "
                               "assumed of the batch; it fails, and Spark runs it again")
        names = list(row.schema().fieldNames())  # values read one by one: longs and
        return {n: row.get(i) for i, n in enumerate(names)}  # strings cross py4j as they are
    got = obs.get  # Spark Connect: empty until an action's result carried them
    return dict(got) if got else None


_U64 = (1 << 64) - 1
_LOCAL = int(LOCAL_BIT)
