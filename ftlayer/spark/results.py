"""What a batch and a drain report (:class:`BatchResult`, :class:`DrainResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ftlayer.layer import FTStats

__all__ = ["BatchResult", "DrainResult", "StageCounts"]


@dataclass
class StageCounts:
    """Rows in and out of one stage of a batch, summed over its tasks. ``failed`` rows
    are replayed later (or dead-lettered), ``unconfirmed`` ones time out and replay."""

    rows_in: int = 0
    rows_out: int = 0
    failed: int = 0
    unconfirmed: int = 0
    bisections: int = 0
    """Extra calls of the stage's function spent isolating rows that raised."""

    @property
    def acked(self) -> int:
        """Input rows the stage finished with (passed on, filtered out or written): neither
        failed nor left unconfirmed. Rows replayed at once count once per attempt."""
        return self.rows_in - self.failed - self.unconfirmed

    def add(self, other: StageCounts) -> None:
        self.rows_in += other.rows_in
        self.rows_out += other.rows_out
        self.failed += other.failed
        self.unconfirmed += other.unconfirmed
        self.bisections += other.bisections


@dataclass
class BatchResult:
    """What one batch did. ``failed`` records are replayed later (or dead-lettered);
    ``rejected`` fresh rows could not enter the pipeline (e.g. not msgpack-encodable, or
    too large): they are named in ``rejects`` and dead-lettered with their bytes (or
    repr); ``undecodable`` replays were dead-lettered at once with the error.
    ``redis_calls`` counts the Redis round trips the batch made (vectorized path)."""

    batch_id: Any
    fresh: int = 0
    """Source records the batch read (``acked`` of them and of its replays completed)."""
    replayed: int = 0
    immediate_replays: int = 0
    """Failed attempts of fresh rows replayed at once in the task that read them."""
    acked: int = 0
    failed: int = 0
    rejected: int = 0
    undecodable: int = 0
    written: int = 0
    unconfirmed: int = 0
    tasks: int = 0
    elapsed_s: float = 0.0
    redis_calls: int = 0
    fold_ok: bool = True
    """False when the batch's XOR fold did not return to 0 (a task's output was lost or
    counted twice): then every record of the batch was kept pending and replays."""
    errors: list[str] = field(default_factory=list)
    rejects: list[str] = field(default_factory=list)
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
