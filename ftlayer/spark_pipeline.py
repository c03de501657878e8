"""The pieces of :mod:`ftlayer.spark` a user holds: the :class:`Pipeline` builder and the
result objects of a batch and of a drain. See :mod:`ftlayer.spark` for the invariants."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from ftlayer.errors import ConfigError
from ftlayer.layer import FTStats
from ftlayer.spark_tasks import UNCONFIRMED, Op, Segment, Unconfirmed
from partitioners import HashPartitioner

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.spark import FaultTolerance

__all__ = ["UNCONFIRMED", "BatchResult", "DrainResult", "OnError", "Pipeline", "Unconfirmed"]

OnError = Literal["fail_record", "fail_batch"]


@dataclass
class BatchResult:
    """What one batch did. ``failed`` records are replayed later (or dead-lettered);
    ``rejected`` fresh rows could not enter the FT layer (e.g. not msgpack-encodable) and
    are named in ``rejects``; ``undecodable`` replays were failed again with the error."""

    batch_id: Any
    fresh: int = 0
    replayed: int = 0
    acked: int = 0
    failed: int = 0
    rejected: int = 0
    undecodable: int = 0
    written: int = 0
    unconfirmed: int = 0
    tasks: int = 0
    elapsed_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    rejects: list[str] = field(default_factory=list)


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


@dataclass(frozen=True)
class Pipeline:
    """A per-record pipeline for ``foreachBatch``: source stage, stages, optional keyed
    shuffles, sink. Immutable: each builder method returns a new Pipeline. Call it as
    ``pipeline(df, batch_id)`` (it *is* a foreachBatch function).

    Replay placement: ``key`` columns give each record its hash code (Spark's
    ``hash(key)``, in the JVM). With ``partitions=n`` the source stage is keyed: fresh rows
    are placed by ``df.repartition(n, *key)`` and replays by
    ``HashPartitioner(n).select(hash_code)`` -- the same partition. Without it, replays
    return to their original partition (modulo the batch's partition count). After a
    ``partition_by(cols, n)``, fresh and replayed records alike are placed by the
    ``partitioners`` mirror of ``repartition(n, *cols)`` (types from the input schema, or
    ``types=``), so every record of a key meets in the partition Spark assigns that key.
    """

    ft: FaultTolerance
    source: int = 0
    key: tuple[str, ...] = ()
    partitions: int | None = None
    on_error: OnError = "fail_record"
    segments: tuple[Segment, ...] = (Segment(()),)
    sunk: bool = False

    def _add(self, op: Op) -> Pipeline:
        self._open()
        last = self.segments[-1]
        return replace(self, segments=(*self.segments[:-1], replace(last, ops=(*last.ops, op))))

    def _open(self) -> None:
        if self.sunk:
            raise ConfigError("the pipeline already ends in a sink")

    def map(self, fn: Callable[[Any], Any]) -> Pipeline:
        """One output per record (acked when ``fn`` returns, via its outputs' fate)."""
        return self._add(("map", fn))

    def flat_map(self, fn: Callable[[Any], Iterable[Any]]) -> Pipeline:
        """Zero or more outputs per record; a record with none is complete."""
        return self._add(("flat_map", fn))

    def filter(self, fn: Callable[[Any], Any]) -> Pipeline:
        """Keep records where ``fn`` is true; dropped records are acked (complete)."""
        return self._add(("filter", fn))

    def partition_by(
        self, cols: Sequence[str] | str, n: int, types: Sequence[str] | None = None
    ) -> Pipeline:
        """Shuffle to ``n`` partitions by ``cols`` exactly as ``df.repartition(n, *cols)``
        would place them. Column types default to the input schema's (inferred from the
        values when a column is not in it). A record whose key cannot be hashed fails."""
        self._open()
        cols = (cols,) if isinstance(cols, str) else tuple(cols)
        if not cols or n < 1:
            raise ConfigError("partition_by needs at least one column and n >= 1")
        if types is not None:
            HashPartitioner(n, list(types))  # validate now, on the driver
        last = replace(
            self.segments[-1],
            shuffle_cols=cols,
            shuffle_n=n,
            shuffle_types=None if types is None else tuple(types),
        )
        return replace(self, segments=(*self.segments[:-1], last, Segment(())))

    def sink(
        self, fn: Callable[[Any], Any], per: Literal["record", "partition"] = "record"
    ) -> Pipeline:
        """The last stage. ``per="record"``: ``fn(record)``; ``per="partition"``:
        ``fn(list_of_records)`` once per task. Records are acked after ``fn`` returns; if
        it raises, the records it was given fail (and are replayed); if it returns an
        :class:`Unconfirmed`, those records stay pending until they time out."""
        self._open()
        if per not in ("record", "partition"):
            raise ConfigError(f"per must be 'record' or 'partition', not {per!r}")
        last = replace(self.segments[-1], sink=fn, sink_per=per)
        return replace(self, segments=(*self.segments[:-1], last), sunk=True)

    def __call__(self, df: DataFrame, batch_id: Any) -> None:
        self.ft.run_batch(self, df, batch_id)
