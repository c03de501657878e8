"""A row's identity and lineage (ftlayer.spark.identity): the numpy versions (tasks, the
driver) and the Column versions (DataFrame stages, in the JVM) agree, on generated rows,
with a real local Spark as the oracle.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.ids import batch_source_ids
from ftlayer.spark.identity import U64, is_replay, lineage_column, lineage_of, replay_rows

pytestmark = pytest.mark.spark


def _identities(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` identities of every kind: references (a location, any position), copies (no
    location, a batch-local id) and replays (no location, a persisted id: bit 63 clear),
    extremes included."""
    rng = np.random.default_rng(seed)
    kind = rng.integers(0, 3, n)
    loc = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    pos = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64, endpoint=True)
    copies = np.flatnonzero(kind == 1)
    pos[copies] = batch_source_ids(3, 0, len(copies)).view(np.int64)
    replays = np.flatnonzero(kind == 2)
    pos[replays] = rng.integers(1, 2**63 - 1, len(replays), dtype=np.int64)
    pos[:3], loc[:3], kind[:3] = [-(2**63), 2**63 - 1, 0], [2**63 - 1, -(2**63), 0], 0
    return kind == 0, loc, pos


def test_lineage_in_numpy_and_in_the_jvm_agree(spark: SparkSession) -> None:
    """``lineage_of`` (numpy) against ``lineage_column`` evaluated by Spark on the same
    3,000 generated identities, for two sources and seeds. Catches: a record kept by
    reference or copied getting one lineage id on the Python-stage path and another on
    the DataFrame-stage path (an idempotent sink would keep both of its rows), a replay
    given a computed lineage id instead of its stored one."""
    for source, seed, rows_seed in ((0, 0, 1), (65534, -(2**63) + 5, 2)):
        has_loc, loc, pos = _identities(3000, rows_seed)
        table = pa.table({"loc": pa.array(loc, mask=~has_loc), "pos": pa.array(pos)})
        got = spark.createDataFrame(table).select(
            lineage_column(source, seed, F.col("loc"), F.col("pos")).alias("lin")).toArrow()
        jvm = got.column("lin")
        want = lineage_of(source, seed, has_loc, loc, pos)
        replays = replay_rows(has_loc, pos)
        assert replays.any() and (~replays).any()
        assert jvm.is_null().to_numpy(zero_copy_only=False).tolist() == replays.tolist()
        fresh = np.flatnonzero(~replays)
        values = jvm.fill_null(0).to_numpy()  # int64 (with nulls it would be float64)
        assert values[fresh].tolist() == want[fresh].tolist()


def test_replay_identities_one_by_one_and_as_a_mask_agree() -> None:
    """``is_replay`` (one row, the driver reading observations) against ``replay_rows``
    (a mask, a Python stage's task). Catches: a replay's failure read as a fresh row's
    (stored again as a new record: a duplicate) or a copy's read as a replay's."""
    has_loc, loc, pos = _identities(2000, 3)
    mask = replay_rows(has_loc, pos)
    one = [is_replay(int(lo) if h else None, int(p))
           for h, lo, p in zip(has_loc, loc, pos, strict=True)]  # fmt: skip
    assert one == mask.tolist()
    assert not is_replay(None, int(batch_source_ids(0, 0, 1)[0]) & U64)
