"""What a batch and a drain report (:class:`BatchResult`, :class:`DrainResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ftlayer.layer import FTStats
from ftlayer.spark.plan import MAX_MESSAGES

__all__ = ["BatchResult", "DrainResult", "RecordCounts", "StageCounts"]


@dataclass
class StageCounts:
    """Rows in and out of one stage of a batch, summed over its tasks. ``failed`` rows
    are replayed (``replayed``) or dead-lettered (``dead_lettered``), ``unconfirmed`` ones
    time out and replay. The stage ``source`` (plan.SOURCE_STAGE) counts rows failed before
    any stage ran."""

    rows_in: int = 0
    rows_out: int = 0
    failed: int = 0
    unconfirmed: int = 0
    bisections: int = 0
    """Extra calls of the stage's function spent isolating rows that raised."""
    seconds: float = 0.0
    """Time spent in the stage's function, summed over its tasks (bisection included;
    DataFrame stages run inside Spark's plan and report 0)."""
    replayed: int = 0
    """Failed rows of the stage queued for a replay, or replayed at once in their task
    (one per attempt)."""
    dead_lettered: int = 0
    """Failed rows of the stage that went to the dead letters (their budget spent, or an
    error no replay fixes). Each failed row is replayed or dead-lettered, once its batch
    settled: ``failed == replayed + dead_lettered`` for a stage that keeps one output
    row per input row."""
    held: int = 0
    """Rows the stage did not get because its breaker was open (ftlayer.spark.breakers):
    failed without an attempt charged, they wait in the replay queue for its probe."""

    @property
    def acked(self) -> int:
        """Input rows the stage finished with (passed on, filtered out or written): neither
        failed nor left unconfirmed. Rows replayed at once count once per attempt."""
        return self.rows_in - self.failed - self.unconfirmed

    def add(self, other: StageCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass(kw_only=True)
class RecordCounts:
    """What a task, or a whole batch, did with its records: exact counts, and the first
    MAX_MESSAGES error texts and rejected-record descriptions. ``failed`` records are
    replayed later (or dead-lettered); ``rejected`` fresh rows could not enter the pipeline
    (e.g. not msgpack-encodable, or too large): they are named in ``rejects`` and
    dead-lettered with their bytes (or repr)."""

    fresh: int = 0
    """Source records read (``acked`` of them and of the replays completed)."""
    replayed: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0
    written: int = 0
    unconfirmed: int = 0
    errors: list[str] = field(default_factory=list)
    rejects: list[str] = field(default_factory=list)

    def note(self, bucket: list[str], text: str) -> None:
        if len(bucket) < MAX_MESSAGES:
            bucket.append(text)

    def add(self, other: RecordCounts, acked: bool = True) -> None:
        """Sum ``other`` into this (``acked=False``: not its acks, e.g. those of a task
        past the source stage, whose inputs are not source records)."""
        for name in ("fresh", "replayed", "failed", "rejected", "written", "unconfirmed"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        if acked:
            self.acked += other.acked
        for text in other.errors:
            self.note(self.errors, text)
        for text in other.rejects:
            self.note(self.rejects, text)


@dataclass
class BatchResult(RecordCounts):
    """What one batch did (see RecordCounts); ``undecodable`` replays were dead-lettered
    at once with the error. ``redis_calls`` counts the Redis round trips the batch made
    (vectorized path)."""

    batch_id: Any
    immediate_replays: int = 0
    """Failed attempts of fresh rows replayed at once in the task that read them."""
    undecodable: int = 0
    entered: int = 0
    """Replays taken in as stage rows: they entered before the segment they failed in
    (ftlayer.stage_rows), the source not read again."""
    read_back: int = 0
    """Replays kept by reference, read back from their source."""
    kept_again: int = 0
    """Of those, the ones that failed again and were kept as the input of the stage they
    failed in (ftlayer.stage_rows): their next replay enters there."""
    tasks: int = 0
    elapsed_s: float = 0.0
    redis_calls: int = 0
    fold_ok: bool = True
    """False when the batch's XOR fold did not return to 0 (a task's output was lost or
    counted twice): then every record of the batch was kept pending and replays."""
    stages: dict[str, StageCounts] = field(default_factory=dict)


@dataclass
class DrainResult:
    """The end of a drain: ``drained`` when nothing is pending; otherwise ``pending``
    records remain in Redis (reported, never dropped) and will be replayed later."""

    drained: bool
    pending: int
    dead_lettered: int
    batches: int
    elapsed_s: float
    stats: FTStats | None = field(default=None, repr=False)
