"""The execute phase of Python stages (batch stages, and row stages compiled to them):
the batch as DataFrame operations, its residues read from the task summaries.

The plan is only DataFrame API calls: ``mapInArrow`` per segment and Spark's own
``repartition(n, *cols)`` for every keyed shuffle, so replays land where Spark places
their key, no record is pickled, and the same code runs under Spark Connect. The tasks
(ftlayer.spark.vector_tasks) persist their fresh rows as segments and fold what crossed
their edges; the last stage's tasks answer their summaries as rows.

Residues (after every task of the batch finished, before the batch function returns):

* the summaries of the attempts whose rows were consumed are gathered (the last stage's
  come back as its output rows; earlier stages' through their tokens, from Redis);
* their folds must sum to 0 (mod 2**64: every row sent through a shuffle was received
  once, see ftlayer.spark.vector_tasks). Then every record of the batch is complete
  except the residues the tasks reported; if not, ``fold_ok`` is False and the settle
  phase keeps every record of the batch pending (they replay: at least once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ftlayer import gc_pause
from ftlayer.connection import is_cluster
from ftlayer.errors import ConfigError
from ftlayer.spark import jvm_args
from ftlayer.spark.batch_plan import arrow_schema, plan_batch, spark_schema, with_replay_columns
from ftlayer.spark.batch_run import BatchRun, OfRun
from ftlayer.spark.entries import Entry, walk
from ftlayer.spark.intake import reject
from ftlayer.spark.row_stages import compile_rows
from ftlayer.spark.run_fields import RunFields, fields_set, map_in_arrow
from ftlayer.spark.settle import Residues, Settlement
from ftlayer.spark.task_summaries import count, failures, keys_to_ids
from ftlayer.spark.vector_entries import Entering, kept_rows
from ftlayer.spark.vector_plan import (
    LOC_COL,
    REF_COLS,
    REPLAY_COLS,
    SRC_COL,
    SUMMARY_COL,
    VectorPlan,
)
from ftlayer.spark.vector_tasks import run_vector_task
from ftlayer.wire import BatchSummary

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.config import FTConfig
    from ftlayer.spark.pipeline import Pipeline

__all__ = ["VectorRun"]

log = logging.getLogger(__name__)


@dataclass
class VectorRun(OfRun):
    """The execute phase of one run of a batch of Python stages."""

    run: BatchRun
    injected: dict[int, int] = field(default_factory=dict)
    """The replays the counted source tasks ran: source id -> current id."""
    replay_keys: dict[int, list[int]] = field(default_factory=dict)  # record key -> srcs
    calls: int = 0
    summaries: list[BatchSummary] = field(default_factory=list)
    entering: Entering = field(default_factory=Entering)
    """The stage rows this run put into its plan (ftlayer.spark.vector_entries)."""
    """The task summaries that counted (once the job ended)."""

    # -- the stage kind (ftlayer.spark.engine.StageKind) ----------------------------------
    @staticmethod
    def enters(plan: VectorPlan) -> bool:
        """Stage rows enter where they were kept when this pipeline keeps them
        (VectorPlan.keeps); otherwise they replay from their source."""
        return plan.keeps

    @staticmethod
    def make_plan(pipeline: Pipeline, schema: Any, spark: Any, *, config: FTConfig,
                  batch_key: str, lineage_seed: int, run_again: bool) -> VectorPlan:  # fmt: skip
        """The batch's plan: its batch stages (row stages compiled to batch stages)."""
        segments = pipeline.segments
        if pipeline.record_key is not None and not pipeline.vectorized:
            raise ConfigError("record_key takes batch stages (map_batches, map_pandas)")
        if not pipeline.vectorized:
            segments = compile_rows(segments, schema, pipeline.on_error,
                                    lambda ddl: arrow_schema(ddl, spark),
                                    pipeline.errors)  # fmt: skip
        plan = plan_batch(segments, schema, spark, config=config, source=pipeline.source,
                          batch_key=batch_key, on_error=pipeline.on_error,
                          immediate_replays=pipeline.immediate_replays, errors=pipeline.errors,
                          record_key=pipeline.record_key, lineage_seed=lineage_seed,
                          run_again=run_again)  # fmt: skip
        keeps = (pipeline.reads is not None and pipeline.replay_from == "stage"
                 and pipeline.record_key is None and config.max_kept_rows > 0)  # fmt: skip
        return replace(plan, replay_from=pipeline.replay_from, keeps=keeps)

    def execute(self, df: DataFrame, pipeline: Pipeline, replay_limit: int,
                fresh: bool) -> Residues | None:  # fmt: skip
        """Run the batch's job; its residues (None: FT off)."""
        out = self.dataframe(df, pipeline, replay_limit)
        with fields_set(df.sparkSession, RunFields.of(self.plan)), gc_pause.resumed():
            finals = [row[0] for row in out.collect()]  # (Spark's job: a wait, collector on)
        got = self.residues(finals)
        if got is None:
            return None
        self.summaries, res = got
        return res

    def settle(self, settlement: Settlement, res: Residues) -> None:
        """The segments the counted tasks stored, then the replays they ran."""
        settlement.segments(self.summaries, res)
        refs = self.run.replays.references if self.run.replays is not None else {}
        settlement.replays(self.injected, refs, res)

    # -- building the DataFrame ------------------------------------------------------------
    def dataframe(self, df: DataFrame, pipeline: Pipeline, replay_limit: int) -> DataFrame:
        """The batch's plan: fresh rows of ``df`` (with their references, if it carries
        them) and its replays (riding in ``df`` from the replay stream, or taken in now),
        those kept by reference read back from the source."""
        plan, run = self.plan, self.run
        names = plan.inputs[0].names
        ft = plan.config.enabled
        streamed = SRC_COL in df.columns  # the replay stream's rows ride in df
        refs = REF_COLS if ft and LOC_COL in df.columns else ()
        source_df = df if df.columns == names else df.select(*names, *refs)
        if run.intake is not None:
            self.calls += 1 if not is_cluster(self.layer.client) else len(self.layer.keyspace)
            self.layer.segments.drop_batch(plan.source, plan.batch_key)
            run.streamed = streamed  # kept alive by their claims' tokens
            if streamed and run.reads is None:
                source_df = df.select(*names, *refs, *REPLAY_COLS)
            else:
                if streamed:  # by reference: the replays of the batch's open claims, read
                    # back in the plan (the replay stream carries no rows kept by
                    # reference: source_df is df's own). Not from df: every action on a
                    # micro-batch's DataFrame computes it again; one, the job, is all.
                    run.replays = run.intake.streamed()
                else:
                    run.replays = run.intake.claim(replay_limit)
                replays = run.intake.dataframe(df.sparkSession, run.replays, run.reads)
                if replays is not None:
                    source_df = with_replay_columns(source_df).unionByName(
                        replays, allowMissingColumns=True)  # fmt: skip
        if pipeline.key and pipeline.partitions:
            source_df = jvm_args.repartition(source_df, pipeline.partitions, pipeline.key,
                                             self.run.columns)  # fmt: skip
        # what a segment's function is, once per query: the pipeline (kept: its id stays
        # its own) and the schemas (the rest of the plan is the pipeline's)
        self.run.columns.setdefault(("pipeline", id(pipeline)), pipeline)
        query, key = plan.query_part(), ("segment", id(pipeline), plan.inputs, plan.outputs)

        def segment(i: int, df: DataFrame) -> DataFrame:
            return map_in_arrow(df, (*key, i), lambda run: (
                partial(run_vector_task, query.for_run(run), i), self._out_schema(i)),
                RunFields.of(plan), self.run.columns)  # fmt: skip

        return walk(plan.entries, plan.segments, source_df, segment, self._enter,
                    self.run.columns)  # fmt: skip

    def _enter(self, entry: Entry, out: DataFrame) -> DataFrame:
        """``out`` with the batch's stage rows that enter before segment ``entry``
        (ftlayer.spark.vector_entries); those that do not decode dead-lettered, named."""
        replays = self.run.replays
        table = replays.entered.get(entry.segment) if replays is not None else None
        if table is None or not table.num_rows:
            return out
        out, bad = self.entering.enter(self.plan, entry, table, out)
        self.calls += reject(self.layer, bad, self.result, f"batch_id={self.result.batch_id} ")
        return out

    def _out_schema(self, i: int) -> Any:
        plan = self.plan
        if i == len(plan.segments) - 1:
            return spark_schema(pa.schema([pa.field(SUMMARY_COL, pa.binary())]))
        if plan.config.enabled:
            return spark_schema(plan.id_schemas[i])
        return spark_schema(plan.inputs[i + 1])

    # -- residues ----------------------------------------------------------------------
    def residues(self, finals: list[bytes]) -> tuple[list[BatchSummary], Residues] | None:
        """The batch's job ended (``finals``: the last stage's summaries): the counted
        summaries and the batch's residues (None: FT off, nothing to settle)."""
        summaries = [BatchSummary.decode(f) for f in finals]
        ok = self._gather(summaries)
        self._ran_replays(summaries)
        count(self.result, summaries)
        if self.layer is None:
            return None
        fold = (sum(s.fold for s in summaries) + self.entering.fold) % (1 << 64)
        if fold != 0 or not ok:
            self.result.fold_ok = False
            log.error(
                "batch fold is not 0 batch_id=%s fold=%016x consistent=%s: keeping every "
                "record of the batch pending (they replay)", self.result.batch_id, fold, ok,
            )  # fmt: skip
        keyed = bool(self.plan.record_key)
        failed, unconfirmed = failures([s for s in summaries if not keyed or s.stage == 0])
        for src, row in kept_rows(summaries, self.plan).items():
            if src in failed:  # stored as its segment's input (settle adds its reference)
                failed[src] = failed[src]._replace(kept=row)
        if keyed:  # past a shuffle, residues are record keys
            assert self.plan.record_key and self.run.settlement is not None
            by_key = failures([s for s in summaries if s.stage > 0])
            if not keys_to_ids(summaries, self.plan.record_key, self.replay_keys,
                               self.run.settlement.segment, *by_key, failed, unconfirmed):
                log.error("record keys name no row batch_id=%s: keeping the batch's records "
                          "pending", self.result.batch_id)  # fmt: skip
                self.result.fold_ok = False  # a key naming no row: keep every record pending
        if self.result.fold_ok:  # source records this batch completed
            done = self.result.fresh + self.result.replayed - len(failed) - len(unconfirmed)
            self.result.acked = max(done, 0)
        self.calls += sum(1 for s in summaries
                          if s.stage < len(self.plan.segments) - 1 or s.segment)  # fmt: skip
        return summaries, Residues(failed, unconfirmed)

    def _gather(self, summaries: list[BatchSummary]) -> bool:
        """Fetch upstream summaries by token, stage by stage. False when one is missing
        or two attempts of one task both counted."""
        ok = True
        frontier = [t for s in summaries for t in s.upstream]
        while frontier and self.layer is not None:
            got = self.layer.segments.summaries(frontier)
            self.calls += len({self.layer.segments.token_shard(t) for t in frontier})
            frontier = []
            for token, raw in got.items():
                if raw is None:
                    log.error("task summary missing token=%x", token)
                    ok = False
                    continue
                s = BatchSummary.decode(raw)
                summaries.append(s)
                frontier.extend(s.upstream)
        keys = [s.key for s in summaries]
        if len(set(keys)) != len(keys):
            log.error("two attempts of one task counted in batch_id=%s", self.result.batch_id)
            ok = False
        return ok

    def _ran_replays(self, summaries: list[BatchSummary]) -> None:
        """The replays this batch ran, as the source tasks that counted report them
        (claimed by this run, or read from the replay stream): settled below."""
        self.injected, self.replay_keys = {}, {}
        entered = self.entering.ran(summaries)  # stage rows that entered past a shuffle
        self.injected.update(entered)
        self.result.replayed += len(entered)
        for s in summaries:
            if s.stage or not len(s.rep_src):
                continue
            srcs = s.rep_src.tolist()
            self.injected.update(zip(srcs, s.rep_cur.tolist(), strict=True))
            if self.plan.record_key:
                for k, src in zip(s.rep_key.tolist(), srcs, strict=True):
                    if k < 1 << 63:  # a null or negative key was dead-lettered at the source
                        self.replay_keys.setdefault(k, []).append(src)
