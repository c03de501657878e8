"""The replay stream's reader starts with PySpark's cached bytecode
(ftlayer.spark.source_launcher): real Spark (local[2]), real Redis, a real file stream,
the reader process Spark itself starts, seen in ``/proc``.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer.spark import FileSource
from ftlayer.spark.source_launcher import _checked, launcher
from tests.faults import descends
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def spark_python_path(spark: SparkSession) -> str:
    """The PYTHONPATH Spark gives the Python processes it starts: its zips first."""
    home = spark.sparkContext._jvm.java.lang.System.getenv("SPARK_HOME")  # type: ignore[union-attr]
    lib = Path(home, "python", "lib")
    return os.pathsep.join(str(p) for p in [lib / "pyspark.zip", *lib.glob("py4j-*-src.zip")])


def imported_from(python: str, env_path: str) -> list[str]:
    """Where ``python``, started as Spark starts it, imports pyspark and py4j from."""
    out = subprocess.run(
        [python, "-c", "import pyspark, py4j; print(pyspark.__file__); print(py4j.__file__)"],
        env={**os.environ, "PYTHONPATH": env_path}, capture_output=True, text=True,
        check=True, timeout=60)  # fmt: skip
    return out.stdout.split()


def test_the_launcher_imports_the_same_pyspark_from_its_package_not_the_zip(
    spark: SparkSession,
) -> None:
    """Started with the PYTHONPATH Spark gives it, the launcher's Python imports pyspark
    (and py4j) from the installed package Spark's zip came with, where plain Python
    imports them from the zip. Catches: a launcher that no longer applies to a pip
    install (every query's start back to compiling PySpark), one importing another
    PySpark than Spark's own (a path to a different package)."""
    python = launcher(spark)
    assert python is not None, "no launcher for a pip-installed PySpark"
    path = spark_python_path(spark)
    plain = imported_from(sys.executable, path)
    assert all(".zip" in p for p in plain), plain  # what Spark alone does
    quick = imported_from(python, path)
    assert not any(".zip" in p for p in quick), quick
    home = spark.sparkContext._jvm.java.lang.System.getenv("SPARK_HOME")  # type: ignore[union-attr]
    assert Path(quick[0]).resolve().parent == Path(home).resolve()
    assert launcher(spark) == python, "a second launcher for the same driver"


def reader_paths() -> list[list[str]]:
    """The PYTHONPATH of each streaming source reader started by this process's JVM."""
    mine, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if RUNNER.encode() not in cmd or not descends(int(name), mine):
            continue
        env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
        found.append(env.get("PYTHONPATH", "").split(os.pathsep))
    return found


def by_reference_pipeline(ft: Any, tmp_path: Path) -> Any:
    """A pipeline over one JSON file of 50 events kept by reference (its replay stream's
    batches read their claims themselves: the reader starts through the launcher)."""
    root = tmp_path / "in"
    root.mkdir()
    (root / "a.json").write_text("".join(json.dumps({"id": i, "key": i % 7}) + "\n"
                                         for i in range(50)))  # fmt: skip
    files = FileSource("json", str(root), "id long, key long")
    return (ft.pipeline(source=0, reads=files).map_batches(lambda b: b, "id long, key long")
            .sink_batches(lambda b: None))  # fmt: skip


def test_a_by_reference_streams_reader_runs_through_the_launcher(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """A by-reference stream's replay source (its batches read their claims themselves):
    the reader Spark starts for the query has the launcher's directory first on its
    PYTHONPATH. Catches: the replay source registered the plain way (every query's start
    paying about a second), the launcher used but not the one the session made."""
    pipeline = by_reference_pipeline(make_ft(), tmp_path)
    query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
             .trigger(processingTime="200 milliseconds")
             .option("checkpointLocation", str(tmp_path / "ck")).start())  # fmt: skip
    try:
        until(lambda: query.lastProgress is not None, "the query's first batch", 60)
        paths = reader_paths()
    finally:
        query.stop()
    python = launcher(spark)
    assert python is not None
    assert paths, "no streaming source reader found under this process"
    assert all(p[0] == str(Path(python).parent) for p in paths), paths


PATH_PROBE = """
import json, sys, pyspark, py4j
print(json.dumps({"path": sys.path, "pyspark": pyspark.__file__, "py4j": py4j.__file__}))
"""


def test_the_launcher_takes_sparks_own_archives_off_the_python_path(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Given the ``PYTHONPATH`` Spark gives its Python processes (Spark's own answer,
    ``PythonUtils.sparkPythonPath``: PySpark's zip, py4j's, the jar of Spark's core) and
    entries of the user's around them, the launcher's Python has none of Spark's archives
    on ``sys.path`` -- each costs the reader's start its directory read, again at every
    ``importlib.invalidate_caches`` and ``importlib.metadata`` lookup, about 0.3 s in all
    -- keeps every other entry in its order (an empty one too), and imports pyspark and
    py4j from the installed package. Catches: an archive left on the path (the start
    slow again), a user's entry dropped or moved, a path taken apart at its spaces."""
    jvm: Any = spark.sparkContext._jvm
    sparks = str(jvm.org.apache.spark.api.python.PythonUtils.sparkPythonPath())
    archives = sparks.split(os.pathsep)
    assert any(a.endswith(".jar") for a in archives), archives  # what the test is about
    python = launcher(spark)
    assert python is not None
    mine, spaced = tmp_path / "mine", tmp_path / "with space"
    mine.mkdir()
    spaced.mkdir()
    given = os.pathsep.join([str(mine), *archives, "", str(spaced)])
    out = subprocess.run([python, "-c", PATH_PROBE], env={**os.environ, "PYTHONPATH": given},
                         capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    seen = json.loads(out.stdout)
    assert not set(archives) & set(seen["path"]), seen["path"]
    entries = [p for p in seen["path"] if p in (str(mine), str(spaced), os.getcwd())]
    assert entries[:3] == [str(mine), os.getcwd(), str(spaced)], seen["path"]
    home = Path(jvm.java.lang.System.getenv("SPARK_HOME")).resolve()
    assert Path(seen["pyspark"]).resolve().parent == home
    assert ".zip" not in seen["py4j"], seen["py4j"]


def test_a_launcher_that_cannot_run_is_not_used(tmp_path: Path, caplog: Any) -> None:
    """A launcher the system will not execute (as in a temporary directory mounted
    ``noexec``) is found out before any query uses it: the source is then registered
    the way Spark does it, with a warning. Catches: every query of the session failing
    to start its replay source's reader."""
    script = tmp_path / "python"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o600)  # not executable, even by root
    with caplog.at_level("WARNING"):
        assert _checked(str(script)) is None
    assert "does not run" in caplog.text
    script.chmod(0o700)
    assert _checked(str(script)) == str(script)


DRIVER = """
import sys, time
from pathlib import Path
import pyspark
from ftlayer.spark.source_launcher import _make
print(Path(_make(Path(pyspark.__file__).parent, sys.executable)).parent, flush=True)
sys.stdin.read()  # until the test closes it: then atexit removes the directory
"""


def test_a_dead_drivers_launcher_directory_is_removed_by_the_next_driver(
        tmp_path: Path) -> None:  # fmt: skip
    """Two real driver processes make their launcher directories in one temporary
    directory; the first is killed with ``kill -9`` (its ``atexit`` never runs). The second
    removes the first's directory as it makes its own, and a sweep leaves a live driver's
    directory and one without a lock file (an older version's) alone. Breaks it catches: a
    driver that does not sweep (dead directories pile up), a lock not held (a live
    driver's directory removed under it), a directory removed for lacking the file. The
    temporary directory is deep: a warm reader's socket path would be too long for
    AF_UNIX there, and the launcher must start plainly rather than raise."""
    from ftlayer.spark.source_launcher import OWNER, sweep

    tmp_path = tmp_path / ("deep" * 20)
    tmp_path.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    older = tmp_path / "ftlayer-source-older"
    older.mkdir()
    (older / "python").write_text("#!/bin/sh\n")

    def driver() -> tuple[subprocess.Popen[str], Path]:
        p = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env)  # fmt: skip
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline().strip()
        assert line, p.stderr.read()[-3000:]
        return p, Path(line)

    first, first_home = driver()
    try:
        assert (first_home / OWNER).exists() and first_home.parent == tmp_path
        assert "fork_client" not in (first_home / "python").read_text()  # started plainly
        first.kill()
        first.wait(timeout=30)
        assert first_home.exists()  # killed: its atexit did not run
        second, second_home = driver()
        try:
            assert not first_home.exists()
            assert sweep(tmp_path) == []  # the second lives; the older one has no lock
            assert second_home.exists() and older.exists()
        finally:
            assert second.stdin is not None
            second.stdin.close()
            second.wait(timeout=30)
        assert not second_home.exists()  # it exited: its atexit removed it
    finally:
        for p in (first,):
            if p.poll() is None:
                p.kill()
