"""Where rows join a batch run: one entry before every segment of its plan.

A batch's plan (ftlayer.spark.batch_plan) is a chain of segments, each of chained stages
ending in a keyed shuffle or the sink. Rows enter the chain at an :class:`Entry`:

* before segment 0, the source's rows -- the batch's fresh rows and the replays its
  intake took (ftlayer.spark.intake);
* before segment ``k > 0``, rows given as segment ``k``'s *input*, placed before the
  shuffle that feeds it, so that Spark sends each to the partition it gives its key (the
  replay partitioners mirror that placement where a row is placed by hand).

Every stage kind builds its part of the plan through :func:`walk`, so an entry exists at
the same place whatever the stage kinds are.

An entry's ``fingerprint`` names the pipeline as far as that entry -- the source's
schema, every stage before it (its kind, its function's qualified name, its declared
output) and each shuffle -- together with the entry's input schema where the plan knows
it (DataFrame stages: the source's only; a stage row also carries a hash of the schema
Spark's analysis gave, checked where it enters: ftlayer.stage_rows). A row kept
for an entry carries the fingerprint it was kept under: a row whose fingerprint no longer
matches was kept by another version of the pipeline and must not enter there.

Invariant: the fingerprint is a function of the pipeline's definition and the input
schema only -- the same in every batch run, every driver, every Python process
(xxhash64, not Python's salted ``hash``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import xxhash

from ftlayer.spark import jvm_args
from ftlayer.spark.plan import Segment

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["Entry", "Identity", "plan_entries", "walk"]

Identity = Literal["ids", "key", "columns"]
"""How the rows entering a segment are named: ``ids`` (the source record id in
``__ft_src``: Python stages), ``key`` (the pipeline's record key column), ``columns``
(``__ft_loc``/``__ft_pos``, kept through DataFrame stages: ftlayer.spark.identity)."""


@dataclass(frozen=True)
class Entry:
    """Where rows join a batch run: before segment ``segment`` (see the module docstring).
    ``kind``: the segment's stage kind (``python`` or ``frame``); ``schema``: its input's
    user columns (None: known only from Spark's analysis, after a DataFrame stage);
    ``identity``: how its rows are named; ``path``: the pipeline up to it, as text."""

    segment: int
    kind: Literal["python", "frame"]
    schema: pa.Schema | None
    identity: Identity
    path: str

    def fingerprint(self, schema: pa.Schema | None = None) -> int:
        """The entry's fingerprint, over its path and its input schema (``schema``: the
        one Spark's analysis gave, where the plan has none)."""
        known = self.schema if self.schema is not None else schema
        text = self.path + "|" + (known.to_string(show_schema_metadata=False)
                                  if known is not None else "?")  # fmt: skip
        return xxhash.xxh64_intdigest(text.encode())


def _stage_text(kind: str, op: Any) -> str:
    fn = getattr(op, "fn", op)
    name = getattr(fn, "__qualname__", type(fn).__name__)  # not its module: the same job
    # is __main__ run as a script and another name imported
    declared = getattr(op, "schema", None)
    return f"{kind}:{name}:{'' if declared is None else str(declared)}"


def plan_entries(segments: tuple[Segment, ...], inputs: tuple[pa.Schema, ...], frames: bool,
                 record_key: str | None) -> tuple[Entry, ...]:  # fmt: skip
    """One entry per segment. ``inputs``: the user columns entering each segment, as far as
    the plan knows them (DataFrame stages: the source's only); ``frames``: the batch runs
    as DataFrame stages (frame_run), else as Python stages (batch_scope)."""
    out: list[Entry] = []
    path = [f"source:{inputs[0].to_string(show_schema_metadata=False)}"] if inputs else []
    for i, seg in enumerate(segments):
        if i:
            prev = segments[i - 1]
            path.append(f"shuffle:{','.join(prev.shuffle_cols)}:{prev.shuffle_n}")
        identity: Identity = "columns" if frames else "key" if record_key and i else "ids"
        kind: Literal["python", "frame"] = "frame" if frames else "python"
        out.append(Entry(i, kind, inputs[i] if i < len(inputs) else None, identity,
                         "/".join(path)))  # fmt: skip
        path.extend(_stage_text(k, op) for k, op in seg.ops)
    return tuple(out)


def walk(entries: tuple[Entry, ...], segments: tuple[Segment, ...], out: DataFrame,
         run_segment: Callable[[int, DataFrame], DataFrame],
         enter: Callable[[Entry, DataFrame], DataFrame] | None,
         cache: dict[Any, Any]) -> DataFrame:  # fmt: skip
    """``out`` -- segment 0's input, the source's rows (fresh and replayed) -- through
    every segment: before segment ``k > 0`` the rows entering there (``enter``; None:
    none), then the shuffle that feeds it, then the segment (``run_segment(k, df)``).
    ``cache``: the query's, where the shuffles' JVM arguments are kept (jvm_args)."""
    for entry in entries:
        k = entry.segment
        if k:
            if enter is not None:
                out = enter(entry, out)
            prev = segments[k - 1]
            out = jvm_args.repartition(out, prev.shuffle_n, prev.shuffle_cols, cache)
        out = run_segment(k, out)
    return out
