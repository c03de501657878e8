"""Executor side of Python stages in a pipeline of DataFrame stages (ftlayer.spark.frame_run).

A Python batch stage (``map_batches``, ``map_pandas``, ``sink_batches``) placed among
DataFrame stages runs as one ``mapInArrow``: the user's function gets its batch without
ftlayer's identity columns, exactly as on the vectorized path (outcomes, bisection, error
policies), and the task answers

* its output rows, each with the identity of the input row it derives from (``parents``);
* its failed input rows (and, in a sink, its unconfirmed ones): each with its identity, its
  error, whether it goes straight to the dead letters and the attempts it used --
  reported with the count of its answer in the query's accumulator on a classic session
  (ftlayer.spark.frame_reports), or, under Spark Connect, answered as rows: null user
  columns, the identity, ``__ft_failed`` true and those three.

A fresh row that fails is first replayed at once in the task, at this stage (the source
is not read again), within the step's budget, unless the stage's breaker opened: gathered
with the task's other failed rows and replayed together (a few calls a task, not a few
per input batch), answered in a batch of their own.

Under Spark Connect the driver then observes and filters those rows like a DataFrame
stage's ``failed=``.

Invariant: every input row is accounted for by the task -- it has output rows, is a
failed row (reported, or answered), or was dropped by the stage on purpose (a filter:
complete). A task reports each of its input batches before it answers it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import msgpack
import numpy as np
import pyarrow as pa

from ftlayer.config import FTConfig
from ftlayer.ids import batch_source_ids
from ftlayer.spark.chain import HELD
from ftlayer.spark.frame_reports import report
from ftlayer.spark.identity import replay_rows
from ftlayer.spark.outcome import run_stage
from ftlayer.spark.plan import BatchStage
from ftlayer.spark.policy import BatchContext, ErrorPolicy, breaker_open
from ftlayer.spark.run_fields import RunFields, current
from ftlayer.spark.vector_plan import LOC_COL, POS_COL
from ftlayer.spark.vector_tasks import Gathered, segment_bytes
from ftlayer.spark.worker import worker_layer

__all__ = ["ATTEMPTS_COL", "DEAD_COL", "ERROR_COL", "FAILED_COL", "CopySource", "PythonStep",
           "outcome_fields"]

FAILED_COL = "__ft_failed"
ERROR_COL = "__ft_error"
DEAD_COL = "__ft_dead"
ATTEMPTS_COL = "__ft_attempts"
UNCONFIRMED = "the sink did not confirm the write"


def outcome_fields() -> list[pa.Field]:
    """The columns every answer of a Python stage carries after the user's."""
    return [pa.field(LOC_COL, pa.int64()), pa.field(POS_COL, pa.int64()),
            pa.field(FAILED_COL, pa.bool_()), pa.field(ERROR_COL, pa.string()),
            pa.field(DEAD_COL, pa.bool_()), pa.field(ATTEMPTS_COL, pa.int32())]  # fmt: skip


@dataclass(frozen=True)
class PythonStep:
    """One Python stage (or a Python sink: ``output`` None) as a ``mapInArrow`` function."""

    stage: BatchStage
    label: str
    inputs: pa.Schema
    """The user columns the stage is given (its input without ftlayer's)."""
    output: pa.Schema | None
    policy: ErrorPolicy
    budget: int = 0
    """How many times a fresh row failing here is replayed at once in its task."""
    run: RunFields | None = None
    """Its batch run's fields (None: read from the job, run_fields.current; a job that
    carries none gets the safe ones: every row written before, no batch id)."""
    reports: Any = None
    """The pipeline's accumulator of reports (ftlayer.spark.frame_reports; None: failed
    rows are answered as rows)."""

    @property
    def answer_schema(self) -> pa.Schema:
        if self.reports is not None:
            return pa.schema([*(self.output or []), *outcome_fields()[:2]])
        return pa.schema([*(self.output or []), *outcome_fields()])

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        part, attempt = (tc.partitionId(), tc.attemptNumber()) if tc else (0, 0)
        run = self.run or current()
        waiting = _Waiting()
        for b in batches:
            yield self.answer(b, run, part, attempt, waiting)
            if waiting.due():
                yield self.replayed(waiting, run)
        if waiting.rows:
            yield self.replayed(waiting, run)

    def answer(self, b: pa.RecordBatch, run: RunFields | None, partition: int,
               attempt: int, waiting: _Waiting) -> pa.RecordBatch:  # fmt: skip
        """Input batch ``b`` answered: its rows' outputs and failures, except the failed
        rows to replay at once, gathered in ``waiting`` with the task's others
        (vector_tasks._Retries says why)."""
        loc, pos = b.column(LOC_COL), b.column(POS_COL)
        user = b.select(self.inputs.names)
        ids = np.asarray(pos.fill_null(0).to_numpy(zero_copy_only=False)).view(np.uint64)
        replay = replay_rows(np.asarray(loc.is_valid()), ids)
        before = np.full(len(ids), True) if run is None or run.run_again else replay
        ctx = BatchContext(ids, None, partition, attempt, 0, None, None, before,
                           None if run is None else run.batch_id,
                           0 if run is None else run.salt)  # fmt: skip
        held = run is not None and self.label in run.open_stages  # its breaker is open
        got = _Attempts(self, user, ctx, ~replay, held, replay_now=False)
        if len(got.again):
            take = pa.array(got.again)
            rows = user.take(take)
            waiting.add((rows, ctx.take(got.again), loc.take(take), pos.take(take)), rows)
        return self._answered(got, loc, pos, run)

    def replayed(self, waiting: _Waiting, run: RunFields | None) -> pa.RecordBatch:
        """The rows waiting in ``waiting`` replayed at once, together, and answered."""
        user, ctx, loc, pos = waiting.batch()
        got = _Attempts(self, user, ctx, np.full(user.num_rows, True), tries=2)
        return self._answered(got, loc, pos, run)

    def _answered(self, got: _Attempts, loc: pa.Array, pos: pa.Array,
                  run: RunFields | None) -> pa.RecordBatch:  # fmt: skip
        """The answer of ``got`` (whose rows are ``loc``'s and ``pos``'s), its failed rows
        reported first when reports are taken (frame_reports), else answered as rows."""
        schema = self.answer_schema
        parts = []
        reported = self.reports is not None
        for out, parents in got.outputs:
            take, n = pa.array(parents), out.num_rows
            ok = [] if reported else [pa.array(np.zeros(n, bool)), pa.nulls(n, pa.string()),
                                      pa.array(np.zeros(n, bool)), pa.array(np.ones(n, np.int32))]
            parts.append(pa.RecordBatch.from_arrays(
                [*out.columns, loc.take(take), pos.take(take), *ok], schema=schema))
        rows = np.array(got.failed, np.int64)
        if reported:
            take = pa.array(rows)
            report(self.reports, run.salt if run is not None else 0, self.label,
                   sum(p.num_rows for p in parts) + len(rows), loc.take(take), pos.take(take),
                   got.errors, got.dead, got.attempts)  # fmt: skip
        elif len(rows):
            take, n = pa.array(rows), len(rows)
            user_cols = [pa.nulls(n, f.type) for f in (self.output or [])]
            parts.append(pa.RecordBatch.from_arrays(
                [*user_cols, loc.take(take), pos.take(take), pa.array(np.ones(n, bool)),
                 pa.array(got.errors, pa.string()), pa.array(got.dead, pa.bool_()),
                 pa.array(got.attempts, pa.int32())], schema=schema))  # fmt: skip
        if not parts:
            return pa.RecordBatch.from_pylist([], schema=schema)
        if len(parts) == 1:
            return parts[0]
        return pa.Table.from_batches(parts).combine_chunks().to_batches()[0]


class _Waiting(Gathered[tuple[pa.RecordBatch, BatchContext, pa.Array, pa.Array]]):
    """A task's failed rows waiting to be replayed at once, together
    (ftlayer.spark.vector_tasks.Gathered): their user columns, context and identity
    (location, position)."""

    def batch(self) -> tuple[pa.RecordBatch, BatchContext, pa.Array, pa.Array]:
        """All the rows waiting, as one batch (and none wait after)."""
        parts = self.take()
        first = parts[0][1]
        written = [c.written_before for _, c, _, _ in parts]
        ctx = BatchContext(
            np.concatenate([c.record_ids for _, c, _, _ in parts]), None, first.partition,
            first.task_attempt, first.stage, None, None,
            None if written[0] is None else np.concatenate(written),  # type: ignore[arg-type]
            first.batch_id, first.run_id)  # fmt: skip
        return (pa.concat_batches([u for u, _, _, _ in parts]), ctx,
                pa.concat_arrays([lo for _, _, lo, _ in parts]),
                pa.concat_arrays([po for _, _, _, po in parts]))  # fmt: skip


class _Attempts:
    """A step's calls over one input batch: the first, then its failed fresh rows replayed
    at once, in this task, up to the step's ``budget`` (not rows to dead-letter now, not
    claimed replays -- their budget is in Redis --, not when the stage's breaker tripped:
    most of the batch failed); none at all when its breaker is open (``held``: every row
    fails, 0 attempts charged). ``outputs``: (output batch, input row of each output row)
    per call; ``failed`` (input rows), ``errors``, ``dead``, ``attempts``: one entry per
    failed or unconfirmed row, after its last attempt. ``replay_now`` False: the first
    call only, its rows to replay at once left in ``again``; ``tries``: the attempt the
    first call is (2: rows that failed once, replayed together)."""

    def __init__(self, step: PythonStep, user: pa.RecordBatch, ctx: BatchContext,
                 retryable: np.ndarray, held: bool = False, replay_now: bool = True,
                 tries: int = 1) -> None:  # fmt: skip
        self.again = np.zeros(0, np.int64)
        self.outputs: list[tuple[pa.RecordBatch, np.ndarray]] = []
        self.failed: list[int] = []
        self.errors: list[str] = []
        self.dead: list[bool] = []
        self.attempts: list[int] = []
        if held:
            for row in range(user.num_rows):
                self._fail(row, f"{step.label}: {HELD}", False, 0)
            return
        rows = np.arange(user.num_rows)
        while True:
            res = self._call(step, user, ctx, rows, tries)
            failed = rows[res.failed]
            dead = np.isin(res.failed, res.dead)
            again = ~dead & retryable[failed]
            if tries > step.budget or (  # tripped: most failed, none replayed now
                    tries == 1 and breaker_open(step.policy, len(failed), len(rows))):
                again[:] = False
            for i, row in enumerate(failed.tolist()):
                if not again[i]:
                    self._fail(row, f"{step.label}: {res.errors[i]}", bool(dead[i]), tries)
            for row in rows[res.unconfirmed].tolist():
                self._fail(row, f"{step.label}: {UNCONFIRMED}", False, tries)
            if not again.any():
                return
            rows = np.unique(failed[again])
            tries += 1
            if not replay_now:
                self.again = rows
                return

    def _call(self, step: PythonStep, user: pa.RecordBatch, ctx: BatchContext,
              rows: np.ndarray, tries: int) -> Any:  # fmt: skip
        if tries > 1:  # a replay at once: attempt ``tries``, maybe written before
            user = user.take(pa.array(rows))
            ctx = replace(ctx.take(rows), attempts=np.full(len(rows), tries, np.int32),
                          written_before=np.full(len(rows), True))  # fmt: skip
        res = run_stage(step.stage.fn, user, step.label, schema=step.output,
                        pandas=step.stage.pandas, is_sink=step.output is None,
                        policy=step.policy, ctx=ctx)  # fmt: skip
        if res.output is not None and res.output.num_rows:
            self.outputs.append((res.output, rows[res.parents]))
        return res

    def _fail(self, row: int, error: str, dead: bool, attempts: int) -> None:
        self.failed.append(row)
        self.errors.append(error)
        self.dead.append(dead)
        self.attempts.append(attempts)


@dataclass(frozen=True)
class CopySource:
    """The one Python pass of a source that cannot be read again (copies): a task stores
    its partition's rows as one segment (a copy, ftlayer.segments) with a summary of it,
    then passes the rows on with their identity: a null location and a batch-local id
    (partition and row index) as position.

    Invariant: ids are a function of (partition, row index), so every attempt of a task
    that reads its input in the same order names the same rows; the settlement takes any
    one attempt's segment of a partition and drops the others. The rows are stored before
    any of them goes on: a row a later stage sees is in Redis."""

    config: FTConfig
    source: int
    batch_key: str
    salt: int
    lineage_seed: int
    """The seed of the rows' lineage ids (ftlayer.lineage.copy_lineage of their ids)."""

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        tc = TaskContext.get()
        partition = tc.partitionId() if tc else 0
        held = [b for b in batches if b.num_rows]
        rows = sum(b.num_rows for b in held)
        if rows:
            store = worker_layer(self.config).segments
            token = store.new_token(store.shard_of_partition(partition))
            member = store.member(self.source, self.batch_key, partition, token)
            summary = msgpack.packb({"partition": partition, "segment": member, "rows": rows})
            blob = segment_bytes(held, self.config.segment_codec,
                                 f"seed:{self.lineage_seed}".encode())  # fmt: skip
            store.put(partition, member, blob,
                      token, summary, self.salt,
                      store.batch_prefix(self.source, self.batch_key))  # fmt: skip
        ids = batch_source_ids(partition, 0, rows).view(np.int64)
        start = 0
        for b in held:
            n = b.num_rows
            yield pa.RecordBatch.from_arrays(
                [*b.columns, pa.nulls(n, pa.int64()), pa.array(ids[start:start + n])],
                names=[*b.schema.names, LOC_COL, POS_COL])  # fmt: skip
            start += n


def answer_type(step: PythonStep, identity: dict[str, str]) -> Any:
    """The Spark schema of a step's answer, its identity columns tagged with ``identity``
    (Spark keeps a field's metadata on the attribute ``mapInArrow`` outputs: no
    projection is needed to tag them)."""
    from pyspark.sql.types import StructField, StructType

    from ftlayer.spark.batch_plan import spark_schema

    fields = [StructField(f.name, f.dataType, f.nullable, identity)
              if f.name in (LOC_COL, POS_COL) else f
              for f in spark_schema(step.answer_schema).fields]  # fmt: skip
    return StructType(fields)
