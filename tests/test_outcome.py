"""A stage's ``Outcome`` read into failed rows, outputs and the rows to dead-letter
(ftlayer.spark.outcome.run_stage), the way a task reads it: no Spark needed, the stage
is plain pyarrow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ftlayer.spark.outcome import Outcome, StageContractError, run_stage

SCHEMA = pa.schema([("id", pa.int64())])


def _batch(n: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array(np.arange(n) * 10)], schema=SCHEMA)


def _run(answer: Any, n: int = 8, sink: bool = False) -> Any:
    return run_stage(lambda b: answer, _batch(n), "s", schema=None if sink else SCHEMA,
                     is_sink=sink)  # fmt: skip


@pytest.mark.parametrize("failed", [
    np.array([False, True, False, False, True, False, False, True]),
    [7, 1, 4, 1],  # indices, unsorted, one twice
    pa.array([False, True, False, False, True, False, False, True]).to_numpy(
        zero_copy_only=False),
])  # fmt: skip
def test_failed_rows_leave_the_output_and_are_named_once_each(failed: Any) -> None:
    """Catches: a failed row kept in the output (or another dropped), a row named twice,
    however ``failed`` is given (a mask or indices)."""
    res = _run(Outcome(_batch(8), failed=failed, errors="bad"))
    assert res.failed.tolist() == [1, 4, 7] and res.errors == ["bad"] * 3
    assert res.output.column("id").to_pylist() == [0, 20, 30, 50, 60]
    assert res.parents.tolist() == [0, 2, 3, 5, 6]


def test_with_parents_a_failed_rows_children_all_leave() -> None:
    """Catches: only the first child of a failed parent removed."""
    out = pa.RecordBatch.from_arrays([pa.array([0, 1, 2, 3, 4, 5])], schema=SCHEMA)
    res = _run(Outcome(out, parents=[0, 0, 1, 2, 2, 3], failed=[2], errors="bad"), n=4)
    assert res.failed.tolist() == [2]
    assert res.output.column("id").to_pylist() == [0, 1, 2, 5]
    assert res.parents.tolist() == [0, 0, 1, 3]


def test_an_unconfirmed_row_that_also_failed_is_failed_only() -> None:
    """Catches: a row both failed and unconfirmed reported twice (replayed and left
    pending: two copies)."""
    res = _run(Outcome(None, failed=[2, 5], unconfirmed=[5, 6, 6]), sink=True)
    assert res.failed.tolist() == [2, 5] and res.unconfirmed.tolist() == [6]


def test_dead_letters_must_be_failed_rows() -> None:
    """Catches: ``dead_letter`` naming a row that did not fail accepted (it would be
    dropped from the output and never replayed)."""
    res = _run(Outcome(_batch(8), failed=[1, 3], dead_letter=[3], errors=["a", "b"]))
    assert res.dead.tolist() == [3] and res.errors == ["a", "b"]
    with pytest.raises(StageContractError, match="not in failed"):
        _run(Outcome(_batch(8), failed=[1], dead_letter=[2]))


@pytest.mark.parametrize(("answer", "match"), [
    (Outcome(None, failed=np.ones(3, bool)), "mask has 3 entries for 8 rows"),
    (Outcome(None, failed=[8]), "outside 0..7"),
    (Outcome(None, failed=[1, 2], errors=["one"]), "1 errors for 2 failed rows"),
])  # fmt: skip
def test_a_malformed_outcome_is_refused(answer: Outcome, match: str) -> None:
    """Catches: a mask or index that does not fit the batch taken for some other rows."""
    with pytest.raises(StageContractError, match=match):
        _run(answer, sink=True)
