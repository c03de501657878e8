"""The replay source's reader forked from a warm Python (ftlayer.spark.forkserver): real
processes, real signals, and a real query's reader (real Spark, real Redis, a real file
stream) seen in ``/proc``.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer.spark import fork_client, forkserver
from ftlayer.spark.forkserver import Forkserver
from ftlayer.spark.source_launcher import _servers, launcher
from tests.faults import stat_fields
from tests.spark.test_source_launcher import by_reference_pipeline
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"


def client(server: Forkserver, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """``python -m ...`` through the client of ``server``, as the launcher runs it."""
    cmd = [sys.executable, "-S", fork_client.__file__, str(server.socket), sys.executable,
           *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, **kw)


def forked(server: Forkserver) -> list[tuple[int, str]]:
    """The children ``server`` forked so far, from its log: (pid, arguments)."""
    out = []
    for line in server.log.read_text().splitlines():
        if ": forked " in line:
            pid, argv = line.split(": forked ", 1)[1].split(": ", 1)
            out.append((int(pid), argv))
    return out


@pytest.fixture
def server(tmp_path: Path) -> Any:
    s = Forkserver(tmp_path, sys.executable, os.environ.get("PYTHONPATH", ""))
    s.running()
    until(lambda: "ready" in (s.log.read_text() if s.log.exists() else ""), "server ready", 60)
    yield s
    s.stop()


def test_a_module_runs_in_a_fork_with_the_clients_streams_arguments_and_exit_code(
    server: Forkserver, tmp_path: Path
) -> None:
    """``-m json.tool`` run through the client reads the client's standard input, writes
    its standard output and error, sees its environment and working directory, and the
    client exits with the child's code -- and the server's log names the fork. Catches:
    streams not handed over (Spark's log loses the reader's errors), an exit code lost
    (Spark cannot tell a reader that failed), the server not used at all."""
    (tmp_path / "in.json").write_text('{"b": 1, "a": [2]}')
    ok = client(server, "-m", "json.tool", "--sort-keys", "in.json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout) == {"a": [2], "b": 1} and "\n    " in ok.stdout
    bad = client(server, "-m", "json.tool", "missing.json", cwd=tmp_path)
    assert bad.returncode != 0 and "missing.json" in bad.stderr
    piped = client(server, "-m", "json.tool", input='{"x": 3}')
    assert json.loads(piped.stdout) == {"x": 3}
    env = client(server, "-m", "ftlayer_probe_env", env={**os.environ, "PYTHONPATH": str(
        _probe(tmp_path)), "FT_PROBE": "seen"})  # fmt: skip
    assert env.returncode == 7, env.stderr
    assert env.stdout.split() == ["seen", str(tmp_path / "probe")], env.stdout
    assert [argv for _, argv in forked(server)] == [
        "-m json.tool --sort-keys in.json", "-m json.tool missing.json", "-m json.tool",
        "-m ftlayer_probe_env"]  # fmt: skip


def _probe(tmp_path: Path) -> Path:
    """A module on a PYTHONPATH of the client's own (as Spark adds ``--py-files``) that
    prints an environment variable and its directory, and exits 7."""
    d = tmp_path / "probe"
    d.mkdir()
    (d / "ftlayer_probe_env.py").write_text(
        "import os, sys\nprint(os.environ['FT_PROBE'])\n"
        "print(os.path.dirname(os.path.abspath(__file__)))\nsys.exit(7)\n")  # fmt: skip
    return d


def test_without_a_server_the_client_starts_python_itself_once(tmp_path: Path) -> None:
    """No server listening (dead, or never started): the client runs the same Python
    with the same arguments itself, once -- also a Python named without its path, as
    ``PYSPARK_PYTHON=python3`` names it. Catches: a query that cannot start its reader
    when the server died, a module run twice."""
    dead = Forkserver(tmp_path, sys.executable, "")
    marks = tmp_path / "marks"
    code = f"open({str(marks)!r}, 'a').write('x')"
    (tmp_path / "once.py").write_text(code)
    out = client(dead, "-m", "once", cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(
        tmp_path)})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert marks.read_text() == "x"
    python = Path(sys.executable)  # Spark's python as a bare name, found on the PATH
    bare = [python.name, "-S", fork_client.__file__, str(dead.socket), python.name, "-m", "once"]
    path = f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"
    out = subprocess.run(bare, capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(tmp_path), "PATH": path})
    assert out.returncode == 0, out.stderr
    assert marks.read_text() == "xx"


def test_a_signal_to_the_client_reaches_the_child(server: Forkserver) -> None:
    """Spark stops a reader by destroying the process it started (SIGTERM): the child
    the client stands for ends too, and the client exits. Catches: readers left running
    after their query stopped."""
    cmd = [sys.executable, "-S", fork_client.__file__, str(server.socket), sys.executable,
           "-m", "http.server", "0", "--bind", "127.0.0.1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until(lambda: forked(server), "the child forked", 30)
        (pid, _), = forked(server)
        assert stat_fields(pid) is not None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) != 0
        until(lambda: stat_fields(pid) is None, "the child gone", 30)
    finally:
        proc.kill()


def test_the_server_ends_with_its_driver_even_on_kill_9(tmp_path: Path) -> None:
    """The driver that started the server is killed (``kill -9``): the server exits (its
    input closed). Catches: warm servers piling up on a machine whose drivers crash."""
    script = (f"import sys, time; from pathlib import Path\n"
              f"from ftlayer.spark.forkserver import Forkserver\n"
              f"s = Forkserver(Path({str(tmp_path)!r}), sys.executable, '')\n"
              f"s.running(); print(s.proc.pid, flush=True); time.sleep(600)\n")  # fmt: skip
    driver = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None
        pid = int(driver.stdout.readline())
        until(lambda: "ready" in (tmp_path / "forkserver.log").read_text(), "ready", 60)
        driver.kill()
        driver.wait()
        until(lambda: stat_fields(pid) is None or stat_fields(pid)[0] == "Z",  # type: ignore[index]
              "the server gone", 30)  # fmt: skip
    finally:
        driver.kill()


def test_the_client_speaks_the_servers_protocol() -> None:
    """The client is a script of its own (standard library only): its framing must stay
    the server's. Catches: one side changed, every reader started the slow way."""
    assert fork_client.HEADER.format == forkserver.HEADER.format
    assert fork_client.PID.format == forkserver.PID.format


@pytest.mark.spark
def test_a_querys_reader_is_forked_from_the_warm_server(
    spark: SparkSession, make_ft: Any, tmp_path: Path
) -> None:
    """A by-reference stream's replay source: the reader Spark starts for the query is a
    child of the driver's warm server, alive while the query runs; a server killed
    (``kill -9``) is started again for the next query, whose reader it forks. Catches:
    the launcher not handing the start over (every query paying the imports again), a
    dead server never replaced."""
    python = launcher(spark)
    assert python is not None and _servers, "no warm server for a pip-installed PySpark"
    server = next(s for s in _servers if str(s.socket.parent) == str(Path(python).parent))
    pipeline = by_reference_pipeline(make_ft(), tmp_path)

    def run_query(name: str) -> int:
        before = len(forked(server))
        query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
                 .trigger(processingTime="200 milliseconds")
                 .option("checkpointLocation", str(tmp_path / name)).start())  # fmt: skip
        try:
            until(lambda: query.lastProgress is not None, "the query's first batch", 60)
            until(lambda: any(RUNNER in a for _, a in forked(server)[before:]), "its fork", 30)
            new = [(pid, argv) for pid, argv in forked(server)[before:] if RUNNER in argv]
            assert len(new) == 1, forked(server)
            pid = new[0][0]
            fields = stat_fields(pid)
            assert fields is not None and int(fields[1]) == server.proc.pid  # type: ignore[union-attr]
        finally:
            query.stop()
        until(lambda: stat_fields(pid) is None, "the reader gone with its query", 30)
        return pid

    run_query("ck1")
    assert server.proc is not None
    old = server.proc.pid
    os.kill(old, signal.SIGKILL)
    server.proc.wait()
    run_query("ck2")
    assert server.proc.pid != old
