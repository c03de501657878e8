"""The state one run of one batch shares between its phases (ftlayer.spark.engine): its
plan, its result, its intake and settlement, the replays it took in. Plain data: the
phases hold the logic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer
    from ftlayer.spark.breakers import Breakers
    from ftlayer.spark.intake import Intake, Replays
    from ftlayer.spark.results import BatchResult
    from ftlayer.spark.settle import Settlement
    from ftlayer.spark.vector_plan import VectorPlan

__all__ = ["BatchRun", "OfRun"]


@dataclass
class BatchRun:
    """One run of one batch, as its phases share it (FT off: no layer, intake or
    settlement)."""

    plan: VectorPlan
    layer: FTLayer | None
    result: BatchResult
    started: float
    reads: Any = None
    """The pipeline's ReplayableSource (None: its records are copies)."""
    spark: Any = None
    intake: Intake | None = None
    settlement: Settlement | None = None
    replays: Replays | None = None
    """What the intake took (known once the job's plan is built)."""
    streamed: bool = False
    """Its replays ride in from the replay stream (kept alive by their claims' tokens)."""
    columns: dict[Any, Any] = field(default_factory=dict)
    """Spark Columns the engine built once for every batch (a Column is an expression:
    building one is a round trip to the JVM, using it again is free)."""
    breakers: Breakers | None = None
    """Its source's stage breakers, read when it was planned (ftlayer.spark.breakers)."""

    @property
    def redis_calls(self) -> int:
        return sum(p.calls for p in (self.intake, self.settlement) if p is not None)


class OfRun:
    """What a stage kind reads of its run, by name (``self.run`` is a :class:`BatchRun`)."""

    run: BatchRun

    @property
    def plan(self) -> VectorPlan:
        return self.run.plan

    @property
    def layer(self) -> Any:
        return self.run.layer

    @property
    def result(self) -> BatchResult:
        return self.run.result
