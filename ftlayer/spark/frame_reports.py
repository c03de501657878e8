"""What Python stages among DataFrame stages left undone, reported by their tasks.

On a classic Spark session a Python stage's task (ftlayer.spark.frame_tasks) answers only
the rows that go on, and reports the rest -- its count, its failed (and, in a sink,
unconfirmed) rows' identity, error, whether they go straight to the dead letters and the
attempts they used -- in a Spark accumulator made once per pipeline (:func:`reports_of`).
Spark sends a task's accumulator updates with its result and merges them on the driver
before the job ends. A Python stage then needs no ``Observation`` (one per stage per job,
each read by several round trips, and each a pass over every row of the stage) and no
filter: its failures never leave the Python worker as rows.

The driver reads a batch's reports (:class:`Reported`) in the shape of the stage's
observation (ftlayer.spark.frame_observations), so the residues are made the same way.
Under Spark Connect (no accumulators) the stage answers its failed rows and is observed.

Invariants:

* Reports are keyed by the batch run's salt and the stage's label, one per task attempt,
  in an accumulator of the pipeline's own (its batches run one at a time): a run reads
  its own and drops them (read, or unread when its sink raised). A task whose job does not
  carry the run's fields (a sink that runs its action from a thread of its own: Spark's
  local properties do not reach it) reports under salt 0, which the running batch reads
  too: its failed rows replay, never acked unseen. Spark merges a task's update on the
  driver before it counts the task done, so a job that ended has all its reports in.
* A failed row is reported by every attempt that failed it, and reported rows are
  *unioned* over the attempts of a partition (Spark merges the updates of a re-run
  shuffle-map task again): a row one attempt failed is failed, even if another wrote it
  -- it replays (at least once), never lost. An identity failed in two partitions is two
  rows (children of one record share its identity). Counts take one attempt per
  partition (the last) of the first Spark stage that ran the Python stage (a sink that
  runs two actions runs it twice).
* A stage with no report at all ran over no partitions -- if the batch's job ran, which
  an observation of the same job tells (its sink's count); otherwise nothing can be
  assumed (None, as an unfilled observation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from pyspark.accumulators import AccumulatorParam

if TYPE_CHECKING:
    from pyspark.accumulators import Accumulator

__all__ = ["Reported", "TaskReport", "report", "reports_of"]

_KEY = "frame_reports"


class TaskReport(NamedTuple):
    """One task attempt's report of one stage. ``loc`` holds ``NO_LOC`` where a row has
    no location (a copy, a replay); ``err`` indexes ``errors``: (text, dead, attempts)."""

    stage: int
    partition: int
    attempt: int
    """Spark's task attempt id (unique in the application: the last one counts)."""
    rows: int
    """The rows the stage answered for one input batch of the task: those that went on,
    and those failed here (a task reports once per input batch)."""
    loc: np.ndarray
    pos: np.ndarray
    err: np.ndarray
    errors: list[tuple[str, bool, int]]


NO_LOC = np.iinfo(np.int64).min
"""``loc`` of a row without a location (a null ``__ft_loc``)."""


class _Reports(AccumulatorParam):
    """A dict (salt, label) -> list of TaskReport; updates are appended, never replaced."""

    def zero(self, value: Any) -> dict[tuple[int, str], list[TaskReport]]:
        return {}

    def addInPlace(self, a: Any, b: Any) -> Any:  # noqa: N802 (Spark's name)
        for key, reports in b.items():
            a.setdefault(key, []).extend(reports)
        return a


def reports_of(spark: Any, cache: dict[Any, Any], source: int) -> Accumulator[Any] | None:
    """The accumulator of the reports of ``source``'s pipeline, made once (kept in
    ``cache``); None under Spark Connect, which has no accumulators."""
    from ftlayer.spark.preflight import is_connect

    if is_connect(spark):
        return None
    key = (_KEY, source)
    if key not in cache:
        cache[key] = spark.sparkContext.accumulator({}, _Reports())
    return cache[key]


def report(acc: Accumulator[Any], salt: int, label: str, rows: int, loc: Any, pos: Any,
           errors: list[str], dead: list[bool], attempts: list[int]) -> None:  # fmt: skip
    """In a task: report ``rows`` answered and the failed rows (``loc``/``pos``: Arrow
    arrays of their identity, one entry per failed row in ``errors``, ``dead``,
    ``attempts``)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    stage, part, attempt = ((tc.stageId(), tc.partitionId(), tc.taskAttemptId())
                            if tc is not None else (0, 0, 0))  # fmt: skip
    distinct: dict[tuple[str, bool, int], int] = {}
    err = np.array([distinct.setdefault((e, bool(d), int(a)), len(distinct))
                    for e, d, a in zip(errors, dead, attempts, strict=True)], np.int32)  # fmt: skip
    loc_np = np.asarray(loc.fill_null(NO_LOC).to_numpy(zero_copy_only=False), np.int64)
    pos_np = np.asarray(pos.fill_null(0).to_numpy(zero_copy_only=False), np.int64)
    acc.add({(salt, label): [TaskReport(stage, part, attempt, rows, loc_np, pos_np, err,
                                        list(distinct))]})  # fmt: skip


@dataclass(frozen=True)
class Reported:
    """A Python stage's reports in one batch run, read as its observation would be."""

    acc: Any
    salt: int
    label: str

    def metrics(self, ran: bool) -> dict[str, Any] | None:
        """The stage's ``rows``, ``nfailed``, ``failed`` (``[(loc or None, pos, error
        id)]``) and ``errors`` (``[{id, error, dead, attempts}]``); None when the batch's
        job did not run (``ran``: an observation of it was filled). Drops the reports."""
        if not ran:
            return None
        value = self.acc.value  # and those of the run's jobs that did not carry its salt
        reports = [*value.pop((self.salt, self.label), []), *value.pop((0, self.label), [])]
        first = min((r.stage for r in reports), default=0)  # a sink's first job that ran it
        last: dict[int, int] = {}  # partition -> its last attempt there
        for r in reports:
            if r.stage == first:
                last[r.partition] = max(r.attempt, last.get(r.partition, -1))
        errors: dict[int, dict[str, Any]] = {}
        # per partition, each failed identity with the errors of the attempt that failed
        # it most often (children of one record share its identity): attempts unioned
        most: dict[int, dict[tuple[int | None, int], list[int]]] = {}
        for att in _attempts(reports):
            got: dict[tuple[int | None, int], list[int]] = {}
            for r in att:
                ids = [hash(e) for e in r.errors]
                for (text, dead, n), i in zip(r.errors, ids, strict=True):
                    errors.setdefault(i, {"id": i, "error": text, "dead": dead, "attempts": n})
                for lo, po, e in zip(r.loc.tolist(), r.pos.tolist(), r.err.tolist(),
                                     strict=True):  # fmt: skip
                    got.setdefault((None if lo == NO_LOC else lo, po), []).append(ids[e])
            part = most.setdefault(att[0].partition, {})
            for ident, errs in got.items():
                if len(errs) > len(part.get(ident, ())):
                    part[ident] = errs
        failed = [(*ident, e) for part in most.values() for ident, errs in part.items()
                  for e in errs]  # fmt: skip
        rows = sum(r.rows for r in reports if r.stage == first and r.attempt == last[r.partition])
        return {"rows": rows, "nfailed": len(failed),
                "failed": failed, "errors": list(errors.values())}

    def drop(self) -> None:
        """Drop the run's reports unread (its sink raised: every record replays)."""
        self.acc.value.pop((self.salt, self.label), None)
        self.acc.value.pop((0, self.label), None)


def _attempts(reports: list[TaskReport]) -> list[list[TaskReport]]:
    """``reports`` grouped by task attempt (an attempt reports once per input batch)."""
    by: dict[int, list[TaskReport]] = {}
    for r in reports:
        by.setdefault(r.attempt, []).append(r)
    return list(by.values())
