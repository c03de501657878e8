"""The plan of a pipeline, as its tasks run it: segments of chained stages, each ending in
a keyed shuffle or the sink. Plain frozen data and user functions: pickled to executors.

Row stages (``map``/``flat_map``/``filter``) take one record; batch stages take one Arrow
record batch (or a pandas DataFrame) and may answer per-row outcomes (``Outcome``).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from ftlayer.errors import ConfigError, FailRecord
from ftlayer.history import SOURCE_STAGE
from ftlayer.spark.policy import DEFAULT_POLICY, ErrorPolicy, RecordContext, wants_context

__all__ = [
    "MAX_MESSAGES",
    "SOURCE_STAGE",
    "UNCONFIRMED",
    "BatchStage",
    "FrameStage",
    "Op",
    "RowFn",
    "Segment",
    "SinkPer",
    "Unconfirmed",
    "apply_ops",
    "error_text",
    "stage_name",
]

MAX_MESSAGES = 20
"""Error texts and rejected-record descriptions a task reports back (counts are exact)."""
_ERROR_CHARS = 2000

SinkPer = Literal["record", "partition", "batch", "dataframe"]


@dataclass(frozen=True)
class BatchStage:
    """A vectorized stage: ``fn(batch) -> batch | Outcome`` with output ``schema`` (a DDL
    string or StructType). ``pandas=True``: ``fn`` takes and returns pandas DataFrames."""

    fn: Callable[..., Any]
    schema: Any
    pandas: bool = False
    errors: ErrorPolicy | None = None
    """The stage's own error policy (None: the pipeline's)."""


@dataclass(frozen=True)
class FrameStage:
    """A DataFrame stage: ``fn(DataFrame) -> DataFrame``, ordinary Spark run in the JVM.
    ``failed``: a boolean Column of fn's output (a Column, an SQL expression, or a
    function of the output DataFrame giving one) marking rows that fail; ``errors``:
    their error text (a Column of fn's output, or one text for all)."""

    fn: Callable[..., Any]
    failed: Any = None
    errors: Any = None

    @property
    def __name__(self) -> str:
        return stage_name(self.fn)


@dataclass(frozen=True)
class RowFn:
    """A row stage's function with its own error policy (None: the pipeline's);
    ``ctx``: it declares a ``ctx`` parameter (decided once, on the driver)."""

    fn: Callable[..., Any]
    errors: ErrorPolicy | None = None
    ctx: bool = False

    @classmethod
    def of(cls, fn: Callable[..., Any], errors: ErrorPolicy | None = None) -> RowFn:
        if not callable(fn):
            raise ConfigError(f"a stage takes a function, not {fn!r}")
        return cls(fn, errors, wants_context(fn))

    @property
    def __name__(self) -> str:
        return stage_name(self.fn)

    def __call__(self, x: Any, ctx: RecordContext | None = None,
                 policy: ErrorPolicy = DEFAULT_POLICY) -> Any:  # fmt: skip
        """``fn(x)`` (``fn(x, ctx)`` when it wants one), retried as its policy says."""
        pol = self.errors or policy
        if self.ctx:
            return pol.call(self.fn, x, ctx)
        return pol.call(self.fn, x)


Op = tuple[str, Any]
"""A stage: ("map" | "flat_map" | "filter", RowFn), ("batches", BatchStage) or
("frame", FrameStage)."""


@dataclass(frozen=True)
class Segment:
    """Chained stages, then an exit: a ``partition_by`` shuffle or the sink."""

    ops: tuple[Op, ...]
    shuffle_cols: tuple[str, ...] = ()
    shuffle_n: int = 0
    shuffle_types: tuple[str, ...] | None = None
    sink: Callable[..., Any] | None = None
    sink_per: SinkPer = "record"
    sink_pandas: bool = False
    sink_errors: ErrorPolicy | None = None
    sink_ids: bool = False
    """A DataFrame sink is given ftlayer's identity columns too."""
    sink_lineage: str | None = None
    """The column the sink is given each row's lineage id in (ftlayer.lineage; None:
    not given)."""

    @property
    def vectorized(self) -> bool:
        return self.sink_per == "batch" or any(kind == "batches" for kind, _ in self.ops)

    @property
    def frames(self) -> bool:
        """It holds DataFrame stages or ends in a DataFrame sink."""
        return self.sink_per == "dataframe" or any(kind == "frame" for kind, _ in self.ops)


class Unconfirmed:
    """A sink's answer that some writes were not confirmed (an async sink that never
    acknowledged them). Their records stay pending -- neither acked nor failed -- so they
    time out and are replayed, like records lost in flight. A per-record sink returns
    ``UNCONFIRMED``; a per-partition sink returns ``Unconfirmed(positions)`` with the
    positions, in the list it was given, of the records it could not confirm."""

    __slots__ = ("positions",)

    def __init__(self, positions: Iterable[int] = ()) -> None:
        self.positions = frozenset(positions)

    def __repr__(self) -> str:
        return f"Unconfirmed({sorted(self.positions)})"


UNCONFIRMED = Unconfirmed()


def error_text(where: str, e: BaseException) -> str:
    """One line naming the stage, the exception and where it was raised."""
    if isinstance(e, FailRecord):
        return f"{where}: FailRecord: {e}"
    tb = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    at = f" (at {tb[0].filename}:{tb[0].lineno})" if tb else ""
    return f"{where}: {type(e).__name__}: {e}{at}"[:_ERROR_CHARS]


def stage_name(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def apply_ops(
    ops: tuple[Op, ...],
    record: Any,
    policy: ErrorPolicy = DEFAULT_POLICY,
    ctx: RecordContext | None = None,
) -> list[Any]:
    """Run chained row stages on one record (each retried as its policy, else
    ``policy``, says): its outputs, or the stage's exception with the stage's label
    attached as ``e.ft_where`` (e.g. ``"map[0] price"``)."""
    items = [record]
    for i, (kind, op) in enumerate(ops):
        fn = op if isinstance(op, RowFn) else RowFn(op)
        try:
            if kind == "map":
                items = [fn(x, ctx, policy) for x in items]
            elif kind == "filter":
                items = [x for x in items if fn(x, ctx, policy)]
            else:
                items = [y for x in items for y in fn(x, ctx, policy)]
        except Exception as e:
            with contextlib.suppress(AttributeError, TypeError):
                e.ft_where = f"{kind}[{i}] {stage_name(fn)}"  # type: ignore[attr-defined]
            raise
    return items
