"""Quick-starting Spark JVMs for the tests: flags, and a class-data-sharing archive.

Most of the suite's time is Spark JVMs starting (the session fixture's, and those of the
jobs, demos, benchmarks, Connect servers and clusters the slow tests run as subprocesses),
on a CPU-bound two-core machine. Two things make a start cheaper, and neither changes what
Spark does:

- **Flags**: a test's JVM lives seconds to a minute, where C2's compiles cost more CPU than
  they save: C1 only, and the serial collector.
- **A dynamic CDS archive** (JDK 13+, ``-XX:ArchiveClassesAtExit`` once, then
  ``-XX:SharedArchiveFile``): the classes a Spark JVM loads, parsed and verified once per
  machine instead of in every JVM. It halves a ``local[2]`` session's start and its first
  job here. The archive is built by ``python -m tests.quick_jvm build`` (a small job
  touching the usual paths, about a minute), keyed by the Java, PySpark and flags, cached
  under ``$XDG_CACHE_HOME/ftlayer-tests`` (the three last used kept) and shared by
  concurrent test processes through a lock.

:func:`configure` sets, for the test session and its subprocesses:

- ``SPARK_SUBMIT_OPTS``: every JVM started through ``spark-submit`` (PySpark drivers, local
  or on a standalone cluster; the Connect server);
- ``PYSPARK_SUBMIT_ARGS``: ``spark.executor.extraJavaOptions`` for the executors a
  standalone worker starts (a driver that sets that option itself replaces it);
- ``SPARK_DAEMON_JAVA_OPTS``: a standalone cluster's master and workers
  (ftlayer.spark.standalone adds it after its own).

A class path may hold no non-empty directory for CDS, and Spark's starts with its conf
directory: the archive is built, and used, with ``SPARK_CONF_DIR`` unset (PySpark's
``conf`` directory does not exist). A JVM whose class path differs from the archive's
ignores the archive silently (CDS logging is off) and starts as it would without it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_BUILD_TIMEOUT_S = 300
_KEEP = 3
"""Archives kept in the cache (the most recently used)."""
_VERSION = "2"
"""Bumped when the way the archive is built changes (its key then changes)."""


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "ftlayer-tests"


def _key(java: str) -> str:
    """What the archive depends on: the JVM, PySpark's jars (the class path) and flags."""
    import pyspark

    version = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=60
    ).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    text = "\n".join([_VERSION, os.path.realpath(java), version, str(jars), *names, FLAGS])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _build(archive: Path) -> None:
    """Run the warm-up job in a JVM that writes the archive when it exits; keep the
    last few archives (one per virtual environment and Java)."""
    tmp = archive.with_suffix(f".{os.getpid()}.tmp")
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONF_DIR"}
    env.update(SPARK_SUBMIT_OPTS=f"{FLAGS} {_QUIET} -XX:ArchiveClassesAtExit={tmp}",
               PYSPARK_PYTHON=sys.executable)  # fmt: skip
    try:
        subprocess.run([sys.executable, "-m", "tests.quick_jvm", "warm"], env=env,
                       cwd=Path(__file__).resolve().parents[1], capture_output=True,
                       timeout=_BUILD_TIMEOUT_S, check=True)  # fmt: skip
        if tmp.is_file() and tmp.stat().st_size > 0:
            tmp.replace(archive)
    except (subprocess.SubprocessError, OSError):
        pass  # no archive: the JVMs start as they would without one
    finally:
        tmp.unlink(missing_ok=True)
    old = sorted(archive.parent.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime)
    for path in old[:-_KEEP]:
        path.unlink(missing_ok=True)


def configure() -> None:
    """Set the JVMs' options for this process and its children (see the module's
    docstring), building the archive first if this machine has none (once; concurrent
    callers wait for it). Options already in the environment are left as they are."""
    if "SPARK_SUBMIT_OPTS" in os.environ:
        return  # set by the caller (or by a parent test process): theirs
    opts = FLAGS
    java = _java()
    if java is not None and "SPARK_CONF_DIR" not in os.environ:
        cache = _cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        archive = cache / f"spark-{_key(java)}.jsa"
        with open(cache / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not archive.is_file():
                _build(archive)
            if archive.is_file():
                os.utime(archive)  # used: kept
                opts = f"{FLAGS} {_QUIET} -XX:SharedArchiveFile={archive}"
    os.environ["SPARK_SUBMIT_OPTS"] = opts
    os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", opts)
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", shlex.join(
        ["--conf", f"spark.executor.extraJavaOptions={opts}", "pyspark-shell"]))


def _warm() -> None:
    """The archive's job: a local session through the paths the tests take (DataFrames,
    Python UDFs and Arrow, a shuffle, Parquet and JSON, observations, a streaming query)."""
    import pyarrow as pa
    from pyspark.sql import Observation, SparkSession
    from pyspark.sql import functions as F  # noqa: N812 (Spark's own spelling)

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .getOrCreate()
    )

    def double(batches):  # type: ignore[no-untyped-def]
        for b in batches:
            ids = b.column(0)
            yield pa.RecordBatch.from_pydict({"id": ids, "v": pa.compute.multiply(ids, 2)})

    with tempfile.TemporaryDirectory() as tmp:
        df = spark.range(2000).withColumn("k", F.col("id") % 7)
        obs = Observation("warm")
        keys = F.broadcast(spark.range(7).withColumnRenamed("id", "k"))
        out = (
            df.mapInArrow(double, "id long, v long")
            .join(keys, F.col("v") % 7 == F.col("k"))
            .repartition(4, "k")
            .observe(obs, F.count(F.lit(1)).alias("n"))
        )
        out.write.parquet(f"{tmp}/p")
        obs.get  # noqa: B018 (reads the observation)
        spark.read.parquet(f"{tmp}/p").groupBy("k").agg(F.sum("v")).collect()
        spark.range(100).select(F.udf(lambda x: x + 1, "long")("id")).collect()
        spark.range(100).selectExpr("to_json(struct(id)) AS value").write.text(f"{tmp}/j")
        stream = spark.readStream.schema("value string").json(f"{tmp}/j")
        query = (
            stream.select(F.get_json_object("value", "$.id").alias("id"))
            .writeStream.trigger(availableNow=True)
            .option("checkpointLocation", f"{tmp}/cp")
            .foreachBatch(lambda b, _id: b.write.mode("append").parquet(f"{tmp}/s"))
            .start()
        )
        query.awaitTermination()
        spark.createDataFrame([(1, "a")], "a int, b string").toPandas()
    spark.stop()


if __name__ == "__main__":
    if sys.argv[1:] == ["warm"]:
        _warm()
    elif sys.argv[1:] == ["build"]:
        configure()
        print(os.environ["SPARK_SUBMIT_OPTS"])
    else:
        sys.exit("usage: python -m tests.quick_jvm build|warm")
