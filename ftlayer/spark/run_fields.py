"""A batch run's fields, and the ``mapInArrow`` functions built once per query that read them.

On a classic session building a ``mapInArrow`` costs some 35 round trips to the JVM (the
function's pickle, its Java function, its columns): more than the rest of ftlayer's plan
of a micro-batch. So each Python stage's UDF is built once per query, over the names of
its input's columns (a Column is an expression, not bound to one DataFrame), and applied
to each batch's DataFrame in one round trip. What changes from one batch run to the next
-- :class:`RunFields`: the batch key, the run's salt, the lineage seed, whether the batch
ran before -- is then not in the function's pickle: it rides in a Spark local property
(:data:`BATCH_PROPERTY`) set while the batch's job runs (:func:`fields_set`), and the
tasks read it (:func:`current`). Under Spark Connect, where building a plan costs no
round trips and there is no SparkContext, each batch builds its own, the fields inside.

Invariants:

* A task never guesses a run's fields. A function that names the run's segments and
  summaries (a vectorized segment, :class:`~ftlayer.spark.vector_plan.VectorPlan`) fails
  its task when the job carries none; only a Python stage among DataFrame stages, which
  stores nothing under them, takes the safe ones (every row written before, no batch id)
  -- a user's sink may run its job on a thread of its own, which the property does not
  reach.
* A run's fields are set for its job only, and removed after it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["BATCH_PROPERTY", "RunFields", "current", "fields_set", "map_in_arrow"]

BATCH_PROPERTY = "ftlayer.batch"
"""The Spark local property a batch's job carries its :class:`RunFields` in."""


@dataclass(frozen=True)
class RunFields:
    """What one run of a batch is: ``batch_key`` (the batch id, as text), its ``salt``
    (summaries, edges, settle token; a new one every run), the ``lineage_seed`` of its
    copied rows, ``run_again`` (the batch id began before), and the labels of the stages
    whose breaker is open (ftlayer.spark.breakers: their tasks hold their rows)."""

    batch_key: str
    salt: int
    lineage_seed: int
    run_again: bool
    open_stages: tuple[str, ...] = ()

    @property
    def batch_id(self) -> int | None:
        """Spark's batch id (None: not an integer)."""
        return int(self.batch_key) if self.batch_key.isdigit() else None

    def encode(self) -> str:
        return json.dumps([self.batch_key, self.salt, self.lineage_seed, self.run_again,
                           list(self.open_stages)])

    @classmethod
    def decode(cls, text: str) -> RunFields:
        key, salt, seed, again, *rest = json.loads(text)
        return cls(str(key), int(salt), int(seed), bool(again), tuple(rest[0] if rest else ()))

    @classmethod
    def of(cls, plan: Any) -> RunFields:
        """A plan's (``VectorPlan``: its batch_key, salt, lineage_seed, run_again,
        open_stages)."""
        return cls(plan.batch_key, plan.salt, plan.lineage_seed, plan.run_again,
                   plan.open_stages)


def current() -> RunFields | None:
    """The fields of the run whose job this task belongs to (None: the job carries none,
    or this is not a Spark task)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    text = tc.getLocalProperty(BATCH_PROPERTY) if tc is not None else None
    return RunFields.decode(text) if text else None


def map_in_arrow(df: DataFrame, key: tuple[Any, ...], build: Callable[[RunFields | None],
                 tuple[Any, Any]], run: RunFields, cache: dict[Any, Any]) -> DataFrame:  # fmt: skip
    """``df.mapInArrow(fn, schema)`` where ``build(fields)`` gives ``(fn, schema)`` --
    ``fields`` None: the function that reads its run's fields from the job. On a classic
    session it is built once per query, kept in ``cache`` under ``key`` and the names of
    ``df``'s columns (``key`` names what the function is: the same key, the same
    function; objects it names by ``id`` are kept with it, so no other takes their id);
    under Spark Connect each batch builds its own with ``run`` inside."""
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.pandas.functions import pandas_udf
    from pyspark.util import PythonEvalType

    from ftlayer.spark.preflight import is_connect

    if is_connect(df.sparkSession):
        return df.mapInArrow(*build(run))
    names = tuple(df.columns)
    full = ("mapInArrow", key, names)
    if full not in cache:
        fn, schema = build(None)
        udf = pandas_udf(fn, returnType=schema,  # type: ignore[call-overload]
                         functionType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
        quoted = [F.col("`" + n.replace("`", "``") + "`") for n in names]
        cache[full] = (fn, udf(*quoted)._jc)
    return DataFrame(df._jdf.mapInArrow(cache[full][1], False, None), df.sparkSession)


@contextmanager
def fields_set(spark: Any, run: RunFields, wanted: bool = True) -> Iterator[None]:
    """While the block runs (a batch's job), ``run`` in the local property the tasks read;
    removed after. Nothing to set when not ``wanted`` (no function of the job reads it),
    or under Spark Connect (its functions carry their run)."""
    from ftlayer.spark.preflight import is_connect

    if not wanted or is_connect(spark):
        yield
        return
    sc = spark.sparkContext
    sc.setLocalProperty(BATCH_PROPERTY, run.encode())
    try:
        yield
    finally:
        sc.setLocalProperty(BATCH_PROPERTY, None)
