"""Claimed replays as Arrow rows of their source's schema, with the columns a replay
carries into the source stage (ftlayer.spark.vector_plan.REPLAY_COLS).

Used by both ways a replay enters a batch: the replay stream's tasks
(ftlayer.spark.replay_stream) and a batch that claims its replays itself (``drain``, a
pipeline run on a DataFrame that does not carry the replay stream).

Invariant: every claimed record ends in the table or in ``bad`` with an error naming it
(a payload that no longer decodes, or does not fit the schema): nothing is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from ftlayer.ids import RecordId
from ftlayer.payloads import arrow_codecs, decode_record
from ftlayer.persistence import ClaimedRecord
from ftlayer.spark.vector_plan import ATT_COL, CUR_COL, LIN_COL, LOC_COL, POS_COL, SRC_COL

__all__ = ["replay_columns", "replay_schema", "replay_table", "stored_schema"]

_ERRORS = (pa.ArrowException, TypeError, ValueError)


def stored_schema(schema: pa.Schema, by_reference: bool) -> pa.Schema:
    """What a source's records hold: its columns (a copy), and with ``by_reference`` also
    a reference (a record kept by reference carries only the reference; a copy only the
    columns)."""
    if not by_reference:
        return schema
    return pa.schema([*schema, pa.field(LOC_COL, pa.int64()), pa.field(POS_COL, pa.int64())])


def replay_schema(schema: pa.Schema) -> pa.Schema:
    """The source's schema with the replay columns (source id, attempts, current id,
    lineage id)."""
    return pa.schema([*schema, pa.field(SRC_COL, pa.int64()), pa.field(ATT_COL, pa.int32()),
                      pa.field(CUR_COL, pa.int64()), pa.field(LIN_COL, pa.int64())])  # fmt: skip


def replay_table(
    claimed: Sequence[ClaimedRecord], schema: pa.Schema
) -> tuple[pa.Table, list[tuple[RecordId, str]]]:
    """The claimed records that decode into ``schema`` as one table of
    ``replay_schema(schema)``, and (record id, error) of those that do not."""
    codecs = arrow_codecs(schema)
    rows, kept, bad = [], [], []
    for c in claimed:
        desc = c.frame.describe()
        try:
            record = decode_record(c.frame.payload, codecs, desc)
            if not isinstance(record, dict):
                raise ValueError(f"a replay of a vectorized source must be a map: {desc}")
        except Exception as e:
            bad.append((c.record_id, f"undecodable replay payload: {e}"))
            continue
        rows.append(record)
        kept.append(c)
    try:
        table = pa.Table.from_pylist(rows, schema=schema)
    except _ERRORS:  # find the rows that do not fit
        fit = []
        for i, record in enumerate(rows):
            try:
                pa.Table.from_pylist([record], schema=schema)
                fit.append(i)
            except _ERRORS as e:
                bad.append((kept[i].record_id, f"replay does not fit the input schema: {e}"))
        rows, kept = [rows[i] for i in fit], [kept[i] for i in fit]
        table = pa.Table.from_pylist(rows, schema=schema)
    for name, column in replay_columns(kept).items():
        table = table.append_column(name, column)
    return table, bad


def replay_columns(claimed: Sequence[ClaimedRecord]) -> dict[str, pa.Array]:
    """The replay columns of ``claimed``, in order: source id, attempts, current id,
    lineage id (ids as int64)."""
    src = np.array([c.record_id[0] for c in claimed], np.uint64).view(np.int64)
    cur = np.array([c.record_id[1] for c in claimed], np.uint64).view(np.int64)
    return {SRC_COL: pa.array(src), ATT_COL: pa.array([c.attempts for c in claimed], pa.int32()),
            CUR_COL: pa.array(cur),
            LIN_COL: pa.array([c.frame.lineage for c in claimed], pa.int64())}  # fmt: skip
