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
