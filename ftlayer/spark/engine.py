"""The batch engine: one micro-batch through its phases, the same for every pipeline.

::

    plan      ftlayer.spark.batch_plan    what every task runs (one VectorPlan a run)
    intake    ftlayer.spark.intake        the replays it runs: claimed or streamed,
                                          decoded, rejects dead-lettered, references
                                          resolved in the plan
    execute   a stage kind                the Spark job, and what it left undone as one
              (batch_scope: Python stages, Residues value (task summaries, or Spark's
               frame_run: DataFrame stages) observations)
    settle    ftlayer.spark.settle        the residues into Redis, everything else
                                          complete
    report    ftlayer.spark.report        dead-letter callbacks, the status page, logs

Invariants:

* The batch function returns only after the job finished and the batch settled, so
  Spark commits the batch's offsets only when each of its records is complete or
  persisted with a live timeout (invariant 1). A job that raises settles nothing: the
  batch's fresh rows come again with the batch, its replays time out and replay.
* While the job runs, a live driver keeps the batch's segments and replays a full
  timeout ahead (``keepalive``); a driver that dies stops, and they time out.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import redis

from ftlayer import gc_pause
from ftlayer.spark.batch_plan import lineage_seed, without_replay_columns
from ftlayer.spark.batch_run import BatchRun
from ftlayer.spark.batch_scope import VectorRun
from ftlayer.spark.breakers import Breakers
from ftlayer.spark.frame_run import FrameRun
from ftlayer.spark.intake import Intake
from ftlayer.spark.report import report
from ftlayer.spark.results import BatchResult
from ftlayer.spark.settle import Residues, Settlement
from ftlayer.spark.vector_plan import VectorPlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.config import FTConfig
    from ftlayer.layer import FTLayer
    from ftlayer.spark.pipeline import Pipeline

__all__ = ["BatchEngine", "StageKind"]

log = logging.getLogger(__name__)


class StageKind(Protocol):
    """What a stage kind is to the engine (batch_scope.VectorRun: Python stages;
    frame_run.FrameRun: DataFrame stages): it plans its part, runs the batch's Spark job
    and says what it left undone, and settles that its own way (where its rows were
    persisted). One per batch run, made of the run (``kind(run)``)."""

    calls: int
    """The Redis round trips it made itself."""

    @staticmethod
    def enters(plan: VectorPlan) -> bool:
        """Whether its batches take stage rows in where they were kept
        (ftlayer.stage_rows); where not, a stage row replays from its source."""

    @staticmethod
    def make_plan(pipeline: Pipeline, schema: Any, spark: Any, *, config: FTConfig,
                  batch_key: str, lineage_seed: int, run_again: bool) -> VectorPlan: ...

    def execute(self, df: DataFrame, pipeline: Pipeline, replay_limit: int,
                fresh: bool) -> Residues | None: ...  # fmt: skip

    def settle(self, settlement: Settlement, res: Residues) -> None: ...


CACHE_ENTRIES = 10_000
"""Entries of a BatchEngine's cache before a batch starts a new one (a pipeline run
every batch uses a few dozen to a few hundred)."""
_HISTORY = ("share", "width")
"""The first element of the cache keys that outlive a new cache (frame_entries.note_kept)."""


class BatchEngine:
    """Runs batches of pipelines on one FT layer (None: FT off). ``config``: the
    executors' (its ``redis_url`` filled in); ``replay_limit``: the most replays a batch
    claims; ``backpressure_timeout_s``: how long a batch waits for room under
    ``max_pending``. ``draining``: the batches run are a drain's (no fresh rows, no
    backpressure, every batch id counted as run before)."""

    def __init__(self, layer: FTLayer | None, config: FTConfig, replay_limit: int,
                 backpressure_timeout_s: float) -> None:  # fmt: skip
        self.layer, self.config = layer, config
        self.replay_limit, self.backpressure_timeout_s = replay_limit, backpressure_timeout_s
        self.draining = False
        self.columns: dict[Any, Any] = {}
        """The query's cache of what plans reuse (JVM arguments, columns, stages' keeping
        history), shared by every pipeline run here (:meth:`_cache`)."""
        self.cache_entries = CACHE_ENTRIES

    def run(self, pipeline: Pipeline, df: DataFrame, batch_id: Any) -> BatchResult:
        """One batch through plan, intake, execute, settle and report. Python's cyclic
        collector is held off until report (ftlayer.gc_pause): ftlayer's objects of a batch
        are freed by reference counting; a sink's function and the wait for the batch's
        Spark job run with it on."""
        started = time.monotonic()
        kind_of = FrameRun if pipeline.frames else VectorRun
        with gc_pause.paused():  # ftlayer's driver code (a sink's function: resumed)
            run = self._plan(kind_of, pipeline, df, batch_id, started)
            with gc_pause.resumed():  # a wait: the process's other threads collect
                self._backpressure(pipeline.source, batch_id)
            kind: StageKind = kind_of(run)
            with self._keepalive(run):
                res = kind.execute(df, pipeline, self.replay_limit, not self.draining)
            if res is not None and run.settlement is not None:
                if run.breakers is not None:  # when the rows it held may be claimed again
                    run.settlement.hold_until = run.breakers.after(
                        run.result.stages, run.plan.policies, run.plan.open_stages)
                log.info("batch settling batch_id=%s source=%d", batch_id, pipeline.source)
                kind.settle(run.settlement, res)
                run.settlement.count_outcomes()
            run.result.redis_calls = run.redis_calls + kind.calls
        return report(self.layer, pipeline, run.result, started)

    # -- plan ---------------------------------------------------------------------------
    def _plan(self, kind: type[FrameRun] | type[VectorRun], pipeline: Pipeline, df: DataFrame,
              batch_id: Any, started: float) -> BatchRun:  # fmt: skip
        spark = df.sparkSession
        schema = without_replay_columns(df.schema)  # the source's own columns
        plan = kind.make_plan(pipeline, schema, spark, config=self.config,
                              batch_key=str(batch_id),
                              lineage_seed=lineage_seed(df, pipeline.source, batch_id),
                              run_again=self._run_again(pipeline.source, batch_id))  # fmt: skip
        result = BatchResult(batch_id)
        breakers = None
        if self.layer is not None and plan.policies:  # it has Python stages to hold
            breakers = Breakers(self.layer, pipeline.source)
            plan = replace(plan, open_stages=breakers.read())
        run = BatchRun(plan, self.layer, result, started, pipeline.reads, spark,
                       columns=self._cache(), breakers=breakers)  # fmt: skip
        if self.layer is not None:
            run.intake = Intake(self.layer, pipeline.source, plan.inputs[0],
                                pipeline.reads is not None, result, f"batch_id={batch_id} ",
                                plan.entries if kind.enters(plan) else ())  # fmt: skip
            run.settlement = Settlement(plan, self.layer, result, started, pipeline.reads,
                                        spark)  # fmt: skip
        return run

    def _cache(self) -> dict[Any, Any]:
        """The cache a batch plans with. Its entries are keyed by the pipeline's objects
        (``id()``, each pinned while its entries live), so a job that builds its pipeline
        anew for each batch adds a few every batch; past ``cache_entries`` a batch starts
        a new cache holding only the stages' keeping history (``("share", ...)``,
        ``("width", ...)``: by value, one per stage definition). Replaced, never cleared:
        a batch of another query planning at the same time keeps the cache it began with."""
        if len(self.columns) > self.cache_entries:
            self.columns = {k: v for k, v in self.columns.items()
                            if isinstance(k, tuple) and k[0] in _HISTORY}  # fmt: skip
        return self.columns

    def _run_again(self, source: int, batch_id: Any) -> bool:
        """Whether this batch id of ``source`` began before (its rows may have been
        written): a drain's batches and FT off count as yes."""
        if self.layer is None or self.draining:
            return True
        return self.layer.segments.run_again(source, str(batch_id))

    def _backpressure(self, source: int, batch_id: Any) -> None:
        """Wait for room before a batch (``max_pending`` records in flight). Never in a
        drain: its batches only run replays, the work that frees room."""
        if self.layer is None or self.config.max_pending is None or self.draining:
            return
        if not self.layer.wait_for_capacity(source, timeout_s=self.backpressure_timeout_s):
            log.warning("backpressure timed out, running batch anyway batch_id=%s source=%d",
                        batch_id, source)  # fmt: skip

    # -- keepalive ----------------------------------------------------------------------
    @contextmanager
    def _keepalive(self, run: BatchRun) -> Iterator[None]:
        """While the block runs (the batch's plan and Spark job), a thread pushes the
        deadlines of this run's segments and replays a full timeout ahead every half
        rotation interval, so a batch longer than ``timeout_s`` is not timed out under a
        live driver. Errors are logged, never raised: a missed beat only risks a replay,
        never a loss."""
        layer, plan = self.layer, run.plan
        if layer is None:
            yield
            return
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(layer.config.rotation_interval_s / 2):
                try:
                    layer.segments.touch_batch(plan.source, plan.batch_key)
                    replays = list(run.replays.injected) if run.replays is not None else []
                    if run.streamed:  # the replay stream's open claims of this source
                        replays += layer.persistence.stream_claimed(plan.source)
                    if replays:
                        layer.reset_timeout(replays)
                except redis.RedisError as e:
                    log.warning("batch keepalive failed batch=%s error=%s", plan.batch_key, e)

        thread = threading.Thread(target=beat, name="ftlayer-batch-keepalive", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=10)
