"""Error policy and stage context: what a stage may retry, what it may not, what it knows.

:class:`ErrorPolicy` (per pipeline, or per stage) says how a stage's exceptions are met:

* ``retries`` more calls, in the task, with exponential backoff and full jitter
  (ftlayer.backoff: ``random() * backoff_s * 2**n``, capped at ``max_backoff_s``)
  before the record fails -- for transient errors (a flaky HTTP call).
  A row stage retries the one record; a batch stage retries its whole call once per
  retry, *then* isolates the rows that still raise by bisection (the halves are not
  retried again: a poison row costs no backoff sleeps beyond the first call's).
* ``dead_letter_on``: exception types no retry or replay can fix (bad input). A record
  raising one is not retried and not replayed: it goes straight to the dead letters with
  the exception's text (``FailRecord`` never counts as one: it asks for a replay).

Everything else keeps the pipeline's replay budget (``max_replays``): a failed record is
replayed later under a new id, then dead-lettered. Nothing is acked to make an error go
away, whatever the policy says.

A stage that declares a parameter named ``ctx`` receives a context: a row stage a
:class:`RecordContext` (``fn(record, ctx)``), a batch stage a :class:`BatchContext`
(``fn(batch, ctx)``) whose arrays are aligned with the batch's rows.
"""

from __future__ import annotations

import inspect
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ftlayer.backoff import jittered
from ftlayer.errors import ConfigError, FailRecord

__all__ = [
    "BREAKER_MIN_ROWS",
    "DEFAULT_POLICY",
    "BatchContext",
    "ErrorPolicy",
    "RecordContext",
    "breaker_open",
    "is_dead",
    "wants_context",
]


@dataclass(frozen=True)
class ErrorPolicy:
    """See the module docstring. The default retries nothing and dead-letters nothing at
    once: every failure is replayed up to the pipeline's budget."""

    retries: int = 0
    """Calls retried in the task after the first raised, before the record fails (a batch
    stage retries its whole call, then bisects); ``FailRecord`` is never retried."""
    backoff_s: float = 0.1
    """Base of the wait between retries, in seconds: the n-th is ``random() * backoff_s *
    2**n`` (full jitter)."""
    max_backoff_s: float = 5.0
    """The longest wait between two retries, in seconds."""
    dead_letter_on: tuple[type[BaseException], ...] = ()
    """Exception types no retry or replay can fix (bad input): a record raising one (or a
    subclass) goes straight to the dead letters with its text, not retried, not replayed."""
    breaker_share: float = 0.5
    """The stage's circuit breaker (ftlayer.spark.breakers): when more than this share of
    the rows a task gave the stage in one input batch failed (and at least
    ``BREAKER_MIN_ROWS`` did), its failed rows are not replayed at once in the task -- a
    downstream that is down is not hammered -- and when it happens over a whole batch,
    the stage is not called for ``breaker_open_s``: the rows reaching it are *held*
    (``StageCounts.held``), no attempt charged, until a batch probes it. 1.0: never open."""
    breaker_open_s: float = 10.0
    """How long an opened breaker keeps the stage from being called (the rows reaching it
    are held) before a batch probes it again; twice as long each time a probe finds it
    failing still (with ``max_replays=3``, a stage broken for good dead-letters a record
    after some 70 s of probes: 10 + 20 + 40)."""
    breaker_max_open_s: float = 300.0
    """The longest the breaker stays open between two probes."""

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("retries, backoff_s and max_backoff_s must be >= 0")
        if not 0.0 <= self.breaker_share <= 1.0:
            raise ConfigError(f"breaker_share must be in 0..1, not {self.breaker_share}")
        if not 0.0 <= self.breaker_open_s <= self.breaker_max_open_s:
            raise ConfigError("breaker_open_s must be in 0..breaker_max_open_s")
        bad = [t for t in self.dead_letter_on
               if not (isinstance(t, type) and issubclass(t, BaseException))]  # fmt: skip
        if bad:
            raise ConfigError(f"dead_letter_on takes exception types, not {bad!r}")

    def fatal(self, e: BaseException) -> bool:
        """No retry or replay can fix ``e``: its record goes to the dead letters."""
        return not isinstance(e, FailRecord) and isinstance(e, self.dead_letter_on)

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, retried up to ``retries`` times with backoff. A fatal exception is
        marked (see :func:`is_dead`) and raised at once; the last one is raised as is."""
        backoff = jittered(self.backoff_s, self.max_backoff_s)
        failures = 0
        while True:
            try:
                return fn(*args)
            except Exception as e:
                if self.fatal(e):
                    _mark_dead(e)
                    raise
                if failures >= self.retries or isinstance(e, FailRecord):
                    raise
                failures += 1
                time.sleep(backoff.compute(failures))


DEFAULT_POLICY = ErrorPolicy()
BREAKER_MIN_ROWS = 10
"""A stage's breaker opens only when at least this many rows of one input batch failed in
it: a few failures in a small batch are retried at once whatever their share."""


def breaker_open(policy: ErrorPolicy, failed: int, rows: int) -> bool:
    """``failed`` of ``rows`` failing in a stage under ``policy`` open its breaker: they
    wait in the replay queue instead of being replayed at once (ErrorPolicy.breaker_share)."""
    return failed >= BREAKER_MIN_ROWS and failed > policy.breaker_share * rows


def _mark_dead(e: BaseException) -> None:
    try:
        e.ft_dead = True  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception type with __slots__
        pass


def is_dead(e: BaseException) -> bool:
    """The exception was raised by a stage for a record that must be dead-lettered now."""
    return bool(getattr(e, "ft_dead", False))


_WANTS: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def wants_context(fn: Callable[..., Any]) -> bool:
    """``fn`` declares a parameter named ``ctx`` (it then receives a stage context).
    Remembered per function object: a stage asks for every batch it runs, and
    ``inspect.signature`` is slow."""
    declared = getattr(fn, "wants_ctx", None)  # ftlayer's own stage objects say so
    if declared is not None:
        return bool(declared)
    try:
        return _WANTS[fn]
    except (KeyError, TypeError):  # TypeError: not hashable or not weakly referable
        pass
    try:
        wants = "ctx" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        wants = False
    try:
        _WANTS[fn] = wants
    except TypeError:
        pass
    return wants


@dataclass
class BatchContext:
    """What a batch stage knows about its input batch. Arrays are aligned with its rows.

    ``record_ids``: each row's source record id (uint64; the id its replays and dead
    letter are filed under). ``attempts``: each row's attempt number (1 for a record's
    first attempt; a replay counts the attempts that failed before it) -- known in the
    source segment, ``None`` after a shuffle (the shuffle carries no extra column for it).
    ``task_attempt``: Spark's attempt number of this task (0 first). ``reset_timeout()``:
    give the records of this batch a fresh deadline (a long-running stage; the driver does
    the same while it is alive, so this matters only when a stage outlives timeout_s).
    ``lineage``: each row's lineage id (int64, the same in every replay of its record:
    ftlayer.lineage) -- known in the source segment, and past a shuffle when the sink asks
    for it (``lineage=``); else ``None``. ``written_before``: per row, whether an earlier
    attempt of its record may have reached a sink (a replay, or any row of a batch Spark
    runs again) -- False means this is the record's first attempt in the first run of its
    batch (what a task attempt of its own adds, Spark's ``TaskContext`` tells); ``None``:
    not known. ``batch_id``: Spark's batch id (None: not an integer); ``run_id``: a random
    id of this run of the batch (a batch Spark runs again gets another)."""

    record_ids: np.ndarray
    attempts: np.ndarray | None
    partition: int
    task_attempt: int
    stage: int
    _reset: Callable[[], object] | None = field(default=None, repr=False)
    lineage: np.ndarray | None = None
    written_before: np.ndarray | None = None
    batch_id: int | None = None
    run_id: int = 0

    def reset_timeout(self) -> None:
        if self._reset is not None:
            self._reset()

    def take(self, rows: np.ndarray) -> BatchContext:
        """The context of the rows ``rows`` of this batch (in that order)."""
        att = None if self.attempts is None else self.attempts[rows]
        lin = None if self.lineage is None else self.lineage[rows]
        before = None if self.written_before is None else self.written_before[rows]
        return BatchContext(self.record_ids[rows], att, self.partition, self.task_attempt,
                            self.stage, self._reset, lin, before, self.batch_id,
                            self.run_id)  # fmt: skip

    def slice(self, start: int, size: int) -> BatchContext:
        return self.take(np.arange(start, start + size))

    def record(self, i: int) -> RecordContext:
        att = None if self.attempts is None else int(self.attempts[i])
        lin = None if self.lineage is None else int(self.lineage[i])
        return RecordContext(int(self.record_ids[i]), att, self.partition, self.task_attempt,
                             self.stage, self._reset, lin)  # fmt: skip


@dataclass
class RecordContext:
    """What a row stage knows about its record (see :class:`BatchContext`)."""

    record_id: int
    attempt: int | None
    partition: int
    task_attempt: int
    stage: int
    _reset: Callable[[], object] | None = field(default=None, repr=False)
    lineage: int | None = None

    def reset_timeout(self) -> None:
        if self._reset is not None:
            self._reset()
