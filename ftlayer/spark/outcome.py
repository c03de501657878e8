"""Per-row outcomes of a vectorized stage, without per-row Python.

A batch function returns its output batch, or an :class:`Outcome` that also names the input
rows that failed (with a reason each), the parent input row of every output row (fan-out,
filtering) and, for sinks, the rows whose writes were not confirmed. When the function
raises, :func:`run_stage` isolates the rows that make it raise by bisection: it re-runs the
two halves of the batch, recursively, until the rows that still raise stand alone; those
fail with the exception text and every other row goes on. The cost: a batch without a
poison row costs nothing extra; one poison row among n costs 2·log2(n) extra calls over
about 2n rows; k poison rows spread out cost up to 2k·log2(n/k) calls and, at worst, n·log2(n)
rows (docs/vectorized.md has the table).

Invariant: every input row of a stage ends in exactly one of: parent of >= 0 outputs,
failed, unconfirmed (sinks). Outputs of a failed row are dropped with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ftlayer.errors import FTLayerError
from ftlayer.spark.plan import error_text
from ftlayer.spark.policy import DEFAULT_POLICY, BatchContext, ErrorPolicy, is_dead, wants_context

__all__ = ["Outcome", "StageContractError", "StageResult", "run_stage"]

Indices = Sequence[int] | np.ndarray


class StageContractError(FTLayerError):
    """A batch function answered something that cannot be mapped to its input rows (a
    bug in the stage, not bad input): the task fails and Spark's retry policy applies."""


@dataclass
class Outcome:
    """What a batch function may return instead of a plain batch.

    ``output``: the output rows (a ``pyarrow.RecordBatch``, or a pandas DataFrame for
    pandas stages; ``None`` for a sink). ``parents``: for each output row, the index of the
    input row it derives from (default: output row i derives from input row i, which needs
    as many output rows as input rows). ``failed``: input row indices (or a boolean mask)
    that failed; ``errors``: one reason for all of them, or one per failed row. Failed rows
    are replayed later under a new id, or dead-lettered. ``unconfirmed`` (sinks): input rows
    whose writes were not confirmed; they stay pending, time out and replay.
    """

    output: Any = None
    parents: Indices | None = None
    failed: Indices | None = None
    errors: str | Sequence[str] = "failed by the stage"
    unconfirmed: Indices | None = None
    dead_letter: Indices | None = None
    """Those of the ``failed`` rows that no replay can fix (bad input): they go straight
    to the dead letters instead of being replayed."""


_NONE = np.empty(0, np.int64)
_NONE.flags.writeable = False


@dataclass
class StageResult:
    """A stage's answer over one input batch of ``n_in`` rows, as arrays."""

    output: pa.RecordBatch | None
    parents: np.ndarray  # int64, one per output row
    failed: np.ndarray  # int64 input row indices
    errors: list[str]  # one per failed row
    unconfirmed: np.ndarray = field(default_factory=lambda: _NONE)
    extra_calls: int = 0  # calls spent bisecting
    identity: bool = False  # output row i derives from input row i, for every i
    dead: np.ndarray = field(default_factory=lambda: _NONE)  # failed rows to dead-letter


def _indices(value: Indices | None, n_in: int, what: str) -> np.ndarray:
    if value is None:
        return np.empty(0, np.int64)
    arr = np.asarray(value)
    if arr.dtype == bool:
        if len(arr) != n_in:
            raise StageContractError(f"{what} mask has {len(arr)} entries for {n_in} rows")
        return np.flatnonzero(arr).astype(np.int64)
    arr = arr.astype(np.int64, copy=False).ravel()
    if len(arr) and (arr.min() < 0 or arr.max() >= n_in):
        raise StageContractError(f"{what} holds a row index outside 0..{n_in - 1}")
    return arr


def _unique_indices(value: Indices | None, n_in: int, what: str) -> np.ndarray:
    """:func:`_indices`, sorted and each row once (a mask's are already)."""
    arr = _indices(value, n_in, what)
    if value is None or np.asarray(value).dtype == bool:
        return arr
    return np.unique(arr)


def _to_arrow(output: Any, schema: pa.Schema | None, pandas: bool) -> pa.RecordBatch | None:
    if output is None:
        return None
    if pandas:
        return pa.RecordBatch.from_pandas(output, schema=schema, preserve_index=False)
    if isinstance(output, pa.Table):
        output = output.combine_chunks().to_batches()[0] if output.num_rows else None
        if output is None:
            return pa.RecordBatch.from_pylist([], schema=schema) if schema else None
    if not isinstance(output, pa.RecordBatch):
        raise StageContractError(
            f"a batch stage must return a pyarrow.RecordBatch or an Outcome, not "
            f"{type(output).__name__}"
        )
    if schema is not None and output.schema != schema:
        try:
            output = output.select(schema.names).cast(schema)
        except (KeyError, ValueError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise StageContractError(
                f"output columns {output.schema} do not match the declared schema {schema}: {e}"
            ) from e
    return output


def _normalize(
    raw: Any, n_in: int, schema: pa.Schema | None, pandas: bool, is_sink: bool
) -> StageResult:
    if not isinstance(raw, Outcome):  # the common case: a plain batch, one row per row
        batch = None if is_sink else _to_arrow(raw, schema, pandas)
        if batch is None or batch.num_rows == n_in:
            n_out = 0 if batch is None else n_in
            return StageResult(batch, np.arange(n_out, dtype=np.int64), _NONE, [],
                               identity=batch is not None)  # fmt: skip
    out = raw if isinstance(raw, Outcome) else Outcome(output=raw)
    batch = None if is_sink else _to_arrow(out.output, schema, pandas)
    failed = _unique_indices(out.failed, n_in, "failed")
    if isinstance(out.errors, str):
        errors = [out.errors] * len(failed)
    else:
        if len(out.errors) != len(failed):
            raise StageContractError(f"{len(out.errors)} errors for {len(failed)} failed rows")
        order = np.argsort(_indices(out.failed, n_in, "failed"), kind="stable")
        errors = [str(out.errors[i]) for i in order]
    unconfirmed = _unique_indices(out.unconfirmed, n_in, "unconfirmed")
    if len(unconfirmed) and len(failed):
        unconfirmed = np.setdiff1d(unconfirmed, failed, assume_unique=True)
    dead = _unique_indices(out.dead_letter, n_in, "dead_letter")
    if len(dead) and not np.isin(dead, failed, assume_unique=True).all():
        raise StageContractError("dead_letter names rows that are not in failed")
    n_out = 0 if batch is None else batch.num_rows
    if out.parents is None:
        if batch is not None and n_out != n_in:
            raise StageContractError(
                f"the stage returned {n_out} rows for {n_in} input rows without parents=: "
                "return Outcome(output, parents=...) to filter or fan out"
            )
        parents = np.arange(n_out, dtype=np.int64)
    else:
        parents = _indices(out.parents, n_in, "parents")
        if len(parents) != n_out:
            raise StageContractError(f"{len(parents)} parents for {n_out} output rows")
    if len(failed) and batch is not None and n_out:
        if out.parents is None:  # one output row per input row: failed rows by position
            keep = np.ones(n_out, bool)
            keep[failed] = False
        else:
            keep = ~np.isin(parents, failed)
        if not keep.all():
            batch = batch.filter(pa.array(keep))
            parents = parents[keep]
    return StageResult(batch, parents, failed, errors, unconfirmed, dead=dead)


def _concat(parts: list[tuple[int, StageResult]], schema: pa.Schema | None) -> StageResult:
    batches = [r.output for _, r in parts if r.output is not None and r.output.num_rows]
    if batches:
        output: pa.RecordBatch | None = pa.Table.from_batches(batches).combine_chunks()
        output = output.to_batches()[0] if output.num_rows else None  # type: ignore[union-attr]
    else:
        output = None
    if output is None and schema is not None:
        output = pa.RecordBatch.from_pylist([], schema=schema)
    return StageResult(
        output,
        np.concatenate([r.parents + start for start, r in parts]),
        np.concatenate([r.failed + start for start, r in parts]),
        [e for _, r in parts for e in r.errors],
        np.concatenate([r.unconfirmed + start for start, r in parts]),
        sum(r.extra_calls for _, r in parts),
        dead=np.concatenate([r.dead + start for start, r in parts]),
    )


def run_stage(
    fn: Callable[..., Any],
    batch: pa.RecordBatch,
    where: str,
    *,
    schema: pa.Schema | None,
    pandas: bool = False,
    is_sink: bool = False,
    bisect: bool = True,
    policy: ErrorPolicy = DEFAULT_POLICY,
    ctx: BatchContext | None = None,
) -> StageResult:
    """Run ``fn`` over ``batch`` (retried as ``policy`` says); on an exception, isolate
    the rows that raise (see the module docstring). ``bisect=False`` lets the exception
    propagate (``fail_batch``). ``ctx``: passed as ``fn(batch, ctx)`` when ``fn`` wants it."""
    with_ctx = ctx is not None and wants_context(fn)
    try:
        raw = policy.call(_call, fn, batch, pandas, ctx if with_ctx else None)
    except StageContractError:
        raise
    except Exception as e:
        if not bisect:
            raise
        return _isolate(fn, batch, where, e, schema, pandas, is_sink, policy,
                        ctx if with_ctx else None)  # fmt: skip
    return _normalize(raw, batch.num_rows, schema, pandas, is_sink)


def _call(fn: Callable[..., Any], batch: pa.RecordBatch, pandas: bool,
          ctx: BatchContext | None) -> Any:  # fmt: skip
    arg = batch.to_pandas() if pandas else batch
    return fn(arg) if ctx is None else fn(arg, ctx)


def _isolate(
    fn: Callable[..., Any],
    batch: pa.RecordBatch,
    where: str,
    e: Exception,
    schema: pa.Schema | None,
    pandas: bool,
    is_sink: bool,
    policy: ErrorPolicy,
    ctx: BatchContext | None,
) -> StageResult:
    """Bisection: the rows of ``batch`` whose calls raise, each failed with its text (and
    dead-lettered when its exception is fatal); halves are called once, without retries."""
    n = batch.num_rows
    if n <= 1:
        rows = np.arange(n, dtype=np.int64)
        return StageResult(
            None if is_sink else _to_arrow(None, schema, pandas),
            np.empty(0, np.int64),
            rows,
            [error_text(where, e)] * n,
            dead=rows if policy.fatal(e) or is_dead(e) else _NONE,
        )
    mid = n // 2
    parts = []
    for start, size in ((0, mid), (mid, n - mid)):
        half = batch.slice(start, size)
        sub = None if ctx is None else ctx.slice(start, size)
        try:
            raw = _call(fn, half, pandas, sub)
        except StageContractError:
            raise
        except Exception as e2:
            part = _isolate(fn, half, where, e2, schema, pandas, is_sink, policy, sub)
        else:
            part = _normalize(raw, size, schema, pandas, is_sink)
        parts.append((start, part))
    result = _concat(parts, schema if not is_sink else None)
    if is_sink:
        result.output = None
    result.extra_calls += 2
    return result
