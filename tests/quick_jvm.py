"""Quick-starting Spark JVMs for the tests: flags, and a class-data-sharing archive.

Most of the suite's time is Spark JVMs starting (the session fixture's, and those of the
jobs, demos, benchmarks, Connect servers and clusters the slow tests run as subprocesses),
on a CPU-bound two-core machine. Two things make a start cheaper, and neither changes what
Spark does:

- **Flags**: a test's JVM lives seconds to a minute, where C2's compiles cost more CPU than
  they save: C1 only, and the serial collector.
- **A dynamic CDS archive** (JDK 13+, ``-XX:ArchiveClassesAtExit`` once, then
  ``-XX:SharedArchiveFile``): the classes a Spark session loads, parsed and verified once
  per machine instead of in every JVM. It halves a ``local[2]`` session's start and its
  first job here. The archive is built by ``python -m tests.quick_jvm build`` (a small job
  touching the usual paths), keyed by the Java, PySpark and flags, cached under
  ``$XDG_CACHE_HOME/ftlayer-tests`` and shared by concurrent test processes through a lock.

Both reach every JVM started through ``spark-submit`` (PySpark drivers, the Connect server)
by ``SPARK_SUBMIT_OPTS``, which :func:`configure` sets in this process's environment for the
test session and its subprocesses. Two constraints of CDS shape the rest:

- a class path must hold no non-empty directory, and Spark's class path starts with
  ``SPARK_CONF_DIR``: it points at an empty directory of the cache (Spark's own defaults);
- a JVM whose class path differs from the archive's (a standalone cluster's daemons, which
  ignore ``SPARK_CONF_DIR``) ignores the archive silently (CDS logging is off) and starts
  as it would have without it.

Standalone executors are started by their worker, not by ``spark-submit``: a driver that
wants them quick sets ``spark.executor.extraJavaOptions`` to :data:`FLAGS` itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_BUILD_TIMEOUT_S = 300


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "ftlayer-tests"


def _key(java: str) -> str:
    """What the archive depends on: the JVM, PySpark's jars and the flags."""
    import pyspark

    version = subprocess.run(
        [java, "-version"], capture_output=True, text=True, timeout=60
    ).stderr
    jars = Path(pyspark.__file__).parent / "jars"
    names = sorted(p.name for p in jars.glob("*.jar")) if jars.is_dir() else []
    text = "\n".join([os.path.realpath(java), version, str(jars), *names, FLAGS])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _submit_opts(*extra: str) -> str:
    return " ".join([FLAGS, _QUIET, *extra])


def _build(archive: Path, conf_dir: Path) -> None:
    """Run the warm-up job in a JVM that writes the archive when it exits."""
    tmp = archive.with_suffix(f".{os.getpid()}.tmp")
    env = dict(os.environ)
    env.update(
        SPARK_CONF_DIR=str(conf_dir),
        SPARK_SUBMIT_OPTS=_submit_opts(f"-XX:ArchiveClassesAtExit={tmp}"),
        PYSPARK_PYTHON=sys.executable,
    )
    try:
        subprocess.run(
            [sys.executable, "-m", "tests.quick_jvm", "warm"],
            env=env,
            cwd=Path(__file__).resolve().parents[1],
            capture_output=True,
            timeout=_BUILD_TIMEOUT_S,
            check=True,
        )
        if tmp.is_file() and tmp.stat().st_size > 0:
            tmp.replace(archive)
    except (subprocess.SubprocessError, OSError):
        pass  # no archive: the JVMs start as they would without one
    finally:
        tmp.unlink(missing_ok=True)


def configure() -> None:
    """Set ``SPARK_CONF_DIR`` and ``SPARK_SUBMIT_OPTS`` for this process and its children,
    building the archive first if this machine has none (once; concurrent callers wait)."""
    if "SPARK_SUBMIT_OPTS" in os.environ:
        return  # set by the caller (or by a parent test process): theirs
    java = _java()
    cache = _cache_dir()
    conf_dir = cache / "spark-conf"  # empty, always: see the module's docstring
    conf_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("SPARK_CONF_DIR", str(conf_dir))
    opts = [FLAGS]
    if java is not None and os.environ["SPARK_CONF_DIR"] == str(conf_dir):
        archive = cache / f"spark-{_key(java)}.jsa"
        with open(cache / "build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not archive.is_file():
                _build(archive, conf_dir)
        if archive.is_file():
            opts = [_submit_opts(f"-XX:SharedArchiveFile={archive}")]
    os.environ["SPARK_SUBMIT_OPTS"] = " ".join(opts)


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
