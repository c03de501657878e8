"""benchmarks.cluster_e2e, smaller: a Spark standalone cluster (2 workers), a Redis Cluster
with a replica per master and two sidecars; one worker, one Redis master and the lease
holder are killed with ``kill -9`` while micro-batches run, and nothing may be lost. Also:
Ctrl-C stops every process the run started.

The full run (``python -m benchmarks.cluster_e2e``: 20,000 records in 20 micro-batches)
is the same code with more records; CI runs 3,000 in 10.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import descends
from tests.toolkit import Started, ended, start, stop

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
OURS = ("redis-server", "org.apache.spark.deploy", "org.apache.spark.executor",
        "ftlayer.cli serve")  # fmt: skip


def _processes(tmp_path: Path, root: int, seen: dict[int, str]) -> dict[int, str]:
    """pid → command line of every process of the kinds the run starts (the driver's JVM,
    ``org.apache.spark.deploy.SparkSubmit``, among them) that is the run's: a descendant
    of ``root`` (the run's process), one that inherited the run's marker from ``_run``
    (a daemon, not a descendant), or one seen as the run's before (``seen``, same
    command line: orphaned when the run ended; redis-server rewrites its environment with
    its process title, so the marker is not found there). Another test's processes (a
    parallel worker's) are not the run's."""
    marker = f"FTLAYER_TEST_RUN={tmp_path}\0".encode()
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        pid = int(d.name)
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not any(k in cmd for k in OURS):
                continue
            if seen.get(pid) == cmd or marker in (d / "environ").read_bytes():
                out[pid] = cmd
                continue
        except OSError:
            continue
        if descends(pid, root):
            out[pid] = cmd
    return out


def _run(tmp_path: Path, *args: str) -> Started:
    env = {**os.environ, "FTLAYER_BENCH_RESULTS": str(tmp_path),
           "FTLAYER_TEST_RUN": str(tmp_path)}  # fmt: skip
    return start([sys.executable, "-m", "benchmarks.cluster_e2e", *args, "--logs",
                  str(tmp_path)], cwd=ROOT, env=env)  # fmt: skip


KILLS = [("delta", "settle"), ("postgres", "batch")]


@pytest.fixture(scope="module")
def kill_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[tuple[str, str], tuple[Started, Path]]]:
    """Both runs of the test below, started side by side (each waits on failovers and
    restarts for much of its time: alone one keeps about half of two cores busy)."""
    runs = {}
    for sink, moment in KILLS:
        tmp = tmp_path_factory.mktemp(f"kill-{sink}")
        runs[(sink, moment)] = (_run(tmp, "--records", "3000", "--batches", "10", "--sink", sink,
                                     "--master-kill-at", moment, "--json"), tmp)  # fmt: skip
    yield runs
    for started, _ in runs.values():
        stop(started)


@pytest.mark.parametrize(("sink", "moment"), KILLS)
def test_three_kill_9s_while_records_flow_and_nothing_is_lost(
    kill_runs: dict[tuple[str, str], tuple[Started, Path]], sink: str, moment: str
) -> None:
    """Through an idempotent sink: ``lost`` and ``duplicates`` are counted from the Delta
    / PostgreSQL table. ``settle``: the Redis master dies as the driver begins settling a
    micro-batch, so the driver's own writes meet the failover and must wait it out.
    Catches: records lost or written twice by a crash, a failover ending the query."""
    started, tmp_path = kill_runs[(sink, moment)]
    done = ended(started, 900)
    out, err = done.stdout, done.stderr
    assert done.returncode == 0, err[-4000:]
    r = json.loads(out.strip().splitlines()[-1])
    assert r["source_records"] == 3000 and r["micro_batches"] == 10
    assert r["lost"] == 0 and r["pending"] == 0, r
    assert r["sink"] == sink and r["duplicates"] == 0, r
    assert r["faults"][1]["detail"]["kill_at"] == moment
    assert r["fault_errors"] == [], r["fault_errors"]
    assert [f["kind"] for f in r["faults"]] == ["spark_worker", "redis_master", "sidecar"]
    for f in r["faults"]:
        assert f["recovery_s"] is not None and f["recovery_s"] > 0, f
        assert 0 < f["at_batch"] < 10, f"{f['kind']} was injected while batches ran"
    redis_fault = r["faults"][1]["detail"]
    assert redis_fault["failover_s"] is not None and redis_fault["rejoin_s"] is not None
    assert r["failovers"] == 1, "the killed master's replica took over"
    assert r["replayed"] > 0, "failed and unconfirmed records were replayed"
    cap = r["capacity"]
    assert cap["redis_usec_per_record_measured"] > 0 and cap["by_master"]
    assert cap["redis_usec_per_record_guide_batch_scope"] > 0
    assert cap["measured_vs_guide_batch_scope"] > 0 and cap["seconds_per_micro_batch"] > 0
    assert json.loads((tmp_path / "cluster_e2e.json").read_text()) == r


@pytest.mark.parametrize(("moment", "sig"), [("driver_starting", signal.SIGTERM),
                                             ("batches_running", signal.SIGINT)])
def test_ctrl_c_stops_everything_it_started(tmp_path: Path, moment: str, sig: int) -> None:
    """Ctrl-C exits 130 and leaves no process behind, wherever it lands: while batches run
    (py4j turns an interrupt inside a gateway call into a Py4JError), and while the
    driver's JVM starts (PySpark, interrupted there, leaves that JVM alive for good).
    SIGTERM stops it the same way (Python's default would leave the standalone cluster's
    JVMs running: seen when a test run was stopped; a CI run's SIGTERM landed while a slow
    machine started the driver, and its JVM was left)."""
    started = _run(tmp_path, "--records", "2000", "--batches", "40", "--faults", "")
    proc = started[0]
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 180
    # driver_starting: the driver's JVM (SparkSubmit) has just appeared;
    # batches_running: every kind of process is up (workers, Redis nodes, sidecars, and
    # the executors: the driver's session is up), then 5 s more for it to run batches
    wanted = ("SparkSubmit",) if moment == "driver_starting" else OURS
    while time.monotonic() < deadline:
        mine = _processes(tmp_path, proc.pid, seen)
        seen.update(mine)
        if all(any(k in c for c in mine.values()) for k in wanted):
            break
        assert proc.poll() is None, ended(started, 1).stderr[-3000:]
        time.sleep(0.2)
    else:
        raise AssertionError("the run never had all its processes up")
    if moment == "batches_running":
        time.sleep(5)
    seen.update(_processes(tmp_path, proc.pid, seen))
    proc.send_signal(sig)
    err = ended(started, 120).stderr
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted" in err
    end = time.monotonic() + 30
    while time.monotonic() < end:
        left = _processes(tmp_path, proc.pid, seen)
        if not left:
            break
        time.sleep(0.5)
    assert not left, f"still running after Ctrl-C: {left}"
