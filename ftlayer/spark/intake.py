"""The replay intake phase: the replays a batch runs, taken in one way for every pipeline,
for the replay stream's tasks and for the dead-letter views.

A replay is *taken* (claimed now by the batch, or read from the replay stream's open
claims), *decoded* into its source's columns (ftlayer.spark.replay_rows), the records that
no longer decode *rejected* (dead-lettered at once, each with an error naming it: no
replay fixes a payload), and those kept by reference *resolved* inside the batch's plan
(read back from the source: ftlayer.spark.references).

Invariants:

* Every claimed record ends in :class:`Replays` or in the dead letters, named; none is
  dropped. A reference whose row is no longer found is settled as a dead letter by the
  batch (settle phase): it is in ``Replays.references`` and not among the rows its job
  ran.
* Replays read from the replay stream get a full timeout from the moment the batch
  begins (they were claimed at the previous trigger); a batch's own claim starts theirs.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ftlayer.ids import RecordId, shard_of
from ftlayer.persistence import ClaimedRecord
from ftlayer.spark.references import references, resolve
from ftlayer.spark.replay_rows import replay_columns, replay_table, stored_schema
from ftlayer.spark.vector_plan import ATT_COL, CUR_COL, LIN_COL, LOC_COL, POS_COL, SRC_COL
from ftlayer.stage_rows import StageRow, decode_stage_row, source_payload

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.layer import FTLayer
    from ftlayer.spark.entries import Entry
    from ftlayer.spark.results import BatchResult

__all__ = ["BODY_COL", "HASH_COL", "Intake", "Replays", "dead_letter_table", "reject",
           "split_stage_rows"]

BODY_COL = "__ft_body"
"""A stage row's body (ftlayer.stage_rows) in :attr:`Replays.entered`, as bytes
(JSON text in UTF-8, or a msgpack map)."""
HASH_COL = "__ft_schema"
"""... and the hash of the schema it was written under."""

log = logging.getLogger(__name__)


@dataclass
class Replays:
    """The replays one batch run takes in, decoded (``replay_table``'s shape: the source's
    columns, then the replay columns), with those kept by reference
    (``references``: source id -> (current id, location id, position)), and the stage rows that
    enter before a later segment (``entered``: segment -> a table of their bodies, the
    hashes of the schemas they were written under and the replay columns)."""

    table: pa.Table
    references: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    entered: dict[int, pa.Table] = field(default_factory=dict)

    def _all(self, columns: list[str]) -> list[pa.Table]:
        return [t.select(columns) for t in (self.table, *self.entered.values())]

    @property
    def rows(self) -> int:
        """Replays taken in, wherever they enter."""
        return sum(t.num_rows for t in (self.table, *self.entered.values()))

    @property
    def injected(self) -> dict[int, int]:
        """Source id -> the current id the replay runs under."""
        out: dict[int, int] = {}
        for t in self._all([SRC_COL, CUR_COL]):
            src = t.column(SRC_COL).to_numpy().view(np.uint64).tolist()
            cur = t.column(CUR_COL).to_numpy().view(np.uint64).tolist()
            out.update(zip(src, cur, strict=True))
        return out

    @property
    def lineage(self) -> pa.Table:
        """(source id, lineage id) of each replay."""
        return pa.concat_tables(self._all([SRC_COL, LIN_COL]))


def reject(layer: FTLayer, bad: Sequence[tuple[RecordId, str]], counts: BatchResult | None,
           where: str = "") -> int:  # fmt: skip
    """Dead-letter replays no replay can fix (a payload that no longer decodes or fits),
    each with its own error; counted in ``counts.undecodable`` when given. Returns the
    Redis calls made (one each: they are rare)."""
    for rid, text in bad:
        if counts is not None:
            counts.undecodable += 1
            counts.note(counts.errors, text)
        log.error("replay rejected %s%s", where, text)
        layer.fail([rid], error=text, max_replays=0)
    return len(bad)


class Intake:
    """The replay intake of one batch run of ``source`` (columns ``schema``, an Arrow
    schema of the source's own columns; ``by_reference``: its records are kept by
    reference). ``calls`` counts the Redis round trips it made."""

    def __init__(self, layer: FTLayer, source: int, schema: pa.Schema, by_reference: bool,
                 counts: BatchResult | None = None, where: str = "",
                 entries: tuple[Entry, ...] = ()) -> None:  # fmt: skip
        self.layer, self.source, self.counts, self.where = layer, source, counts, where
        self.stored = stored_schema(schema, by_reference)
        self.names = list(schema.names)
        self.entries = entries
        """Where stage rows may enter (none: every stage row goes back to its source)."""
        self.calls = 0

    def claim(self, limit: int) -> Replays:
        """Claim up to ``limit`` queued replays of the source now (their timeouts start)."""
        claimed = self.layer.claim_replays(self.source, limit)
        shards = self.layer.config.shards
        self.calls += 1 + len({shard_of(c.record_id[0], shards) for c in claimed})
        if claimed:
            log.info("replays claimed %ssource=%d claimed=%d", self.where, self.source,
                     len(claimed))  # fmt: skip
        return self.take(claimed)

    def streamed(self) -> Replays:
        """The replays the replay stream claimed for this batch (its open claims), a
        full timeout from now."""
        claimed = self.layer.persistence.read_open_streams(self.source)
        self.calls += 1 + len(self.layer.keyspace.shards)
        if claimed:
            self.layer.reset_timeout([c.record_id[0] for c in claimed])
            self.calls += len(self.layer.keyspace.shards)
        return self.take(claimed)

    def stream_partition(self, token: str, shard: int) -> pa.Table:
        """What one partition of the replay stream holds (its claim ``token`` on
        ``shard``), a full timeout from now: the replay stream's task."""
        claimed = self.layer.persistence.read_stream(self.source, token, shard)
        # stage rows only come from DataFrame stages, whose batches read their claims
        # themselves (this table is not used there): left to them
        claimed = [c for c in claimed if decode_stage_row(c.frame.payload) is None]
        replays = self.take(claimed)
        if replays.table.num_rows:
            src = replays.table.column(SRC_COL).to_numpy().view(np.uint64)
            self.layer.reset_timeout([int(x) for x in src])
        return replays.table

    def take(self, claimed: Sequence[ClaimedRecord]) -> Replays:
        """Decode ``claimed``; reject what does not decode; stage rows to the entries
        they enter (ftlayer.stage_rows), or back to their source."""
        sources, entered, bad = split_stage_rows(claimed, self.entries)
        first = entered.pop(0, []) if self.entries and self.entries[0].kind == "python" else []
        # before Python stages' segment 0: a map of the source's columns, read as a copy
        sources += [c._replace(frame=c.frame._replace(
            payload=r.body if isinstance(r.body, bytes) else r.body.encode())) for c, r in first]
        table, undecodable = replay_table(sources, self.stored)
        self.calls += reject(self.layer, [*bad, *undecodable], self.counts, self.where)
        refs = references(table) if LOC_COL in table.schema.names and table.num_rows else {}
        if self.counts is not None:
            self.counts.entered += len(first) + sum(len(rows) for rows in entered.values())
            self.counts.read_back += len(refs)
        return Replays(table, refs, {k: _entered_table(rows) for k, rows in entered.items()})

    def dataframe(self, spark: Any, replays: Replays, reads: Any) -> DataFrame | None:
        """``replays`` as a DataFrame of the source's columns and the replay columns:
        copies as they are, references read back from ``reads`` in the plan (None: no
        rows)."""
        from ftlayer.spark.vector_plan import REPLAY_COLS

        if not replays.table.num_rows:
            return None
        if reads is None:
            return spark.createDataFrame(replays.table.select([*self.names, *REPLAY_COLS]))
        return resolve(spark, reads, replays.table, self.names)


def split_stage_rows(claimed: Sequence[ClaimedRecord], entries: tuple[Entry, ...],
                     names: Sequence[str] = ()) -> tuple[
        list[ClaimedRecord], dict[int, list[tuple[ClaimedRecord, StageRow]]],
        list[tuple[RecordId, str]]]:  # fmt: skip
    """``claimed`` as (source rows, stage rows by the entry they enter, rejects). A stage
    row enters where it was kept when ``entries`` has that entry under the same
    fingerprint (the pipeline up to it unchanged); else it goes back to its source
    reference, or -- a copy, with no source -- is rejected, named (``names``: the
    source's columns, to read a copy kept before segment 0 as its source row)."""
    sources: list[ClaimedRecord] = []
    entered: dict[int, list[tuple[ClaimedRecord, StageRow]]] = {}
    bad: list[tuple[RecordId, str]] = []
    prints: list[int] = []  # the entries' fingerprints, made once
    for c in claimed:
        row = decode_stage_row(c.frame.payload)
        if row is None:
            sources.append(c)
            continue
        if not prints:
            prints = [e.fingerprint() for e in entries] or [-1]
        if row.entry < len(entries) and prints[row.entry] == row.fingerprint \
                and _reads(entries[row.entry], row):
            entered.setdefault(row.entry, []).append((c, row))
        elif (payload := source_payload(row, names)) is not None:
            sources.append(c._replace(frame=c.frame._replace(payload=payload)))
        else:
            bad.append((c.record_id, f"{c.frame.describe()}: kept as the input of segment "
                        f"{row.entry} by another version of the pipeline (a stage before it "
                        "changed), and a copy has no source to go back to"))  # fmt: skip
    return sources, entered, bad


def _reads(entry: Entry, row: StageRow) -> bool:
    """Whether ``entry``'s stage kind reads the stage row ``row``: DataFrame stages keep
    JSON, Python stages msgpack maps (before segment 0: the source's columns, a copy's
    form). The fingerprint of segment 0's entry names the source alone, whatever kind of
    stages follow it (a pipeline changed from one kind to the other between runs)."""
    if entry.kind == "frame":
        return row.format == "json"
    return row.format == "msgpack"


def _entered_table(rows: list[tuple[ClaimedRecord, StageRow]]) -> pa.Table:
    """Stage rows as Replays.entered holds them: body, schema hash, replay columns."""
    return pa.table({
        BODY_COL: pa.array([r.body.encode() if isinstance(r.body, str) else r.body
                            for _, r in rows], pa.binary()),
        HASH_COL: pa.array([r.schema_hash for _, r in rows], pa.int64()),
        **replay_columns([c for c, _ in rows])})  # fmt: skip


def dead_letter_table(layer: FTLayer, source: int, schema: pa.Schema, reads: Any,
                      spark: Any) -> pa.Table:  # fmt: skip
    """The dead letters of ``source`` as a table of its columns (kept by reference: read
    back from ``reads``; a reference that no longer resolves leaves its columns null)
    with ``__ft_src``, ``lineage``, ``attempts`` and ``error`` (the last one)."""
    letters = [d for d in layer.persistence.dead_letters()
               if d.frame is not None and d.frame.source == source]  # fmt: skip
    claimed = [ClaimedRecord(RecordId(d.source_id, 0), d.frame, -1, d.attempts)
               for d in letters if d.frame is not None]  # fmt: skip
    claimed, _, _ = split_stage_rows(claimed, (), schema.names)  # stage rows: their source
    table, _ = replay_table(claimed, stored_schema(schema, reads is not None))
    if reads is not None and table.num_rows:
        back = resolve(spark, reads, table, schema.names)
        if back is not None:
            found = back.toArrow().join(table.select([SRC_COL, LOC_COL, POS_COL]), SRC_COL)
            _, first = np.unique(found.column(SRC_COL).to_numpy(), return_index=True)
            found = found.take(first).select(table.schema.names).cast(table.schema)
            gone = pc.invert(pc.is_in(table.column(SRC_COL), found.column(SRC_COL)))
            table = pa.concat_tables([found, table.filter(gone)])
    why = {d.source_id: (d.history[-1].error if d.history else "") for d in letters}
    src = table.column(SRC_COL).to_numpy().view("uint64")
    names = [n for n in table.schema.names if n not in (ATT_COL, CUR_COL, LIN_COL)]
    return table.select(names).append_column(
        "lineage", table.column(LIN_COL)).append_column(
        "attempts", table.column(ATT_COL)).append_column(
        "error", pa.array([why.get(int(s), "") for s in src], pa.string()))  # fmt: skip

