"""What a batch of DataFrame stages left undone, read from Spark's observations.

Each stage with ``failed=`` (and each Python stage: ftlayer.spark.frame_tasks) is followed
by an ``Observation`` that collects the identity and error text of the rows it marks, and
counts its rows; the failed rows are then filtered out. An observation of the replays'
branch collects the ids of the replays that ran. The observations are filled by the job
the sink runs (``df.write``): no second pass over the data, no caching.

Invariants: a batch whose observations were not all filled by the sink's job (a sink that
ran no DataFrame action, a subplan Spark cut) fails -- Spark runs it again -- rather than
assume anything of its rows; a sink that raises fails every record of the batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any, cast

from ftlayer.errors import ConfigError, FTLayerError
from ftlayer.limits import DEAD_NOW
from ftlayer.spark import jvm_args
from ftlayer.spark.frame_entries import (
    FULL_SHARE,
    Kept,
    keep_size,
    kept_column,
    kept_fields,
    kept_rows,
    note_kept,
)
from ftlayer.spark.frame_reports import Reported
from ftlayer.spark.frame_tasks import ATTEMPTS_COL, DEAD_COL, ERROR_COL, FAILED_COL
from ftlayer.spark.identity import U64, is_replay
from ftlayer.spark.plan import MAX_MESSAGES, SOURCE_STAGE
from ftlayer.spark.results import StageCounts
from ftlayer.spark.settle import Failure, Residues
from ftlayer.spark.vector_plan import LOC_COL, POS_COL, SRC_COL
from ftlayer.stage_rows import StageRow

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from ftlayer.spark.engine import BatchRun

__all__ = ["Observations", "Watched", "metrics_kept"]


@dataclass
class Observations:
    """The observations of one batch run (named after its ``salt``)."""

    salt: int
    observed: list[tuple[str, Watched | Reported]] = field(default_factory=list)
    """(stage label, its watched Observation) of every stage with ``failed=``, or its
    reports (a Python stage: ftlayer.spark.frame_reports), in order, each counting the rows
    it sees (no stage is observed: ("", a count at the sink's input) among them)."""
    replays_seen: list[tuple[int, Watched]] = field(default_factory=list)
    """(entry, watched Observation) of the ids of the replays from their source the job
    read (a reference read back and not found is not among them)."""
    entered: dict[int, list[int]] = field(default_factory=dict)
    """The ids of the stage rows the job took in, by the entry they came in at (a local
    relation: read whole by a job that ran)."""
    taken: set[int] = field(default_factory=set)
    """The entries whose stage rows the plan took in (each once: its rejects named once)."""
    segment_of: dict[str, int] = field(default_factory=dict)
    """The segment of each observed stage (by label; the count at the sink's input: none,
    after every segment)."""
    keeps: dict[str, tuple[Kept, Any]] = field(default_factory=dict)
    """Stages keeping their failed rows as stage rows (frame_entries): label -> (what
    they keep, the stage's key: its share, its rows' width under ``("share"|"width",
    key)`` in ``columns``)."""
    bound: tuple[int, int] = (0, 0)
    """The rows and bytes a stage keeps at most in a batch, about (frame_entries)."""
    read_back: int = 0
    """The replays the batch reads back (the first segment keeps as many at most)."""
    plain_source: DataFrame | None = None
    """The batch's source rows without observations: read again only if the sink raised."""
    sink_label: str = ""
    """A Python sink's label (its observation counts only its failed rows)."""
    ran: dict[int, int] = field(default_factory=dict)
    """The replays the job ran: source id -> current id (once the residues are read)."""
    columns: dict[Any, Any] = field(default_factory=dict)
    """Columns built once and reused by every batch of the pipeline (a Column is an
    expression, not bound to one DataFrame): building them costs round trips to the JVM."""
    answered: dict[str, str] = field(default_factory=dict)
    """The one error text of all the failed rows of a stage (by label): none observed."""

    def python(self, out: DataFrame, label: str, segment: int, acc: Any) -> DataFrame:
        """A Python stage's answer (``out``, of ``segment``) whose tasks report what they
        left undone in ``acc`` (ftlayer.spark.frame_reports), read in its place among the
        observations; ``acc`` None (Spark Connect): its failed rows are answered as rows,
        observed and filtered out, and its outcome columns dropped."""
        if acc is None:
            out = self.stage(out, label, _python_answer, "python", segment)
            return jvm_args.drop(out, (FAILED_COL, ERROR_COL, DEAD_COL, ATTEMPTS_COL),
                                 self.columns)  # fmt: skip
        self.observed.append((label, Reported(acc, self.salt, label)))
        self.segment_of[label] = segment
        return out

    def counted(self, df: DataFrame) -> DataFrame:
        """``df`` counted by an observation of its own if no stage observed the batch
        (reports alone cannot tell that the sink's job ran: a stage over no partitions
        reports nothing either)."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        if any(isinstance(w, Watched) for _, w in self.observed):
            return df
        obs = Observation(f"ft-{self.salt:x}-count")
        self.observed.append(("", Watched(obs, ("rows",), 1)))
        if "count" not in self.columns:
            self.columns["count"] = F.count(F.lit(1)).alias("rows")
        return jvm_args.observe(df, obs, [self.columns["count"]], self.columns, "count")

    def replay_ids(self, replays: DataFrame, entry: int) -> DataFrame:
        """``replays`` (entering before segment ``entry``) with an observation of their
        ids: those the job reads ran."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        obs = Observation(f"ft-{self.salt:x}-replays-{entry}")
        self.replays_seen.append((entry, Watched(obs, ("n", "ids"), 1)))
        if "replay_ids" not in self.columns:
            ids = F.array_join(F.collect_list(F.col(POS_COL).cast("string")), ",")
            self.columns["replay_ids"] = [F.count(F.lit(1)).alias("n"), ids.alias("ids")]
        return jvm_args.observe(replays, obs, self.columns["replay_ids"], self.columns,
                                "replay_ids")  # fmt: skip

    def stage(self, out: DataFrame, label: str,
              answer: str | Callable[[], tuple[Column, Column, Column]], key: Any = None,
              segment: int = 0, kept: Kept | None = None) -> DataFrame:  # fmt: skip
        """Observe the rows ``__ft_failed`` marks (their identity, error, whether they go
        straight to the dead letters, the attempts they used) and the stage's count; leave
        the others. The flag is a column, observed, then filtered: the observation also
        keeps Spark from pushing the filter below the stage's projection (which would
        compute it twice). ``key``: the stage's columns are built once under it (the same
        in every batch); ``answer()`` builds them: the error text, whether the row goes
        straight to the dead letters, the attempts it used -- or ``answer`` is the one
        text of all its failed rows: no errors observed. ``segment``: the stage's;
        ``kept``: the stage also keeps its failed rows' segment input (frame_entries).
        The caller drops ``__ft_failed``."""
        from pyspark.sql import Observation
        from pyspark.sql import functions as F  # noqa: N812

        obs = Observation(f"ft-{self.salt:x}-{len(self.observed)}")
        share, cap = FULL_SHARE, None
        if kept is not None:  # its history: by what it keeps (its entry's fingerprint),
            # not by the stage object -- a pipeline built anew for each batch has one too
            history = ("kept", label, kept)
            self.keeps[label] = (kept, history)
            share, cap = keep_size(kept, history, self.columns, self.bound, self.read_back,
                                   out.sparkSession)  # fmt: skip
            key = (key, kept, share, cap)
        if isinstance(answer, str):  # (a set of errors: an aggregate each job pays for)
            self.answered[label] = answer
        fields = (_ONE_TEXT if isinstance(answer, str) else _STAGE_FIELDS) + kept_fields(kept, cap)
        self.observed.append((label, Watched(obs, fields, 2)))
        self.segment_of[label] = segment
        built = self.columns.get(key) if key is not None else None
        if built is None:
            built = _observed_columns(answer if isinstance(answer, str) else answer())
            if kept is not None:
                built = ([*built[0], *kept_column(kept, F.col(FAILED_COL), share, cap)],
                         built[1])  # fmt: skip
            if key is not None:
                self.columns[key] = built
        aggregates, keep = built
        return jvm_args.observe(out, obs, aggregates, self.columns, key).filter(keep)

    def residues(self, run: BatchRun, sink: str) -> Residues:
        """Read the observations (the counts, the failed rows, the replays read): the
        batch's residues. ``fresh`` counts the rows the first observation saw (a stage filtering
        rows before it makes it smaller; those rows completed)."""
        metrics = self._metrics()
        first = metrics[0][1]
        if first is None:
            raise ConfigError(
                f"{sink} ran no DataFrame action on its DataFrame, so "
                "ftlayer cannot know what it wrote: write it with df.write (or collect, "
                "toArrow, count); df.foreach/foreachPartition and df.rdd do not report "
                "to Spark's observations")  # fmt: skip
        ran, before_first = self._ran(run)
        r = run.result
        r.replayed = len(ran)
        fails: dict[tuple[int | None, int], Failure] = {}  # by identity (_residues)
        r.fresh = max(int(first["rows"]) - before_first, 0)
        twice: set[tuple[int | None, int]] = set()  # records failing more than once
        for label, m in metrics:
            if m is None:  # the sink's action skipped this stage: nothing can be assumed
                raise FTLayerError(f"{label}'s rows were not all seen by the sink's job: "
                                   "the batch fails (Spark runs it again)")  # fmt: skip
            failed = _failed_rows(m.get("failed"))
            stage = label or SOURCE_STAGE
            errors = _stage_errors(m, stage, self.answered.get(label))
            rows_kept: dict[tuple[int | None, int], StageRow] = {}
            if label in self.keeps:
                rows_kept = self._kept(label, m.get("kept") or "", len(failed),
                                       m.get("kept_width"))  # fmt: skip
            held = 0
            for loc_text, pos_text, err in failed:  # (a loop over every failed row: kept lean)
                why, pos = errors[str(err)], int(pos_text)
                held += why.attempts == 0
                ident: tuple[int | None, int] = (int(loc_text) if loc_text else None, pos)
                if ident in fails:
                    twice.add(ident)
                else:  # (a NamedTuple built whole: _replace is slow)
                    fails[ident] = Failure(why.error, why.attempts, why.stage,
                                           rows_kept.get(ident))  # fmt: skip
            rows = int(m["rows"])
            if label == self.sink_label:  # a Python sink answers its failed rows only
                rows = r.written
            if label:  # held: failed rows charged no attempt (the stage's breaker)
                r.stages.setdefault(label, StageCounts()).add(
                    StageCounts(rows, rows - len(failed), len(failed), held=held))  # fmt: skip
            r.written = rows - len(failed)
        for ident in twice:  # siblings failed (a fan-out): keeping one would lose the
            fails[ident] = fails[ident]._replace(kept=None)  # others: back to the source
        return self._residues(run, set(ran), fails)

    def _kept(self, label: str, text: str, failed: int,
              measured: str | None = None) -> dict[tuple[int | None, int], StageRow]:  # fmt: skip
        """The rows stage ``label`` kept (``text``: its observation's), by identity; what
        sizes its next batch's keeping noted (frame_entries.note_kept)."""
        kept, key = self.keeps[label]
        rows = kept_rows(text, kept)
        note_kept(kept, key, self.columns, self.bound, failed,
                  len(text) // len(rows) + 1 if rows else None, measured)  # fmt: skip
        return rows

    def _metrics(self) -> list[tuple[str, dict[str, Any] | None]]:
        """Each observed stage's metrics, in order: its observation's, or its reports'
        (read once an observation shows the job ran)."""
        filled = {i: w.metrics() for i, (_, w) in enumerate(self.observed)
                  if isinstance(w, Watched)}  # fmt: skip
        job_ran = any(m is not None for m in filled.values())
        return [(label, filled[i] if i in filled else cast(Reported, w).metrics(job_ran))
                for i, (label, w) in enumerate(self.observed)]  # fmt: skip

    def _ran(self, run: BatchRun) -> tuple[list[int], int]:
        """The source ids of the replays the job ran (read from their source, or entered
        at their stage), and how many of them the first observation counted (they
        entered before it)."""
        ran: list[int] = []
        before_first = 0
        first_segment = self.segment_of.get(self.observed[0][0], len(run.plan.segments))
        seen = [(e, watched.metrics()) for e, watched in self.replays_seen]
        for entry, ids in [*((e, [int(x) & U64 for x in (got.get("ids") or "").split(",") if x])
                             for e, got in seen if got is not None),
                           *self.entered.items()]:  # fmt: skip
            ran += ids
            before_first += len(ids) if entry <= first_segment else 0
        return ran, before_first

    def fail_everything(self, run: BatchRun, text: str) -> Residues:
        """The sink raised: every record of the batch fails with its error (the source's
        identities read again: the failure path's one extra pass)."""
        r = run.result
        for _, w in self.observed:
            if isinstance(w, Reported):
                w.drop()
        if self.plain_source is None:
            return Residues()
        ids = self.plain_source.select(LOC_COL, POS_COL).toArrow()
        loc = ids.column(LOC_COL).to_pylist()
        pos = ids.column(POS_COL).to_pylist()
        ran = {p & U64 for lo, p in zip(loc, pos, strict=True) if is_replay(lo, p)}
        if run.replays is not None:  # and the stage rows that entered later
            for table in run.replays.entered.values():
                ran |= {s & U64 for s in table.column(SRC_COL).to_pylist()}
        why = Failure(text, 1, self.sink_label or SOURCE_STAGE)
        fails = {(lo, p): why for lo, p in zip(loc, pos, strict=True) if not is_replay(lo, p)}
        r.replayed, r.fresh = len(ran), len(fails)
        fails.update(((None, s), why) for s in ran)
        r.errors.append(text)
        return self._residues(run, ran, fails)

    def _residues(self, run: BatchRun, ran: set[int],
                  fails: dict[tuple[int | None, int], Failure]) -> Residues:  # fmt: skip
        """Count the batch and make its residues: the replays that ran (``ran``, by
        source id) and the failed rows, by identity: (location, position) of a fresh row
        kept by reference, (None, id) of a replay (its source id, as a signed int64
        or not) or of a copy (its batch-local id)."""
        r = run.result
        r.failed = len(fails)
        r.acked = r.fresh + r.replayed - r.failed
        for why in islice(fails.values(), MAX_MESSAGES):
            if len(r.errors) < MAX_MESSAGES and why.error not in r.errors:
                r.errors.append(why.error)
        taken = run.replays.injected if run.replays is not None else {}
        self.ran = {s: c for s, c in taken.items() if s in ran}
        res = Residues()
        for (loc, pos), why in fails.items():
            if loc is None:  # a replay (failing again: settle.replays) or a copy
                res.failed[pos & U64] = why
            else:
                res.by_reference[(loc, pos)] = why
        return res


_STAGE_FIELDS = ("rows", "nfailed", "failed", "errors")
"""The aggregates of every stage's observation (:func:`_observed_columns`), in order: two
counts, then the failed rows' texts, their errors (none where the stage has one text for
all of them) and, keeping, ``kept``."""
_ONE_TEXT = _STAGE_FIELDS[:3]
"""The aggregates of a stage whose failed rows have one error text: no errors."""
_ONE_ERROR = "0"
"""The error id of the failed rows of a stage with one error text for all of them."""


def _served(jvm: Any, row: Any, start: int) -> list[str | None]:
    """The string fields of the JVM ``row`` from ``start`` on, read the way PySpark reads
    a collected result: served once on a local socket with a secret
    (``PythonRDD.serveIterator``). Through py4j, a reply over 8 KB waits about 40 ms for
    TCP's delayed ACK (py4j's Java side leaves Nagle's algorithm on: py4j issue #516):
    43 ms for the failed rows of 250 (16 KB), more for megabytes of kept rows; the socket
    takes a few milliseconds and the strings never cross py4j."""
    from pyspark.serializers import UTF8Deserializer
    from pyspark.util import _load_from_socket

    rest = row.toSeq().drop(start).iterator()
    info = jvm.org.apache.spark.api.python.PythonRDD.serveIterator(rest, "ftlayer-observed")
    with _load_from_socket(info, UTF8Deserializer()) as stream:
        return list(stream)


def _stage_errors(m: dict[str, Any], stage: str, one: str | None) -> dict[str, Failure]:
    """A stage's errors by id: the set its observation ``m`` collected, or the one text
    of all its failed rows (``one``: one attempt, not dead now)."""
    if one is not None:
        return {_ONE_ERROR: Failure(one, 1, stage)}
    listed = m.get("errors") or "[]"
    return {str(e["id"]): Failure(e["error"], _attempts(e), stage)
            for e in (json.loads(listed) if isinstance(listed, str) else listed)}  # fmt: skip


def _python_answer() -> tuple[Column, Column, Column]:
    """A Python stage's failed rows: the error, dead-now and attempts columns it answers."""
    from pyspark.sql import functions as F  # noqa: N812

    return F.col(ERROR_COL), F.col(DEAD_COL), F.col(ATTEMPTS_COL)


def _failed_rows(failed: Any) -> list[Any]:
    """A stage's failed rows, (location or "" / None, position, error id) each: an
    observation's text (``loc,pos,id`` joined by ``;``), or a report's list as it is."""
    if isinstance(failed, list):
        return failed
    return [x.split(",") for x in (failed or "").split(";") if x]


def _attempts(error: dict[str, Any]) -> int:
    """The attempts a failed row used (one, for a DataFrame stage), with ``DEAD_NOW`` when
    it goes straight to the dead letters."""
    n = error.get("attempts")
    n = 1 if n is None else int(n)  # 0: held (its stage's breaker), no attempt charged
    return n | DEAD_NOW if error["dead"] else n


def _observed_columns(answer: str | tuple[Column, Column, Column]
                      ) -> tuple[list[Column], Column]:  # fmt: skip
    """A stage's observation (its row count, its failed rows, their errors unless
    ``answer`` is the one text of all of them) and the filter that keeps the rows that
    did not fail. ``answer``: the error, dead-now and attempts Columns, or that text."""
    from pyspark.sql import functions as F  # noqa: N812

    # as text: each failed row "location,position,error id" joined by ";", each distinct
    # error once as JSON (py4j passes a string as it is, where a pickled row of lists
    # crosses byte by byte)
    failed = F.col(FAILED_COL)
    err_id = F.lit(_ONE_ERROR) if isinstance(answer, str) else F.xxhash64(*answer)
    row = F.concat_ws(",", F.coalesce(F.col(LOC_COL).cast("string"), F.lit("")),
                      F.col(POS_COL).cast("string"), err_id.cast("string"))  # fmt: skip
    out = [F.count(F.lit(1)).alias("rows"), F.count(F.when(failed, 1)).alias("nfailed"),
           F.array_join(F.collect_list(F.when(failed, row)), ";").alias("failed")]
    if not isinstance(answer, str):
        error, dead, attempts = answer
        out.append(F.to_json(F.collect_set(F.when(failed, F.struct(
            err_id.alias("id"), error.alias("error"), dead.alias("dead"),
            attempts.alias("attempts"))))).alias("errors"))  # fmt: skip
    return out, ~failed


_EXCLUDED = "spark.sql.adaptive.optimizer.excludedRules"
_EMPTY_RULE = "org.apache.spark.sql.execution.adaptive.AQEPropagateEmptyRelation"


@contextmanager
def metrics_kept(spark: Any) -> Iterator[None]:
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


@dataclass(frozen=True)
class Watched:
    """An ``Observation``, the names of its aggregates in order, and where its strings
    start: the fields before ``strings`` are counts, the last of them the number of
    entries the strings list (none: the strings are empty)."""

    obs: Any
    fields: tuple[str, ...]
    strings: int

    def metrics(self) -> dict[str, Any] | None:
        """The observation's metrics, or None if no action filled them (never blocks).
        Classic PySpark: the counts read through py4j, the strings (kilobytes to
        megabytes) through a local socket (:func:`_served`), only when they list
        something."""
        jo = getattr(self.obs, "_jo", None)
        if jo is not None:  # classic PySpark: get blocks until the first action ends
            if not jo.future().isCompleted():
                return None
            row = jo.getRow()
            if row.length() == 0:  # the action ran a plan without this observation
                raise FTLayerError("Spark's job for the sink did not run ftlayer's "
                                   f"observation {jo.name()} (its subplan was cut): nothing "
                                   "can be assumed of the batch; it fails, and Spark runs "
                                   "it again")  # fmt: skip
            got = {name: row.get(i) for i, name in enumerate(self.fields[: self.strings])}
            texts = self.fields[self.strings :]
            if texts and got[self.fields[self.strings - 1]]:
                got.update(zip(texts, _served(self.obs._jvm, row, self.strings), strict=True))
            return got
        got = self.obs.get  # Spark Connect: empty until an action's result carried them
        return dict(got) if got else None
