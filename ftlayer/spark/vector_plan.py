"""The plan of a vectorized batch run, as every executor task gets it: the columns ftlayer
adds to the user's rows (ids, replay fields, references, summaries), :class:`VectorPlan`
(picklable, no live client) and the stages' labels."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa

from ftlayer.config import FTConfig
from ftlayer.ids import mix64
from ftlayer.spark.entries import Entry
from ftlayer.spark.plan import Segment, stage_name
from ftlayer.spark.policy import DEFAULT_POLICY, ErrorPolicy, wants_context
from ftlayer.spark.run_fields import RunFields, current

__all__ = [
    "ATT_COL", "CUR_COL", "ID_FIELDS", "LIN_COL", "LIN_FIELD", "LOC_COL", "POS_COL",
    "REF_COLS", "REPLAY_COLS", "SRC_COL", "SUMMARY_COL", "VectorPlan", "stage_label",
]  # fmt: skip

SRC_COL = "__ft_src"
ATT_COL = "__ft_att"
"""Claimed replays enter the source stage with their failed attempts so far (int32)."""
CUR_COL = "__ft_cur"
"""... and with the current id their claim inited them with (int64): the source task
reports (source id, current id) of every replay it ran, and the batch's settlement
completes or fails exactly those (the replays of the attempt that counted)."""
LIN_COL = "__ft_lin"
"""... and with its lineage id (int64, ftlayer.lineage). Past the source stage the
column carries every row's lineage id when the sink asked for it (Segment.sink_lineage)."""
REPLAY_COLS = (SRC_COL, ATT_COL, CUR_COL, LIN_COL)
"""The columns a replay carries into the source stage (null in fresh rows)."""
LOC_COL = "__ft_loc"
POS_COL = "__ft_pos"
REF_COLS = (LOC_COL, POS_COL)
"""A source kept by reference (ftlayer.spark.references): each row's location id and
position (int64 each). When the source stage's input has them, its segment holds them
instead of the rows."""
SUMMARY_COL = "__ft_summary"
ID_FIELDS = [pa.field(SRC_COL, pa.int64())]
LIN_FIELD = pa.field(LIN_COL, pa.int64())


@dataclass(frozen=True)
class VectorPlan:
    """What every task of one vectorized batch run needs (picklable, no live client)."""

    config: FTConfig
    source: int
    batch_key: str
    salt: int
    segments: tuple[Segment, ...]
    on_error: str
    immediate_replays: int
    """How many times a row failing in the task that read it fresh is replayed there at
    once before it becomes a residue (replay queue, or dead letters past its budget)."""
    inputs: tuple[pa.Schema, ...]
    """User columns entering each segment."""
    outputs: tuple[tuple[pa.Schema, ...], ...]
    """Output schema of each batch stage of each segment."""
    errors: ErrorPolicy = DEFAULT_POLICY
    """The pipeline's error policy (a stage's own ``errors=`` overrides it)."""
    record_key: str | None = None
    """The pipeline's record key column (Pipeline.record_key): folded and reported after
    a shuffle instead of ``__ft_src``, which then is not added."""
    lineage_seed: int = 0
    """The seed of the lineage ids of this batch's fresh copied rows (ftlayer.lineage)."""
    run_again: bool = True
    """This batch id began before (Spark running it again): its rows may have been
    written (BatchContext.written_before). True unless the driver knows otherwise."""
    entries: tuple[Entry, ...] = ()
    """Where rows join the run: one entry before every segment (ftlayer.spark.entries)."""
    open_stages: tuple[str, ...] = ()
    """Labels of the stages whose breaker is open: not called, their rows held."""
    replay_from: str = "stage"
    """Pipeline.replay_from: ``"source"``, nothing is retried at once past a shuffle."""
    keeps: bool = False
    """Fresh rows failing past a shuffle are kept as their segment's input (stage rows,
    ftlayer.stage_rows) and their replays enter there: a pipeline kept by reference
    (re-reading its source is what this saves), ``replay_from="stage"``, no record key
    (past a shuffle its ids are keys: fresh rows and replays look alike)."""

    def for_run(self, run: RunFields | None) -> VectorPlan:
        """This plan for the run ``run`` (None: as it is). A plan built once per query has
        no batch key: its tasks call ``for_run(run_fields.current())``."""
        if run is None:
            return self
        return replace(self, batch_key=run.batch_key, salt=run.salt,
                       lineage_seed=run.lineage_seed, run_again=run.run_again,
                       open_stages=run.open_stages)  # fmt: skip

    def in_task(self) -> VectorPlan:
        """This plan as a task runs it: with its run's fields, from the job when built once
        per query. A job without them fails the task (never a guessed batch key: the
        task's segment and summary are filed under it)."""
        if self.batch_key:
            return self
        run = current()
        if run is None:
            raise RuntimeError("ftlayer: a vectorized segment's task found no batch "
                               "run's fields (Spark local property 'ftlayer.batch')")
        return self.for_run(run)

    def query_part(self) -> VectorPlan:
        """This plan without its run's fields: what a function built once per query holds."""
        return replace(self, batch_key="", salt=0, lineage_seed=0, run_again=True,
                       open_stages=())

    @property
    def lineage(self) -> str | None:
        """The column the sink is given every row's lineage id in (None: not asked)."""
        return self.segments[-1].sink_lineage

    @cached_property
    def wants_lineage(self) -> tuple[bool, ...]:
        """Whether each segment's tasks know their rows' lineage ids: all of them when the
        sink asks for them (the ids cross every shuffle), else the source segment when one
        of its stages takes a context."""
        if self.lineage is not None:
            return (True,) * len(self.segments)
        return (self.wants_context[0],) + (False,) * (len(self.segments) - 1)

    @cached_property
    def wants_context(self) -> tuple[bool, ...]:
        """Whether any stage of each segment (its sink included) takes a context: if
        none does, its tasks build none."""
        return tuple(
            any(wants_context(op.fn) for _, op in seg.ops)
            or (seg.sink is not None and wants_context(seg.sink))
            for seg in self.segments
        )

    @cached_property
    def policies(self) -> dict[str, ErrorPolicy]:
        """Each Python stage's error policy, by its label (stage_label)."""
        out: dict[str, ErrorPolicy] = {}
        for i, seg in enumerate(self.segments):
            for j, (kind, op) in enumerate(seg.ops):
                if kind == "batches":  # (a DataFrame stage's errors= is its error text)
                    out[stage_label(i, j, op.fn)] = op.errors or self.errors
            if seg.sink is not None:
                label = stage_label(i, len(seg.ops), seg.sink, sink=True)
                out[label] = seg.sink_errors or self.errors
        return out

    @cached_property
    def edge_salts(self) -> tuple[int, ...]:
        """The salt of the shuffle edge leaving each segment."""
        seeds = np.array([self.salt ^ (i + 1) for i in range(len(self.segments))], np.uint64)
        return tuple(int(x) for x in mix64(seeds))

    @cached_property
    def id_schemas(self) -> tuple[pa.Schema, ...]:
        """The schema of the rows leaving each segment through a shuffle, ids included."""
        ids = [] if self.record_key else ID_FIELDS
        if self.lineage is not None and not self.record_key:
            ids = [*ids, LIN_FIELD]
        return tuple(pa.schema([*s, *ids]) for s in (*self.inputs[1:], pa.schema([])))


def stage_label(segment: int, op: int, fn: Any, sink: bool = False) -> str:
    """``map_batches[0.1] price``: a stage's name in ``BatchResult.stages`` (row stages,
    compiled by ftlayer.spark.row_stages, say ``rows``)."""
    kind = "sink" if sink else getattr(fn, "ft_kind", "map_batches")
    return f"{kind}[{segment}.{op}] {stage_name(fn)}"
