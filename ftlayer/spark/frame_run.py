"""The execute phase of DataFrame stages (``Pipeline.transform``, ``sink_dataframe``): a
batch runs as the user's own Spark plan, with no Python in its tasks (a Python stage among
them is one ``mapInArrow``: ftlayer.spark.frame_tasks).

Identity (ftlayer.spark.identity). Every row carries two int64 columns tagged with column
metadata: ``__ft_loc`` and ``__ft_pos``, a fresh row's reference (its source is kept by
reference: ftlayer.spark.references), a fresh copy's (null, its batch-local id:
frame_tasks.CopySource), or a replay's (null, its record id). Spark carries a column's
metadata through projections, filters, joins, unions and shuffles, and drops it from a
column computed anew: a stage whose output lacks the tagged columns dropped, recomputed or
aggregated them, and is refused, named -- checked before the columns are used (a stage's
``failed=``, a Python stage, the sink), one schema read each.

Failures (ftlayer.spark.frame_observations). After each stage with ``failed=`` an
``Observation`` collects the identity and error text of the rows it marks, and counts its
rows; the failed rows are filtered out. A Python stage's tasks report theirs instead
(ftlayer.spark.frame_reports; observed like ``failed=`` under Spark Connect). The
observations and reports are filled by the job the sink runs (``df.write``): no second
pass over the data, no caching. The
batch's residues are read from them; the settle phase (ftlayer.spark.settle) stores the
failed fresh rows as records kept by reference (copies: settles the segments the source
pass stored), and completes or fails the replays that ran.

Invariants: a fresh record kept by reference is stored in Redis only once it fails --
until then the batch Spark has not committed is its keeper (a driver that dies mid-batch
gets it run again from the query's checkpoint, like any micro-batch). A sink that raises
fails every record of the batch (they replay); nothing is acked that the sink did not
return for. The expressions ftlayer adds are built once per query (``BatchRun.columns``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ftlayer import gc_pause
from ftlayer.errors import ConfigError
from ftlayer.spark import jvm_args
from ftlayer.spark.batch_plan import arrow_schema, plan_frames, spark_schema
from ftlayer.spark.batch_run import BatchRun, OfRun
from ftlayer.spark.entries import Entry, walk
from ftlayer.spark.frame_entries import (
    Kept,
    carry,
    entering,
    entering_key,
    entries_known,
    keeps_until,
    kept_budget,
    no_rows,
    rows_ids,
    still_carried,
)
from ftlayer.spark.frame_observations import Observations, metrics_kept
from ftlayer.spark.frame_reports import reports_of
from ftlayer.spark.frame_tasks import (
    FAILED_COL,
    CopySource,
    PythonStep,
    answer_type,
)
from ftlayer.spark.identity import IDENTITY, check_identity, identity_columns, with_lineage
from ftlayer.spark.intake import reject
from ftlayer.spark.plan import (
    BatchStage,
    FrameStage,
    error_text,
    stage_name,
)
from ftlayer.spark.references import with_references
from ftlayer.spark.run_fields import RunFields, fields_set, map_in_arrow
from ftlayer.spark.settle import Residues, Settlement
from ftlayer.spark.vector_plan import LOC_COL, POS_COL, SRC_COL, VectorPlan, stage_label

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from ftlayer.config import FTConfig
    from ftlayer.spark.pipeline import Pipeline

__all__ = ["FrameRun", "frame_label"]

log = logging.getLogger(__name__)



def frame_label(segment: int, op: int, fn: Any) -> str:
    """``transform[0.1] parse``: a DataFrame stage's name in errors and counts."""
    return f"transform[{segment}.{op}] {stage_name(fn)}"


@dataclass
class FrameRun(OfRun):
    """The execute phase of one run of a batch of DataFrame stages."""

    run: BatchRun
    copies: bool = False
    """Its fresh rows are copies, stored by the source pass (frame_tasks.CopySource)."""
    calls: int = 0
    python: int = 0
    """Python stages in the batch's job (they read the run's fields: run_fields)."""
    unchecked: list[tuple[str, DataFrame]] = field(default_factory=list)
    """DataFrame stages whose identity columns were not checked yet: (label, output)."""
    seen: Observations = field(init=False)
    """The batch's observations (its failed rows, its counts, the replays it ran)."""

    def __post_init__(self) -> None:
        self.seen = Observations(self.run.plan.salt, columns=self.run.columns,
                                 bound=keeping(self.run))  # fmt: skip

    # -- the stage kind (ftlayer.spark.engine.StageKind) ----------------------------------
    @staticmethod
    def enters(plan: VectorPlan) -> bool:
        """Stage rows enter where they were kept, unless the pipeline replays from its
        source (``replay_from="source"``)."""
        return plan.replay_from == "stage"

    @staticmethod
    def make_plan(pipeline: Pipeline, schema: Any, spark: Any, *, config: FTConfig,
                  batch_key: str, lineage_seed: int, run_again: bool) -> VectorPlan:  # fmt: skip
        """The batch's plan: Spark plans DataFrame stages itself (batch_plan.plan_frames)."""
        return plan_frames(pipeline, schema, spark, config=config, batch_key=batch_key,
                           lineage_seed=lineage_seed, run_again=run_again)  # fmt: skip

    def execute(self, df: DataFrame, pipeline: Pipeline, replay_limit: int,
                fresh: bool) -> Residues | None:  # fmt: skip
        """Run the batch's job (the sink's write); its residues (None: no rows at all).
        A micro-batch that holds no fresh rows (:func:`holds_no_rows`: a trigger for the
        replays alone) is planned as a drain's batch is: its replays only, entering where
        they come in, without the source's branch of the plan."""
        fresh = fresh and not holds_no_rows(df)
        out = self.frame(df, pipeline.key, pipeline.partitions, replay_limit, fresh)
        return None if out is None else self.write(out, self.result.batch_id)

    def settle(self, settlement: Settlement, res: Residues) -> None:
        """Failed fresh rows stored (copies: the source pass's segments settled), then
        the replays the job ran."""
        if self.copies:
            settlement.copies(res)
        else:
            settlement.by_reference(res.by_reference, self.result.fresh)
        refs = self.run.replays.references if self.run.replays is not None else {}
        settlement.replays(self.seen.ran, refs, res)

    # -- the plan ----------------------------------------------------------------------
    def frame(self, df: DataFrame, key: tuple[str, ...], partitions: int | None,
              replay_limit: int, fresh: bool = True) -> DataFrame | None:  # fmt: skip
        """The rows that reach the sink: ``df``'s fresh rows (none with ``fresh=False``)
        and the batch's replays through the stages, identity kept, failures observed and
        filtered out. None: the batch has no rows at all.

        Observations (each cuts Spark's generated code): one per stage with ``failed=``,
        one on the replays' branch (few rows), else a count at the sink's input."""
        plan = self.plan
        spark = df.sparkSession
        streamed = SRC_COL in df.columns
        parts = []
        if fresh:
            rows, self.copies = fresh_rows(self.run, df, streamed)
            parts.append(rows)
        if (replays := self._replays(spark, streamed, replay_limit)) is not None:
            parts.append(replays)
        start = 0  # the segment the plan starts at
        if not parts and self.run.replays is not None and self.run.replays.rows:
            first, start = self._entered_start(spark)  # stage rows only: they enter later
            parts = [first if first is not None else no_rows(plan.inputs[0], spark)]
        if not parts:
            return None
        out = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
        self.seen.read_back = read_back(self.run)
        out = self._enter(plan.entries[0], out)
        self.seen.plain_source = out
        if key and partitions and not start:
            out = jvm_args.repartition(out, partitions, key, self.run.columns)
        known = plan.inputs[0] if not start else None  # the user columns, while known

        def segment(i: int, out: DataFrame) -> DataFrame:
            nonlocal known
            seg = plan.segments[i]
            kept, keep_to = None, keeps_until(plan, i, self.layer is not None,
                                              not i and self.seen.read_back > 0)  # fmt: skip
            if keep_to is not None:  # its failed rows are kept as its input: carried
                self.run.columns.setdefault(("segment", id(seg)), seg)  # its id its own
                out, kept = carry(out, plan.entries[i], self.run.columns,
                                  ("entry", id(seg), plan.inputs[0]), not i)  # fmt: skip
            for j, (kind, stage) in enumerate(seg.ops):
                done = kept.copies if kept is not None and j == keep_to else ()
                if kind == "frame":
                    last = i == len(plan.segments) - 1 and j == len(seg.ops) - 1
                    out, dropped = self._stage(out, frame_label(i, j, stage.fn), stage, last,
                                               i, kept, done)  # fmt: skip
                    known = None
                else:
                    output = arrow_schema(stage.schema, spark)
                    out = self._python(out, stage_label(i, j, stage.fn), stage, output, known,
                                       i)  # fmt: skip
                    known, dropped = output, False
                if done:  # the copies end here (dropped with the stage's flag, or now)
                    out, kept = out if dropped else jvm_args.drop(out, done, self.run.columns), None
            return out

        return walk(plan.entries[start:], plan.segments, out, segment, self._enter,
                    self.run.columns)  # fmt: skip

    def _entered_start(self, spark: Any) -> tuple[DataFrame | None, int]:
        """Stage rows only (a query's tail): the plan starts at their first entry, not
        building the segments before it (no rows; JVM round trips). (None, 0): at 0."""
        for k in entries_known(self.run.replays, self.plan, self.run.columns):
            rows = self._enter(self.plan.entries[k], None, spark)
            if rows is not None:
                return rows, k
        return None, 0

    def _enter(self, entry: Entry, out: DataFrame | None, spark: Any = None) -> Any:
        """``out`` with the batch's stage rows entering before ``entry`` (frame_entries;
        ``out`` None: the rows alone), each entry once: a local relation, read whole by
        the sink's job; those kept under another schema dead-lettered, named."""
        replays = self.run.replays
        table = replays.entered.get(entry.segment) if replays is not None else None
        if table is None or not table.num_rows or entry.segment in self.seen.taken:
            return out
        self.seen.taken.add(entry.segment)
        seg = self.plan.segments[entry.segment]
        self.run.columns.setdefault(("segment", id(seg)), seg)  # its id stays its own
        rows, bad = entering(out, table, self.run.columns,
                             entering_key(self.plan, entry.segment), spark)  # fmt: skip
        self.calls += reject(self.layer, bad, self.result, f"batch_id={self.result.batch_id} ")
        if rows is None:
            return out
        self.seen.entered[entry.segment] = rows_ids(table, bad)
        return rows if out is None else out.unionByName(rows)

    def _replays(self, spark: Any, streamed: bool, limit: int) -> DataFrame | None:
        """The batch's replays (the intake phase), their identity their record id, the
        ids of those the job reads observed (None: none, or FT off)."""
        from pyspark.sql import functions as F  # noqa: N812

        plan, run = self.plan, self.run
        if run.intake is None:
            return None
        self.calls += 1
        self.layer.segments.drop_batch(plan.source, plan.batch_key)
        run.streamed = streamed
        run.replays = run.intake.streamed() if streamed else run.intake.claim(limit)
        replays = run.intake.dataframe(spark, run.replays, run.reads)
        if replays is None:
            return None
        replays = replays.select(
            *plan.inputs[0].names, F.lit(None).cast("long").alias(LOC_COL, metadata=IDENTITY),
            F.col(SRC_COL).alias(POS_COL, metadata=IDENTITY))  # fmt: skip
        return self.seen.replay_ids(replays, 0)

    def _stage(self, df: DataFrame, label: str, stage: FrameStage, last: bool,
               segment: int = 0, kept: Kept | None = None,
               done: tuple[str, ...] = ()) -> tuple[DataFrame, bool]:  # fmt: skip
        """A DataFrame stage (of ``segment``), its failed rows observed (with the
        segment's input ``kept`` for them, where its output still carries it) and
        filtered out. Its identity columns are checked before they are used (its
        ``failed=``, the next Python stage, the sink: ``last``). ``done``: the segment's
        hidden copies, when they end at this stage: dropped with its flag (one plan step
        less for Spark to analyse); and whether they were (False: no flag)."""

        with gc_pause.resumed():  # the user's code
            out = stage.fn(df)
        if not hasattr(out, "sparkSession") or not hasattr(out, "columns"):
            raise ConfigError(f"{label} returned {type(out).__name__}, not a DataFrame")
        self.unchecked.append((label, out))
        if stage.failed is not None or last:
            check_identity(self.unchecked)
        flag = _flag(self.run.columns, stage, out)
        if flag is None:
            return out, False
        if kept is not None and not still_carried(out, kept):
            kept = None  # the stage dropped or recomputed a copy: its rows go to the source
        answer = _frame_answer(label, stage.errors)
        out = out.withColumn(FAILED_COL, flag)
        key = ("frame", label, id(stage))
        self.run.columns.setdefault(("stage", id(stage)), stage)  # its id stays its own
        out = self.seen.stage(out, label, answer, key, segment, kept)
        return jvm_args.drop(out, (FAILED_COL, *done), self.run.columns), True

    def _python(self, df: DataFrame, label: str, stage: BatchStage, output: pa.Schema | None,
                inputs: pa.Schema | None, segment: int | None = None) -> DataFrame:  # fmt: skip
        """A Python stage (a sink: ``output`` None) as a ``mapInArrow`` answering its
        outputs and its failed rows (ftlayer.spark.frame_tasks), observed and filtered.
        ``inputs``: its user columns, when known without asking Spark (after the source or
        a Python stage; after a DataFrame stage, None: Spark's analysis says)."""
        check_identity(self.unchecked)
        inputs = inputs if inputs is not None else _user_columns(df)
        where = len(self.plan.segments) - 1 if segment is None else segment
        budget = 0 if where and self.plan.replay_from == "source" else \
            self.plan.immediate_replays  # past a shuffle, Storm's rule retries none
        step = PythonStep(stage, label, inputs, output, stage.errors or self.plan.errors, budget,
                          reports=reports_of(df.sparkSession, self.run.columns, self.plan.source))
        self.python += 1
        key = ("step", id(stage), label, inputs, output, step.policy, step.budget)
        out = map_in_arrow(df, key, lambda run: (replace(step, run=run),
                                                 answer_type(step, IDENTITY)),
                           RunFields.of(self.plan), self.run.columns)  # fmt: skip
        return self.seen.python(out, label, where, step.reports)

    # -- running and settling ----------------------------------------------------------
    def write(self, out: DataFrame, batch_id: Any) -> Residues:
        """Call the sink with ``out`` (the identity columns dropped unless it wants them);
        the batch's residues from the observations (the sink's failure fails every record
        of the batch)."""
        seg = self.plan.segments[-1]
        user_sink = seg.sink
        assert user_sink is not None
        out = self.seen.counted(out)
        if seg.sink_lineage is not None:
            out = with_lineage(out, seg.sink_lineage, self.plan, self.layer is not None,
                               self.run.replays)  # fmt: skip
        if seg.sink_per == "dataframe":
            given = out if seg.sink_ids else \
                jvm_args.drop(out, (LOC_COL, POS_COL), self.run.columns)
            name = f"sink_dataframe {stage_name(user_sink)}"

            def write() -> None:
                user_sink(given, batch_id)
        else:  # a Python sink: its failed and unconfirmed rows are its answer
            label = stage_label(len(self.plan.segments) - 1, len(seg.ops), user_sink, True)
            sink = BatchStage(user_sink, None, pandas=seg.sink_pandas, errors=seg.sink_errors)
            answers = self._python(out, label, sink, None, None)
            name = self.seen.sink_label = label

            def write() -> None:
                answers.write.format("noop").mode("overwrite").save()
        try:
            with metrics_kept(out.sparkSession), fields_set(
                    out.sparkSession, RunFields.of(self.plan), self.python > 0), \
                    gc_pause.resumed():  # the user's code
                write()
        except Exception as e:
            text = error_text(name, e)
            log.error("DataFrame sink failed batch_id=%s: every record of the batch "
                      "replays: %s", self.result.batch_id, text)  # fmt: skip
            return self.seen.fail_everything(self.run, text)
        return self.seen.residues(self.run, name)



def _user_columns(df: DataFrame) -> pa.Schema:
    """The Arrow schema of ``df``'s columns less ftlayer's identity (Spark's analysis)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    user = StructType([f for f in df.schema.fields if f.name not in (LOC_COL, POS_COL)])
    return to_arrow_schema(user, timezone="UTC")


def _flag(cache: dict[Any, Any], stage: FrameStage, out: DataFrame) -> Column | None:
    """A DataFrame stage's ``coalesce(failed, false)`` (None: no ``failed=``), built once
    unless ``failed=`` is a function of the stage's output."""
    from pyspark.sql import functions as F  # noqa: N812

    key = ("flag", id(stage))
    if key in cache:
        return cache[key]
    failed = _column(stage.failed, out)
    if failed is None:
        return None
    flag = F.coalesce(failed, F.lit(False))
    if not (callable(stage.failed) and type(stage.failed).__name__ != "Column"):
        cache[key] = flag
    return flag


def _frame_answer(label: str, errors: Any) -> str | Callable[[], tuple[Column, Column, Column]]:
    """A DataFrame stage's failed rows' answer: not dead now, one attempt, and the error
    text -- one for all of them (``errors`` a text, or None: the stage's name), which the
    observation then need not collect, or a Column's (``errors`` a Column of the stage's
    output), built by the callable returned."""
    if errors is None or isinstance(errors, str):
        return label if errors is None else f"{label}: {errors}"
    return partial(_error_columns, label, errors)


def _error_columns(label: str, errors: Column) -> tuple[Column, Column, Column]:
    """The error text (``errors``' value, after the stage's name), not dead now, one
    attempt: a failed row's answer, as Columns."""
    from pyspark.sql import functions as F  # noqa: N812

    text = F.concat_ws(": ", F.lit(label), errors)
    return F.coalesce(text, F.lit(label)), F.lit(False), F.lit(1)


def _column(spec: Any, df: DataFrame) -> Column | None:
    from pyspark.sql import functions as F  # noqa: N812

    if spec is None:
        return None
    if isinstance(spec, str):
        return F.expr(spec)
    if callable(spec) and not type(spec).__name__ == "Column":
        return spec(df)
    return spec


def read_back(run: BatchRun) -> int:
    """The replays the batch reads back from their source (kept by reference; the first
    segment keeps those that fail again: frame_entries.keeps_until)."""
    return len(run.replays.references) if run.reads is not None and run.replays else 0


def keeping(run: BatchRun) -> tuple[int, int]:
    """The rows and bytes a stage of ``run`` keeps in a batch at most, about
    (frame_entries; none: FT off, or ``max_kept_rows=0``)."""
    config = run.plan.config
    if run.layer is None or not config.max_kept_rows:
        return (0, 0)
    return (config.max_kept_rows, kept_budget(run.spark, run.columns, config.max_kept_bytes))


def holds_no_rows(df: DataFrame) -> bool:
    """Whether ``df`` is a micro-batch (what ``foreachBatch`` hands over: its executed
    plan's RDD) of no partitions at all: no source had new data, and the replay stream
    whose batches read their claims themselves (``ftlayer-replay-offsets``) has no
    partitions. Four py4j calls, no Spark job; False when it cannot tell (another
    DataFrame: its plan has no RDD; Spark Connect)."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return False
    try:  # a LogicalRDD's RDD (a plan without one raises)
        return bool(jdf.queryExecution().logical().rdd().getNumPartitions() == 0)
    except Exception:  # an internal Spark changed: plan the fresh rows as ever
        log.debug("could not tell whether the micro-batch is empty", exc_info=True)
        return False


def fresh_rows(run: BatchRun, df: DataFrame, streamed: bool) -> tuple[DataFrame, bool]:
    """The batch's fresh rows with their identity -- a reference, a copy's batch-local id
    (the copy pass stores them first: then True), or nothing to name (FT off) -- and
    whether they are copies."""
    from pyspark.sql import functions as F  # noqa: N812

    plan = run.plan
    names = list(plan.inputs[0].names)
    copies = False
    # kept by reference, the replay stream carries no rows (the batch reads its claims
    # itself): nothing to filter out
    rows = df.filter(F.col(SRC_COL).isNull()) if streamed and run.reads is None else df
    if run.reads is not None:
        if LOC_COL not in rows.columns:
            rows = with_references(run.reads, rows)
    elif run.layer is not None:  # copies: the one Python pass, storing them
        copies = True
        copy = CopySource(plan.config, plan.source, plan.batch_key, plan.salt,
                          plan.lineage_seed)  # fmt: skip
        fields = [*plan.inputs[0], pa.field(LOC_COL, pa.int64()),
                  pa.field(POS_COL, pa.int64())]  # fmt: skip
        rows = rows.select(*names).mapInArrow(copy, spark_schema(pa.schema(fields)))
    else:  # FT off: nothing to name
        rows = rows.select(*names, F.lit(None).cast("long").alias(LOC_COL),
                           F.lit(0).cast("long").alias(POS_COL))  # fmt: skip
    cols = [*names, *identity_columns(run.columns)]
    return jvm_args.select(rows, cols, run.columns, ("fresh", tuple(names))), copies
