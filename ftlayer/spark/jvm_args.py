"""DataFrame calls whose JVM arguments are built once per query.

A micro-batch builds the same plan every time, and through PySpark each call that takes
columns or names pays for them again: a JVM ``Seq`` costs a py4j round trip per element and
a few more, and ``F.col`` resolves the active session and the functions class before its
own call (about eight round trips a column). These helpers keep the JVM arguments -- a
``Seq`` of columns or names, the ``Observation`` class -- in the query's ``cache``
(``BatchRun.columns``: a Column is an expression, reused by every batch) and make one round
trip per call.

Invariant: each helper builds the same DataFrame as the PySpark call it names; under Spark
Connect (plans are built client-side, no round trips) it is that call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame

__all__ = ["arrow_frame", "col", "drop", "observe", "repartition", "select"]


def _classic(df: DataFrame) -> bool:
    return hasattr(df, "_jdf")


def col(cache: dict[Any, Any], name: str) -> Column:
    """``F.col(name)``, built once."""
    from pyspark.sql import functions as F  # noqa: N812

    key = ("col", name)
    if key not in cache:
        cache[key] = F.col(name)
    return cache[key]


def _seq(cache: dict[Any, Any], key: Any, df: DataFrame, items: Sequence[Any]) -> Any:
    """The JVM ``Seq`` of ``items`` (names, or Columns: their expressions), built once."""
    from pyspark.sql.classic.column import _to_seq

    if key in cache:
        return cache[key]
    seq = _to_seq(df.sparkSession.sparkContext,
                  [c if isinstance(c, str) else c._jc for c in items])  # fmt: skip
    if key[-1] is not None:  # None: the columns are not the same next time
        cache[key] = seq
    return seq


def _frame(jdf: Any, df: DataFrame) -> DataFrame:
    from pyspark.sql import DataFrame as Frame

    return Frame(jdf, df.sparkSession)


def drop(df: DataFrame, names: Sequence[str], cache: dict[Any, Any]) -> DataFrame:
    """``df.drop(*names)``."""
    if not _classic(df):
        return df.drop(*names)
    return _frame(df._jdf.drop(_seq(cache, ("drop", *names), df, names)), df)


def select(df: DataFrame, cols: Sequence[str | Column], cache: dict[Any, Any],
           key: Any) -> DataFrame:  # fmt: skip
    """``df.select(*cols)``; ``key`` names ``cols`` in ``cache`` (the same key, the same
    columns)."""
    if not _classic(df):
        return df.select(*cols)
    if ("select", key) not in cache:  # Dataset.select takes Columns only
        cols = [col(cache, c) if isinstance(c, str) else c for c in cols]
    return _frame(df._jdf.select(_seq(cache, ("select", key), df, cols)), df)


def repartition(df: DataFrame, n: int, names: Sequence[str],
                cache: dict[Any, Any]) -> DataFrame:  # fmt: skip
    """``df.repartition(n, *names)``."""
    if not _classic(df) or not names:
        return df.repartition(n, *names)
    key = ("repartition", *names)
    cols = [] if key in cache else [col(cache, c) for c in names]
    return _frame(df._jdf.repartition(n, _seq(cache, key, df, cols)), df)


def observe(df: DataFrame, obs: Any, exprs: Sequence[Column], cache: dict[Any, Any],
            key: Any) -> DataFrame:  # fmt: skip
    """``df.observe(obs, *exprs)``, ``obs`` a new ``pyspark.sql.Observation``; ``key``
    names ``exprs`` in ``cache``. Classic PySpark: the JVM Observation is made as
    ``Observation._on`` makes it, from the class looked up once."""
    if not _classic(df):
        return df.observe(obs, *exprs)
    if "Observation" not in cache:
        jvm = df.sparkSession.sparkContext._jvm
        cache["Observation"] = (jvm, getattr(jvm, "org.apache.spark.sql.Observation"))
    jvm, cls = cache["Observation"]
    obs._jvm, obs._jo = jvm, cls(obs._name)
    rest = _seq(cache, ("observe", key), df, exprs[1:])
    return _frame(df._jdf.observe(obs._jo, exprs[0]._jc, rest), df)


def arrow_frame(spark: Any, table: pa.Table, cache: dict[Any, Any]) -> DataFrame:
    """``spark.createDataFrame(table)``. Classic PySpark: in two round trips, as
    ``SparkSession._create_from_arrow_table`` makes it (the table, cast to the Arrow
    schema Spark reads, written to a file of the context's and read by the JVM as one
    partition per batch), where ``createDataFrame`` reads seven settings and looks up its
    classes first: about 38 round trips, 30 ms. Tables with timestamps (localized with the
    session's time zone) and Spark Connect take ``createDataFrame`` itself."""
    import pyarrow as pa

    jvm = getattr(spark, "_jvm", None)
    if jvm is None or any(pa.types.is_timestamp(t) for t in table.schema.types):
        return spark.createDataFrame(table)
    from pyspark.sql import DataFrame as Frame
    from pyspark.sql.pandas.serializers import ArrowStreamSerializer
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    key = ("arrow_frame", table.schema)
    if key not in cache:
        schema = from_arrow_schema(table.schema)
        target = to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True,
                                 timezone="UTC", prefers_large_types=False)  # fmt: skip
        cache[key] = (schema, schema.json(), target, getattr(jvm, _SQL_UTILS))
    schema, text, target, utils = cache[key]
    batches = table.cast(target).to_batches(
        max_chunksize=int(cache.get("arrow_batch_rows", 10_000)))  # fmt: skip
    jiter = spark.sparkContext._serialize_to_jvm(
        batches, ArrowStreamSerializer(), utils.readArrowStreamFromFile,
        lambda: jvm.ArrowIteratorServer())  # fmt: skip
    df = Frame(utils.toDataFrame(jiter, text, spark._jsparkSession), spark)
    df._schema = schema
    return df


_SQL_UTILS = "org.apache.spark.sql.api.python.PythonSQLUtils"
