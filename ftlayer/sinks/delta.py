"""Delta Lake through delta-rs (the ``deltalake`` package): a merge that inserts the rows
whose key the table does not hold, one commit a write.

Concurrent writers: a commit whose table version another writer took first fails, and
the whole merge runs again, with backoff, against the new version -- where the rows the
other writer committed now match and are skipped. The sink never lets delta-rs rebase a
commit onto a newer version (``max_commit_retries=0``): its conflict checker compares
files, not keys, and lets two insert-only merges of one key both land (overlapping
writers left duplicates until rebasing was off: tests/test_sinks.py races them).

Invariant: a write commits all of its new rows or none (one Delta commit); a row is
skipped only when a row with its key was committed before. A write that cannot commit
within ``attempts`` raises, and its rows fail and replay (ftlayer never acks them).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from ftlayer.sinks.keyed import KeyedSink

__all__ = ["DeltaSink"]

log = logging.getLogger(__name__)


def _no_rebase() -> Any:
    from deltalake import CommitProperties

    return CommitProperties(max_commit_retries=0)


def _first_of_each_key(rows: pa.Table, key: tuple[str, ...]) -> pa.Table:
    """``rows`` keeping the first row of each key: one write may hold a record twice (its
    fresh attempt in a batch re-run after a crash, and its replay), and a merge inserts
    every unmatched source row."""
    if rows.num_rows < 2:
        return rows
    if len(key) == 1:
        col = rows.column(key[0])
        if col.null_count == 0 and pa.types.is_integer(col.type):
            _, first = np.unique(col.to_numpy(), return_index=True)
            return rows if len(first) == rows.num_rows else rows.take(np.sort(first))
    at = rows.select(list(key)).append_column("__ft_row", pa.array(np.arange(rows.num_rows)))
    first = at.group_by(list(key), use_threads=False).aggregate([("__ft_row", "min")])
    if first.num_rows == rows.num_rows:
        return rows
    return rows.take(np.sort(first.column("__ft_row_min").to_numpy()))


class DeltaSink(KeyedSink):
    """A ``sink_batches`` function merging each batch into the Delta table at ``path``
    (created from the first batch's columns if absent), one row per key
    ``(lineage, *key)``. ``lineage``: the lineage id column, which the sink asks its
    pipeline for; ``key``: more key columns (a stage that makes several rows of one record
    adds their ordinal); ``storage_options``: delta-rs' (object store credentials);
    ``partition_by``: the table's partition columns when this sink creates it;
    ``attempts``: commits tried per write (conflicts with concurrent writers)."""

    def __init__(
        self,
        path: str,
        *,
        lineage: str = "lineage_id",
        key: Sequence[str] = (),
        partition_by: Sequence[str] = (),
        storage_options: Mapping[str, str] | None = None,
        attempts: int = 20,
    ) -> None:
        super().__init__(lineage, key, attempts)
        self.path = str(path)
        self.partition_by = list(partition_by)
        self.storage_options = dict(storage_options or {})

    def __repr__(self) -> str:
        return f"DeltaSink({self.path!r}, key={list(self.key)})"

    @property
    def __name__(self) -> str:  # a stage's name in counts and errors
        return f"DeltaSink {self.path}"

    @property
    def predicate(self) -> str:
        """The merge's join condition: the key's columns equal (null-safe)."""
        return " AND ".join(f"t.`{k}` <=> s.`{k}`" for k in self.key)

    def __call__(self, batch: pa.RecordBatch, ctx: Any = None) -> None:
        from deltalake.exceptions import CommitFailedError

        if batch.num_rows == 0:
            return
        self.check_key(batch)
        rows = pa.Table.from_batches([batch])
        task = _TaskMark.of(ctx)
        jobs = [(rows, False)]
        if task is not None and task.first is not None:  # first writes may be appended
            mask = pa.array(task.first)
            jobs = [(rows.filter(mask), True), (rows.filter(pc.invert(mask)), False)]
        def note(attempt: int, e: BaseException) -> None:  # a concurrent commit came first
            log.debug("Delta commit conflict, retrying attempt=%d path=%s error=%s",
                      attempt, self.path, e)  # fmt: skip

        inserted = 0
        for part, first in jobs:
            part = _first_of_each_key(part, self.key)
            if part.num_rows:
                write = partial(self._write, part, first, task)
                inserted += self.retried(write, (CommitFailedError,), 0.02, note)
        self.counted(batch.num_rows, inserted, f"delta {self.path}")

    def _write(self, rows: pa.Table, first: bool, task: _TaskMark | None) -> int:
        """One commit of ``rows`` on the table as it is now (no rebase): appended when
        they are first writes and no other attempt of this task wrote (_TaskMark), else
        merged (inserting the rows whose key the table does not hold). Returns how many
        were inserted (a new table: all of them, its first commit)."""
        from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
        from deltalake.exceptions import DeltaError, TableNotFoundError

        options = self.storage_options or None
        props = _no_rebase()
        try:
            table = DeltaTable(self.path, storage_options=options)
        except TableNotFoundError:
            if task is not None:
                props = CommitProperties(max_commit_retries=0,
                                         app_transactions=[Transaction(*task.mark(None))])
            try:  # version 0 holds these rows: no other writer can have written them
                write_deltalake(self.path, rows, mode="error", storage_options=options,
                                partition_by=self.partition_by or None,
                                commit_properties=props)  # fmt: skip
                return rows.num_rows
            except DeltaError as e:  # a concurrent writer created it first: merge
                if "already exists" not in str(e):
                    raise
            table = DeltaTable(self.path, storage_options=options)
        if task is not None:
            app, version = task.mark(table.transaction_version(task.app))
            props = CommitProperties(max_commit_retries=0,
                                     app_transactions=[Transaction(app, version)])
            if first and not task.contended(version):
                write_deltalake(table, rows, mode="append", commit_properties=props)
                return rows.num_rows
        # no rebase onto a version committed meanwhile: delta-rs' conflict checker lets
        # two insert-only merges of one key both commit (it checks files, not keys), so a
        # commit that finds its version taken fails and the merge runs again, reading it
        metrics: dict[str, Any] = (
            table.merge(rows, self.predicate, source_alias="s", target_alias="t",
                        commit_properties=props)
            .when_not_matched_insert_all()
            .execute()
        )  # fmt: skip
        return int(metrics.get("num_target_rows_inserted", 0))


_ID_BITS = 20


@dataclass(frozen=True)
class _TaskMark:
    """Which rows of a sink call may be appended without reading the table, and the mark
    that keeps that safe.

    A row is a *first write* when its record has certainly not reached a sink before:
    its first attempt in the first run of its batch (``ctx.written_before`` False). Every
    commit of a task -- Spark's task of partition p of batch b, any of its attempts --
    carries a Delta app transaction ``ftlayer-sink-p<p>`` whose version is
    ``b << 20 | writer``: ``writer`` names the task attempt (its run and task attempt id,
    never 0), 0 once two attempts wrote (sticky). A task attempt appends its first writes
    only while the mark says batch b was written by no one or by itself; it commits only
    on the version whose mark it read (no rebase). So of two attempts of one task --
    Spark's retry after a failure, a speculative copy, a stage run again, a batch run
    again by a new driver -- the one that writes second sees the other's mark and merges
    (skipping the rows the other committed), and one that read the mark before the other
    committed fails its commit and reads again."""

    app: str
    batch_id: int
    writer: int
    first: np.ndarray | None

    @classmethod
    def of(cls, ctx: Any) -> _TaskMark | None:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if ctx is None or ctx.batch_id is None or tc is None:
            return None
        seed = f"{getattr(ctx, 'run_id', 0)}:{tc.taskAttemptId()}".encode()
        writer = xxhash.xxh64_intdigest(seed) % ((1 << _ID_BITS) - 1) + 1
        first = None
        if ctx.written_before is not None:
            mask = ~np.asarray(ctx.written_before, bool)
            first = mask if mask.any() else None
        return cls(f"ftlayer-sink-p{tc.partitionId()}", int(ctx.batch_id), writer, first)

    def mark(self, current: int | None) -> tuple[str, int]:
        """(app id, version) this attempt's commit carries, given the table's mark."""
        if current is not None and current >> _ID_BITS == self.batch_id:
            if current & ((1 << _ID_BITS) - 1) != self.writer:  # another attempt wrote
                return self.app, self.batch_id << _ID_BITS
        return self.app, (self.batch_id << _ID_BITS) | self.writer

    def contended(self, version: int) -> bool:
        return version & ((1 << _ID_BITS) - 1) != self.writer
