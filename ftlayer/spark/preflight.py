"""Checks made once per Spark application, before its first batch: what would otherwise
surface as hundreds of lines of executor traces, or not at all.

* :func:`check_executors`: a one-row job whose Python UDF imports ftlayer on an executor
  and reports the interpreter it ran. Executors that cannot import it (Spark started them
  with another ``python3`` than the driver's: a venv not activated, a cluster image without
  ftlayer) or import another version are refused with one line naming the interpreter and
  the fixes. The UDF is pickled by value, so it runs where ftlayer is missing.
* :func:`check_redis_reachable`: an embedded Redis listens on 127.0.0.1 of the driver's
  machine; a Spark master that may place executors elsewhere (neither ``local`` nor on a
  loopback address) cannot use it, and is refused.

Invariant: each check runs at most once per application id (and master) per process;
a check that passed is never repeated, one that failed is raised again on the next try.
"""

from __future__ import annotations

import logging
import re
import types
import weakref
from typing import TYPE_CHECKING, Any

from ftlayer import __version__
from ftlayer.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from ftlayer.layer import FTLayer

__all__ = ["check_executors", "check_redis_reachable", "is_connect", "master_of"]

log = logging.getLogger(__name__)

_passed: set[str] = set()
_contexts: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
"""The layers (by id) whose checks passed, by classic SparkContext: what every batch
after the first looks up without asking the JVM for the application id."""


def is_connect(spark: Any) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")


def master_of(spark: SparkSession) -> str:
    """The Spark master URL (under Spark Connect: the server's)."""
    if is_connect(spark):
        return str(spark.conf.get("spark.master", "") or "")
    return str(spark.sparkContext.master)


def _app_id(spark: SparkSession) -> str:
    if is_connect(spark):
        return str(spark.conf.get("spark.app.id", "") or spark.session_id)  # type: ignore[attr-defined]
    return str(spark.sparkContext.applicationId)


def _local(master: str) -> bool:
    """True when every executor runs on this machine: ``local[...]``, or a master bound to
    a loopback address (workers elsewhere could not register with it)."""
    if master.startswith("local"):
        return True
    host = master.split("://", 1)[-1].split(",")[0].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def check_redis_reachable(spark: SparkSession, layer: FTLayer) -> None:
    """Refuse an embedded Redis (127.0.0.1 of this machine) under a master whose executors
    may run on other machines."""
    if layer.embedded is None:
        return
    master = master_of(spark)
    if not _local(master):
        raise ConfigError(
            f"ftlayer started an embedded Redis on {layer.embedded.url}, which executors "
            f"of master {master} on other machines cannot reach: set FTConfig(redis_url="
            "'redis://HOST:6379') to a Redis every executor can reach")


def _probe(_: Any) -> str:
    """Runs on an executor (pickled by value: see ``_by_value``); uses nothing of ours."""
    import sys

    try:
        import ftlayer  # noqa: F401

        return "ok\t" + ftlayer.__version__ + "\t" + sys.executable
    except Exception as e:  # noqa: BLE001 (reported to the driver, which raises)
        return "missing\t" + type(e).__name__ + ": " + str(e) + "\t" + sys.executable


def _by_value(fn: Any) -> Any:
    """A copy of ``fn`` that cloudpickle ships by value: its module is not importable, so
    the executor unpickles the code itself instead of importing ftlayer to find it."""
    # the module name comes from the globals' __name__
    return types.FunctionType(fn.__code__, {"__builtins__": __builtins__,
                                            "__name__": "ftlayer_executor_probe"},
                              fn.__name__)  # fmt: skip


_FIXES = ("run the executors with the driver's interpreter (PYSPARK_PYTHON or "
          "spark.pyspark.python, e.g. {driver}), ship a packed venv (venv-pack, "
          "spark-submit --archives env.tar.gz#env with PYSPARK_PYTHON=./env/bin/python), or "
          "use an image that has ftlayer installed")  # fmt: skip


def _cause(e: Exception) -> str:
    """The Python error inside a Spark exception (its last ``XxxError: ...`` line)."""
    lines = [ln.strip() for ln in str(e).splitlines()]
    errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception): ", ln)]
    return (errors[-1] if errors else next((ln for ln in lines if ln), repr(e)))[:300]


def check_executors(spark: SparkSession) -> None:
    """Refuse executors that cannot import ftlayer, or import another version: one line
    naming the interpreter they ran and the fixes. Once per application."""
    import sys

    from pyspark.sql import functions as F  # noqa: N812

    key = f"executors:{_app_id(spark)}"
    if key in _passed:
        return
    fixes = _FIXES.format(driver=sys.executable)
    fn = _by_value(_probe)
    try:
        if is_connect(spark):  # no RDDs there: a plain Python UDF
            probe = F.udf(fn, "string", useArrow=False)
            said = spark.range(1, numPartitions=1).select(probe("id").alias("p")).collect()[0][0]
        else:  # an RDD task: a SQL UDF's worker would be left behind cold for the next task
            said = spark.sparkContext.parallelize([0], 1).map(fn).first()
    except Exception as e:
        raise ConfigError(f"executors could not run Python ({_cause(e)}): {fixes}") from e
    kind, what, python = str(said).split("\t", 2)
    if kind != "ok":
        raise ConfigError(f"executors cannot import ftlayer (their interpreter {python}: "
                          f"{what}): {fixes}")  # fmt: skip
    if what != __version__:
        raise ConfigError(f"executors import ftlayer {what} ({python}), the driver runs "
                          f"{__version__}: install one version everywhere")  # fmt: skip
    log.info("executors import ftlayer %s python=%s", what, python)
    _passed.add(key)


def preflight(spark: SparkSession, layer: FTLayer | None) -> None:
    """Both checks, once per application (ftlayer.spark.driver calls it before a batch)."""
    context = None if is_connect(spark) else spark.sparkContext
    if context is not None and id(layer) in _contexts.get(context, ()):
        return
    key = f"app:{_app_id(spark)}:{id(layer)}"
    if key not in _passed:
        if layer is not None:
            check_redis_reachable(spark, layer)
        check_executors(spark)
        _passed.add(key)
    if context is not None:
        _contexts.setdefault(context, set()).add(id(layer))
