"""Stage rows of Python stages (VectorPlan.keeps): a fresh row failing in a task past a
shuffle is kept as that task's segment input, and its replay enters before the segment
(ftlayer.stage_rows, ftlayer.spark.entries).

* **Keep.** The task (ftlayer.spark.vector_tasks._Keep) answers, in its summary, the
  source ids and rows (msgpack maps of the segment's input columns) of the fresh rows it
  failed; the settle phase stores them as stage rows, their references taken from the
  source segment.
* **Enter.** The batch decodes the stage rows for entry ``k`` into segment ``k``'s input
  schema with their stored source ids (and lineage ids), and unions them with segment
  ``k - 1``'s output, before the shuffle: Spark places them by their key.
* **Count.** Nobody sent them across the edge, so the batch's fold would miss them: the
  driver adds their edge hashes itself (:attr:`Entering.fold`), and the tasks past the
  shuffle report the stored ids they received, of which those that entered ran.

Invariant: a stage row that does not decode into its entry's schema is dead-lettered,
named, never dropped; an entered row the job did not run (its task's output lost) keeps
its claim and times out into a replay, like any replay that did not run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ftlayer.ids import RecordId, edge_hashes, fold_sum
from ftlayer.persistence import ClaimedRecord
from ftlayer.spark.batch_plan import spark_schema
from ftlayer.spark.intake import BODY_COL
from ftlayer.spark.replay_rows import replay_table
from ftlayer.spark.vector_plan import ATT_COL, CUR_COL, LIN_COL, SRC_COL, VectorPlan
from ftlayer.stage_rows import StageRow
from serialization.frame import Frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.spark.entries import Entry
    from ftlayer.wire import BatchSummary

__all__ = ["Entering", "kept_rows"]


@dataclass
class Entering:
    """The stage rows one batch run put into its plan: the current id of each (by source
    id) and the edge hashes they add to the batch's fold."""

    current: dict[int, int] = field(default_factory=dict)
    fold: int = 0

    def enter(self, plan: VectorPlan, entry: Entry, table: pa.Table,
              out: DataFrame) -> tuple[DataFrame, list[tuple[RecordId, str]]]:  # fmt: skip
        """``out`` (segment ``k - 1``'s output) with the stage rows ``table``
        (Replays.entered's shape) for entry ``k``, and those that do not decode into its
        input schema, each with an error naming it."""
        k = entry.segment
        claimed = [
            ClaimedRecord(RecordId(s, c), Frame(s, c, 0, plan.source, body, lineage=lin), -1, a)
            for s, c, a, lin, body in zip(
                (x & _U64 for x in table.column(SRC_COL).to_pylist()),
                (x & _U64 for x in table.column(CUR_COL).to_pylist()),
                table.column(ATT_COL).to_pylist(), table.column(LIN_COL).to_pylist(),
                table.column(BODY_COL).to_pylist(), strict=True)
        ]  # fmt: skip
        rows, bad = replay_table(claimed, plan.inputs[k])
        if not rows.num_rows:
            return out, bad
        src = rows.column(SRC_COL).to_numpy().view(np.uint64)
        self.current.update(zip(src.tolist(), rows.column(CUR_COL).to_numpy().view(
            np.uint64).tolist(), strict=True))  # fmt: skip
        self.fold += fold_sum(edge_hashes(src, plan.edge_salts[k - 1]))  # sent by the driver
        shape = plan.id_schemas[k - 1]
        rows = rows.select(shape.names).cast(shape)
        return out.unionByName(out.sparkSession.createDataFrame(rows, spark_schema(shape))), bad

    def ran(self, summaries: list[BatchSummary]) -> dict[int, int]:
        """The entered rows the counted tasks past a shuffle received: source id ->
        current id."""
        out: dict[int, int] = {}
        for s in summaries:
            if s.stage and len(s.rep_src):
                out.update((x, self.current[x]) for x in s.rep_src.tolist()
                           if x in self.current)  # fmt: skip
        return out


def kept_rows(summaries: list[BatchSummary], plan: VectorPlan) -> dict[int, StageRow]:
    """The rows the counted tasks kept as their segment's input, by source id: stage
    rows without their reference yet (the settle phase adds it from the source segment).

    A record is stored as one row, so only a record whose failures all came from one
    input row of one task is kept that way: when a record fanned out and two of its rows
    failed (siblings: two input rows, or two tasks, or a stage before the shuffle too),
    keeping one would lose the other -- it replays from its source (its siblings that
    passed go on again: at least once)."""
    where: dict[int, set[int]] = {}
    for i, s in enumerate(summaries):
        for src in set(s.failed_src.tolist()):
            where.setdefault(src, set()).add(i)
    kept: dict[int, list[tuple[int, bytes]]] = {}
    for i, s in enumerate(summaries):
        for src, body in zip(s.kept_src.tolist(), s.kept_body, strict=True):
            kept.setdefault(src, []).append((i, body))
    out: dict[int, StageRow] = {}
    for src, rows in kept.items():
        (i, body), *others = rows
        if not others and body and where.get(src) == {i}:
            fingerprint = plan.entries[summaries[i].stage].fingerprint()
            out[src] = StageRow(summaries[i].stage, fingerprint, 0, None, -1, "msgpack", body)
    return out


_U64 = (1 << 64) - 1
