"""The JVM-argument helpers build what the PySpark calls they name build (Spark is the
oracle: the same rows, the same placement, the same observed metrics), and keep their
arguments for the next batch."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Observation, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer.spark import jvm_args


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def test_drop_select_repartition_match_pyspark(spark: SparkSession) -> None:
    """Catches: a helper that drops, selects or places rows unlike the call it names."""
    text = F.concat(F.lit("x"), F.col("id").cast("string"))
    df = spark.range(500).select(F.col("id"), (F.col("id") % 7).alias("k"), text.alias("s"))
    cache: dict[Any, Any] = {}
    for _ in range(2):  # built, then reused
        assert _rows(jvm_args.drop(df, ("s", "k"), cache)) == _rows(df.drop("s", "k"))
        picked = jvm_args.select(df, ["s", F.col("id") + 1], cache, "picked")
        assert picked.columns == df.select("s", F.col("id") + 1).columns
        assert _rows(picked) == _rows(df.select("s", F.col("id") + 1))
        ours = jvm_args.repartition(df, 5, ("k",), cache).select("id", F.spark_partition_id())
        theirs = df.repartition(5, "k").select("id", F.spark_partition_id())
        assert _rows(ours) == _rows(theirs)
    assert ("drop", "s", "k") in cache and ("select", "picked") in cache
    assert ("repartition", "k") in cache


def test_observe_matches_pyspark_and_each_batch_gets_its_own(spark: SparkSession) -> None:
    """Catches: an observation reused across batches, or metrics unlike df.observe's."""
    cache: dict[Any, Any] = {}
    exprs = [F.count(F.lit(1)).alias("n"), F.sum("id").alias("total")]
    for n in (10, 20):
        df = spark.range(n)
        ours, theirs = Observation(f"ours-{n}"), Observation(f"theirs-{n}")
        jvm_args.observe(df, ours, exprs, cache, "sums").write.format("noop").mode(
            "overwrite").save()  # fmt: skip
        df.observe(theirs, *exprs).write.format("noop").mode("overwrite").save()
        assert ours.get == theirs.get == {"n": n, "total": n * (n - 1) // 2}
    assert ("observe", "sums") in cache


def test_columns_that_change_are_not_kept(spark: SparkSession) -> None:
    """Catches: a Seq kept under key None (a stage whose columns are built per batch)."""
    cache: dict[Any, Any] = {}
    obs = Observation("unkept")
    jvm_args.observe(spark.range(3), obs, [F.count(F.lit(1)).alias("n")], cache, None).count()
    assert obs.get == {"n": 3}
    assert not [k for k in cache if k != "Observation"]


def test_arrow_frame_matches_create_dataframe(spark: SparkSession) -> None:
    """Catches: a table made into other rows, types, nulls or partitions than
    ``createDataFrame`` makes (large and small tables, a schema built once then reused
    for new data, a timestamp left to createDataFrame's time zone handling)."""
    import datetime

    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(7)
    cache: dict[Any, Any] = {}
    for n in (0, 3, 2_500):
        ids = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
        body = [None if i % 5 == 0 else f'{{"0":{i}}}'.encode() for i in range(n)]
        table = pa.table({
            "__ft_body": pa.array(body, pa.binary()), "__ft_src": pa.array(ids),
            "att": pa.array(rng.integers(0, 9, n, dtype=np.int32)),
            "name": pa.array([f"r{i}" if i % 3 else None for i in range(n)], pa.string()),
            "total": pa.array(rng.normal(size=n)),
            "tags": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int64()))})  # fmt: skip
        ours, theirs = jvm_args.arrow_frame(spark, table, cache), spark.createDataFrame(table)
        assert ours.schema == theirs.schema
        assert ours.rdd.getNumPartitions() == theirs.rdd.getNumPartitions()
        assert _rows(ours.select("__ft_src", "__ft_body", "att", "name", "total")) == _rows(
            theirs.select("__ft_src", "__ft_body", "att", "name", "total"))  # fmt: skip
        assert ours.select(F.sum(F.size("tags"))).first() == theirs.select(
            F.sum(F.size("tags"))).first()  # fmt: skip
    assert len([k for k in cache if k[0] == "arrow_frame"]) == 1
    stamps = pa.table({"t": pa.array([datetime.datetime(2026, 11, 29, 12, 0, 0, 123456)])})
    assert _rows(jvm_args.arrow_frame(spark, stamps, cache)) == _rows(
        spark.createDataFrame(stamps))  # fmt: skip
