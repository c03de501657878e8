"""Spark is the oracle: the mirrors must equal Spark's own hashes and placements.

One DataFrame per type family (a few thousand seeded rows, edges included, with nulls);
each comparison is one Spark job over the whole family.
"""

from __future__ import annotations

import datetime
import functools
import random
from collections.abc import Callable
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from partitioners import HashPartitioner, spark_murmur3, spark_xxhash64
from tests.partitioning import pdata

pytestmark = pytest.mark.spark

N = 2000
R = random.Random


def _cols(rng: random.Random, makers: list[Callable[[random.Random], list[Any]]]) -> list[list]:
    return [pdata.with_nulls(rng, make(rng)) for make in makers]


FAMILIES: dict[str, tuple[list[str], Callable[[random.Random], list[list[Any]]]]] = {
    "integers": (
        ["tinyint", "smallint", "int", "bigint"],
        lambda r: _cols(r, [lambda r, k=k: pdata.ints(r, k, N) for k in pdata.INT_RANGES]),
    ),
    "bigint": (["bigint"], lambda r: _cols(r, [lambda r: pdata.ints(r, "bigint", N)])),
    "string": (["string"], lambda r: _cols(r, [lambda r: pdata.strings(r, N)])),
    "binary": (["binary"], lambda r: _cols(r, [lambda r: pdata.binaries(r, N)])),
    "boolean": (
        ["boolean"],
        lambda r: _cols(r, [lambda r: [r.random() < 0.5 for _ in range(N)]]),
    ),
    "float": (["float"], lambda r: _cols(r, [lambda r: pdata.floats(r, N)])),
    "double": (["double"], lambda r: _cols(r, [lambda r: pdata.doubles(r, N)])),
    "date": (["date"], lambda r: _cols(r, [lambda r: pdata.dates(r, N)])),
    "timestamps": (
        ["timestamp", "timestamp", "timestamp_ntz"],
        lambda r: _cols(
            r,
            [
                lambda r: pdata.timestamps(r, N, aware=True),
                lambda r: pdata.timestamps(r, N, aware=False),
                lambda r: pdata.timestamps(r, N, aware=False),
            ],
        ),
    ),
    "decimals": (
        ["decimal(18,4)", "decimal(5,0)", "decimal(19,0)", "decimal(38,10)"],
        lambda r: _cols(
            r,
            [
                lambda r: pdata.decimals(r, N, 18, 4),
                lambda r: pdata.decimals(r, N, 5, 0),
                lambda r: pdata.decimals(r, N, 19, 0),
                lambda r: pdata.decimals(r, N, 38, 10),
            ],
        ),
    ),
    "string_bigint": (
        ["string", "bigint"],
        lambda r: _cols(r, [lambda r: pdata.strings(r, N), lambda r: pdata.ints(r, "bigint", N)]),
    ),
    "int_string_double": (
        ["int", "string", "double"],
        lambda r: _cols(
            r,
            [
                lambda r: pdata.ints(r, "int", N),
                lambda r: pdata.strings(r, N),
                lambda r: pdata.doubles(r, N),
            ],
        ),
    ),
}


@functools.cache
def family(spark: SparkSession, name: str) -> tuple[DataFrame, list[str], list[str], list[tuple]]:
    """(DataFrame with ``id`` and key columns ``k0…``, types, key column names, keys by id)."""
    types, make = FAMILIES[name]
    columns = make(R(f"family-{name}"))
    keys = list(zip(*columns, strict=True))
    names = [f"k{i}" for i in range(len(types))]
    ddl = ", ".join(["id bigint"] + [f"{c} {t}" for c, t in zip(names, types, strict=True)])
    df = spark.createDataFrame([(i, *key) for i, key in enumerate(keys)], ddl)
    return df, types, names, keys


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_murmur3_and_xxhash64_match_spark(spark: SparkSession, name: str) -> None:
    df, types, names, keys = family(spark, name)
    exprs = [F.hash(*names).alias("h"), F.xxhash64(*names).alias("x")]
    for i, c in enumerate(names):
        exprs += [F.hash(c).alias(f"h{i}"), F.xxhash64(c).alias(f"x{i}")]
    rows = df.select("id", *exprs).collect()
    assert len(rows) == len(keys)
    for row in rows:
        key = keys[row["id"]]
        assert spark_murmur3(key, types) == row["h"], (key, types)
        assert spark_xxhash64(key, types) == row["x"], (key, types)
        for i, (v, t) in enumerate(zip(key, types, strict=True)):
            assert spark_murmur3((v,), [t]) == row[f"h{i}"], (v, t)
            assert spark_xxhash64((v,), [t]) == row[f"x{i}"], (v, t)


@pytest.mark.parametrize("n", [1, 7, 16, 200])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_hash_partitioner_matches_repartition(spark: SparkSession, name: str, n: int) -> None:
    df, types, names, keys = family(spark, name)
    rows = df.repartition(n, *names).select("id", F.spark_partition_id().alias("p")).collect()
    assert len(rows) == len(keys)
    partitioner = HashPartitioner(n, types)
    for row in rows:
        key = keys[row["id"]]
        assert partitioner.partition(key) == row["p"], key
        assert partitioner.select(spark_murmur3(key, types), 0) == (row["p"],)


def test_inferred_types_match_spark(spark: SparkSession) -> None:
    """Without a schema both PySpark and the mirror infer bigint/double/string/…"""
    rng = R("inferred")
    n = 500
    cols: list[list[Any]] = [
        pdata.ints(rng, "bigint", n),
        pdata.doubles(rng, n),
        pdata.strings(rng, n),
        pdata.binaries(rng, n),
        [rng.random() < 0.5 for _ in range(n)],
        pdata.dates(rng, n),
        pdata.timestamps(rng, n, aware=True),
        pdata.decimals(rng, n, 38, 18),
    ]
    cols = [pdata.with_nulls(rng, c) for c in cols]
    keys = list(zip(*cols, strict=True))
    names = [f"k{i}" for i in range(len(cols))]
    df = spark.createDataFrame([(i, *k) for i, k in enumerate(keys)], ["id", *names])
    assert [f.dataType.simpleString() for f in df.schema.fields[1:]] == [
        "bigint",
        "double",
        "string",
        "binary",
        "boolean",
        "date",
        "timestamp",
        "decimal(38,18)",
    ]
    rows = df.select(
        "id",
        F.hash(*names).alias("h"),
        F.xxhash64(*names).alias("x"),
        F.hash(names[2], names[0]).alias("h20"),
    ).collect()
    for row in rows:
        key = keys[row["id"]]
        assert spark_murmur3(key) == row["h"], key
        assert spark_xxhash64(key) == row["x"], key
        assert spark_murmur3((key[2], key[0])) == row["h20"], key
    placed = df.repartition(16, *names).select("id", F.spark_partition_id().alias("p")).collect()
    inferred = HashPartitioner(16)
    for row in placed:
        assert inferred.partition(keys[row["id"]]) == row["p"]


def test_negative_zero_in_hash_and_repartition(spark: SparkSession) -> None:
    """-0.0 and 0.0 hash alike in ``hash()`` and are placed alike by ``repartition``."""
    df = spark.createDataFrame(
        [(0, 0.0, 0.0), (1, -0.0, -0.0), (2, float("nan"), float("nan"))],
        "id int, d double, f float",
    )
    rows = {
        r["id"]: r
        for r in df.repartition(200, "d", "f")
        .select(
            "id",
            F.hash("d").alias("hd"),
            F.hash("f").alias("hf"),
            F.spark_partition_id().alias("p"),
        )
        .collect()
    }
    assert rows[0]["hd"] == rows[1]["hd"] == spark_murmur3((-0.0,), ["double"])
    assert rows[0]["hf"] == rows[1]["hf"] == spark_murmur3((-0.0,), ["float"])
    assert (
        rows[0]["p"]
        == rows[1]["p"]
        == HashPartitioner(200, ["double", "float"]).partition((-0.0, -0.0))
    )
    assert rows[2]["p"] == HashPartitioner(200, ["double", "float"]).partition(
        (float("nan"), float("nan"))
    )


def test_collated_strings_are_placed_by_collation_key(spark: SparkSession) -> None:
    """Why collated strings are refused: ``hash()`` of a UTF8_LCASE string hashes its bytes,
    but ``repartition`` places it by its collation key ("ABC" with "abc"), so neither the
    stored hash code nor a byte-level mirror gives its partition."""
    words = ["ABC", "abc", "Abc", "xyz", "XYZ"]
    df = spark.createDataFrame([(w,) for w in words], "s string").select(
        "s", F.col("s").cast("string collate UTF8_LCASE").alias("c")
    )
    hashed = {r["s"]: r["h"] for r in df.select("s", F.hash("c").alias("h")).collect()}
    assert hashed == {w: spark_murmur3((w,), ["string"]) for w in words}
    placed = {
        r["s"]: r["p"]
        for r in df.repartition(200, "c").select("s", F.spark_partition_id().alias("p")).collect()
    }
    assert placed["ABC"] == placed["abc"] == placed["Abc"]
    assert placed["xyz"] == placed["XYZ"]
    byte_level = HashPartitioner(200, ["string"])
    assert byte_level.partition(("ABC",)) != byte_level.partition(("abc",))


def test_timestamps_follow_session_utc(spark: SparkSession) -> None:
    """The hash of a timestamp is its UTC microseconds, whatever the literal's zone."""
    ts = datetime.datetime(2024, 3, 1, 12, 0, 0, 123456, tzinfo=pdata.UTC)
    row = spark.sql(
        "SELECT hash(TIMESTAMP'2024-03-01 14:00:00.123456+02:00') AS h, "
        "hash(CAST(1709294400123456 AS BIGINT)) AS l"
    ).first()
    assert row is not None
    assert row["h"] == row["l"] == spark_murmur3((ts,), ["timestamp"])
