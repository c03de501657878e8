"""What a batch of Python stages reads of its counted task summaries (wire.BatchSummary):
its counts, and its residues -- failed and unconfirmed rows by source id, with record
keys mapped back to the rows that carry them.

Invariant: a failed row's first error wins, and a row both failed and unconfirmed is
failed (it replays either way; failed says why).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ftlayer.ids import batch_source_ids
from ftlayer.spark.plan import MAX_MESSAGES
from ftlayer.spark.results import BatchResult, StageCounts
from ftlayer.spark.settle import Failure
from ftlayer.wire import BatchSummary

__all__ = ["count", "failures", "keys_to_ids"]


def count(r: BatchResult, summaries: list[BatchSummary]) -> None:
    """Add the summaries' counts to ``r`` (its rows, its stages, its first errors)."""
    for s in summaries:
        r.tasks += 1
        r.fresh += s.fresh
        r.replayed += s.replayed
        r.written += s.written
        r.failed += len(s.failed_src)
        r.immediate_replays += s.immediate_replays
        r.unconfirmed += len(s.unc_src)
        for label, (rin, rout, failed, unc, extra, micros, now, *held) in s.counts.items():
            r.stages.setdefault(label, StageCounts()).add(
                StageCounts(rin, rout, failed, unc, extra, micros / 1e6, replayed=now,
                            held=sum(held))
            )
        for text in s.errors:
            if len(r.errors) < MAX_MESSAGES:
                r.errors.append(text)


def failures(summaries: list[BatchSummary]) -> tuple[dict[int, Failure], set[int]]:
    """Failed source ids with their first error and attempts used; unconfirmed ones
    (failed wins)."""
    failed: dict[int, Failure] = {}
    unconfirmed: set[int] = set()
    for s in summaries:
        for src, err, att, stage in zip(s.failed_src.tolist(), s.failed_err,
                                        s.failed_att.tolist(), s.failed_stage, strict=True):
            failed.setdefault(src, Failure(err, att, stage))
        unconfirmed.update(s.unc_src.tolist())
    return failed, unconfirmed - failed.keys()


def keys_to_ids(
    summaries: list[BatchSummary],
    record_key: str,
    replay_keys: dict[int, list[int]],
    segment: Callable[[int, str], Any],
    keys_failed: dict[int, Failure],
    keys_unc: set[int],
    failed: dict[int, Failure],
    unconfirmed: set[int],
) -> bool:
    """Add to ``failed`` / ``unconfirmed`` the source ids of the rows carrying each
    failed / unconfirmed record key: claimed replays (``replay_keys``: key -> their source
    ids), and fresh rows of this run's segments (``segment(partition, member)``: read
    once, kept for the settlement). False when a key names no row (the stage contract was
    broken: nothing may be assumed complete)."""
    if not keys_failed and not keys_unc:
        return True
    wanted = np.fromiter(keys_failed.keys() | keys_unc, np.uint64)
    found: dict[int, list[int]] = {k: list(replay_keys[k]) for k in wanted.tolist()
                                   if k in replay_keys}  # fmt: skip
    for s in summaries:
        table = segment(s.partition, s.segment) if s.segment else None
        if table is None:  # none, or timed out by the sidecar: its rows replay anyway
            continue
        col = table.column(record_key)
        keys = np.asarray(col.fill_null(-1).to_numpy()).view(np.uint64)
        rows = np.flatnonzero(np.isin(keys, wanted))
        ids = batch_source_ids(s.partition, 0, s.segment_rows)[rows]
        for k, src in zip(keys[rows].tolist(), ids.tolist(), strict=True):
            found.setdefault(k, []).append(src)
    if any(k not in found for k in wanted.tolist()):
        return False
    for k, srcs in found.items():
        for src in srcs:
            if k in keys_failed:
                failed.setdefault(src, keys_failed[k])
            else:
                unconfirmed.add(src)
    unconfirmed -= failed.keys()
    return True
