"""Python stages among DataFrame stages, driver side: each stage's ``mapInArrow`` built once
per query, and the fields of a batch run its tasks read (ftlayer.spark.frame_tasks).

On a classic session building a ``mapInArrow`` costs some 35 round trips to the JVM (the
function's pickle, its Java function, its columns) -- more than ftlayer's whole plan of a
micro-batch otherwise. The UDF is built over the names of its input's columns (a Column
is an expression, not bound to one DataFrame) and applied to each batch's DataFrame in one
round trip. What changes from one run to the next (the batch id, the run id, whether the
batch ran before) is then not in its pickle: it rides in a Spark local property set while
the batch's job runs. Under Spark Connect, where a plan costs no round trips to build and
there is no SparkContext, each batch builds its own with the fields inside.

Invariant: a task that finds no fields (a sink running its job on a thread of its own)
takes the safe ones -- every row written before, no batch id -- never another run's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from ftlayer.spark.frame_tasks import BATCH_PROPERTY, PythonStep, answer_type, run_fields
from ftlayer.spark.identity import IDENTITY
from ftlayer.spark.preflight import is_connect

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from ftlayer.spark.vector_plan import VectorPlan

__all__ = ["map_in_arrow", "run_fields_set"]


def map_in_arrow(df: DataFrame, step: PythonStep, plan: VectorPlan,
                 cache: dict[Any, Any]) -> DataFrame:  # fmt: skip
    """``df.mapInArrow(step)`` for ``plan``'s run (``step`` without its fields), its
    identity tagged in its schema; on a classic session from the UDF kept in ``cache``
    (the query's)."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.util import PythonEvalType

    if is_connect(df.sparkSession):
        step = step.for_run(fields_of(plan))
        return df.mapInArrow(step, answer_type(step, IDENTITY))
    names = tuple(df.columns)
    key = ("mapInArrow", id(step.stage), step.label, step.inputs, step.output, step.policy,
           names)  # fmt: skip
    if key not in cache:
        udf = pandas_udf(step, returnType=answer_type(step, IDENTITY),  # type: ignore[call-overload]
                         functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
        quoted = [F.col("`" + n.replace("`", "``") + "`") for n in names]
        cache[key] = (step.stage, udf(*quoted)._jc)  # the stage kept: its id stays its own
    return DataFrame(df._jdf.mapInArrow(cache[key][1], False, None), df.sparkSession)


def fields_of(plan: VectorPlan) -> str:
    """The fields of ``plan``'s run, as :data:`~ftlayer.spark.frame_tasks.BATCH_PROPERTY`
    holds them."""
    batch_id = int(plan.batch_key) if plan.batch_key.isdigit() else None
    return run_fields(batch_id, plan.run_again, plan.salt)


@contextmanager
def run_fields_set(spark: Any, plan: VectorPlan, wanted: bool) -> Iterator[None]:
    """While the block runs (the batch's job), ``plan``'s run fields in the local property
    its Python stages' tasks read; removed after. ``wanted``: a stage was built once per
    query (else: nothing to set)."""
    if not wanted:
        yield
        return
    sc = spark.sparkContext
    sc.setLocalProperty(BATCH_PROPERTY, fields_of(plan))
    try:
        yield
    finally:
        sc.setLocalProperty(BATCH_PROPERTY, None)
