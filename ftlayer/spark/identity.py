"""A row's identity and its record's lineage id, in numpy (tasks, the driver) and as Spark
Columns (DataFrame stages, computed in the JVM), side by side: the two must agree, and
``tests/spark/test_identity.py`` checks that they do, on generated rows, against a real
Spark.

The identity schemes a row can carry:

* a batch-local id in ``__ft_src`` (Python stages' fresh rows: bit 63 set, partition and
  row index; ftlayer.ids.batch_source_ids), or a replay's persisted id;
* a ``record_key`` column of the user's (Python stages);
* two identity columns, ``__ft_loc`` and ``__ft_pos``, tagged with :data:`IDENTITY`
  (DataFrame stages): a fresh row kept by reference (location, position), a fresh copy
  (null, its batch-local id) or a replay (null, its persisted id).

Lineage (ftlayer.lineage): a reference's ``xxhash64(source, location, position)``, a
copy's ``xxhash64(seed, batch-local id)``; a replay's was stored with it and is copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ftlayer.errors import ConfigError
from ftlayer.ids import LOCAL_BIT
from ftlayer.lineage import copy_lineage, reference_lineage
from ftlayer.spark.vector_plan import LOC_COL, POS_COL

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

    from ftlayer.spark.intake import Replays
    from ftlayer.spark.vector_plan import VectorPlan

__all__ = ["IDENTITY", "U64", "check_identity", "identity_columns", "identity_lost",
           "is_replay", "lineage_column", "lineage_of", "replay_rows", "with_lineage"]

IDENTITY = {"ftlayer": "identity"}
"""The metadata of the identity columns (``__ft_loc``, ``__ft_pos``): Spark carries a
column's metadata through projections, filters, joins, unions and shuffles, and drops it
from a column computed anew."""

U64 = (1 << 64) - 1
_LOCAL = int(LOCAL_BIT)


# -- replays among the identities ------------------------------------------------------------
def is_replay(loc: int | None, pos: int) -> bool:
    """One row's identity names a replay: no location, and a persisted record id (not a
    batch-local id, which names a copied row of this batch's source pass)."""
    return loc is None and not pos & U64 & _LOCAL


def replay_rows(has_loc: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """:func:`is_replay` of many rows (``has_loc``: a location is there; ``pos`` int64 or
    uint64): a boolean mask."""
    ids = np.asarray(pos).view(np.uint64)
    return ~np.asarray(has_loc, bool) & ((ids & np.uint64(_LOCAL)) == 0)


# -- lineage ids ----------------------------------------------------------------------------
def lineage_of(source: int, seed: int, has_loc: np.ndarray, loc: np.ndarray,
               pos: np.ndarray) -> np.ndarray:  # fmt: skip
    """The lineage ids of fresh rows by identity (int64; a replay's row gives 0: its id is
    stored, not computed): references hashed with ``source``, copies with ``seed``."""
    has_loc = np.asarray(has_loc, bool)
    pos64 = np.asarray(pos).view(np.int64)
    out = np.zeros(len(pos64), np.int64)
    if has_loc.any():
        out[has_loc] = reference_lineage(source, np.asarray(loc).view(np.int64)[has_loc],
                                         pos64[has_loc])  # fmt: skip
    copies = ~has_loc & (pos64 < 0)
    if copies.any():
        out[copies] = copy_lineage(seed, pos64[copies])
    return out


def lineage_column(source: int, seed: int, loc: Column, pos: Column) -> Column:
    """:func:`lineage_of` as a Column (null for a replay's row)."""
    from pyspark.sql import functions as F  # noqa: N812

    return (F.when(loc.isNotNull(), F.xxhash64(F.lit(source).cast("long"), loc, pos))
            .when(pos < 0, F.xxhash64(F.lit(seed).cast("long"), pos)))  # fmt: skip


# -- the identity columns of DataFrame stages ------------------------------------------------
def identity_columns(cache: dict[Any, Any]) -> list[Column]:
    """``__ft_loc`` and ``__ft_pos`` tagged with :data:`IDENTITY` (built once, kept in
    ``cache``: a Column is an expression, reused by every batch)."""
    from pyspark.sql import functions as F  # noqa: N812

    if "identity" not in cache:
        cache["identity"] = [F.col(LOC_COL).alias(LOC_COL, metadata=IDENTITY),
                             F.col(POS_COL).alias(POS_COL, metadata=IDENTITY)]  # fmt: skip
    return list(cache["identity"])


def identity_lost(df: DataFrame) -> tuple[str, str] | None:
    """(column, how) when ``df`` lacks a tagged identity column; None when both are there."""
    schema = df.schema
    for name in (LOC_COL, POS_COL):
        if name not in schema.fieldNames():
            return name, "dropped"
        if schema[name].metadata.get("ftlayer") != "identity":
            return name, "recomputed or aggregated"
    return None


def check_identity(unchecked: list[tuple[str, DataFrame]]) -> None:
    """The identity columns are still there, tagged, after the DataFrame stages
    ``unchecked`` ((label, output) each, in order; emptied when they pass): one schema read
    of the last one (a column's tag cannot come back once a stage dropped or recomputed
    it); if not, the first stage that lost them is named."""
    if unchecked and identity_lost(unchecked[-1][1]) is None:
        unchecked.clear()
    for label, out in unchecked:
        how = identity_lost(out)
        if how is not None:
            name, lost = how
            raise ConfigError(
                f"{label} {lost} ftlayer's identity column {name!r}: a DataFrame stage "
                "keeps __ft_loc and __ft_pos as they are (withColumn, select('*', ...), "
                "filters and joins do) and works row by row (no aggregation)")  # fmt: skip


def with_lineage(out: DataFrame, name: str, plan: VectorPlan, ft: bool,
                 replays: Replays | None) -> DataFrame:  # fmt: skip
    """``out`` with each row's lineage id in column ``name``, computed in the JVM from its
    identity (:func:`lineage_column`); a replay's is its stored one (a broadcast join with
    the batch's ``replays``); FT off (``ft`` False): a hash of Spark's row id."""
    from pyspark.sql import functions as F  # noqa: N812

    loc, pos = F.col(LOC_COL), F.col(POS_COL)
    if not ft:
        return out.withColumn(name, F.xxhash64(F.lit(plan.lineage_seed).cast("long"),
                                               F.monotonically_increasing_id()))
    lin = lineage_column(plan.source, plan.lineage_seed, loc, pos)
    if replays is not None and replays.rows:  # from the source, or entered at a stage
        rid, rlin = "__ft_replay_id", "__ft_replay_lin"
        known = replays.lineage.rename_columns([rid, rlin])
        out = out.join(F.broadcast(out.sparkSession.createDataFrame(known)),
                       pos == F.col(rid), "left")  # fmt: skip
        return out.withColumn(name, lin.otherwise(F.col(rlin))).drop(rid, rlin)
    return out.withColumn(name, lin)
