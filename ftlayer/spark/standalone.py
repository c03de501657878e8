"""A Spark standalone cluster on loopback, for runs that need more than one host.

``local[N]`` runs every task on one host, so some of Spark's behaviour never happens there:
a speculative copy of a task is never launched on the host of its running attempt
(TaskSetManager checks the host), and no executor can be lost alone. ``StandaloneCluster``
starts a master and N workers, each its own process (and process group), every worker on a
loopback address of its own (127.0.0.2, 127.0.0.3, ...: Linux routes all of 127.0.0.0/8 to
``lo``), so Spark sees N hosts. Executors run this interpreter (``PYSPARK_PYTHON``).

Used by the speculation and preflight tests and the cluster rehearsal
(benchmarks/cluster_e2e.py). A driver connects from its own process (one JVM per process)::

    with StandaloneCluster(workers=2, cores=1) as cluster:
        subprocess.run([sys.executable, "job.py", cluster.url], env=cluster.env())
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ftlayer.embedded import free_port

__all__ = ["StandaloneCluster", "StandaloneError", "StandaloneWorker", "spark_home"]

MASTER_HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""JVM options that start a JVM quicker on a small machine (the master's and workers')."""


class StandaloneError(RuntimeError):
    """The cluster did not come up (the message holds the tails of its logs)."""


def spark_home() -> str:
    """The Spark distribution PySpark ships (bin/spark-class, jars/)."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def _java_home() -> str | None:
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    return str(Path(java).resolve().parent.parent) if java else None


@dataclass
class StandaloneWorker:
    host: str
    pid: int
    log: Path
    proc: subprocess.Popen[bytes]
    killed: bool = False


class StandaloneCluster:
    """A master on ``master_host`` (127.0.0.1; another address of this machine makes a
    master whose executors could be elsewhere) and ``workers`` workers on 127.0.0.2.. with
    ``cores`` cores and ``memory`` each for executors. ``start()`` (or ``with``) returns
    once the master reports every worker ALIVE; ``stop()`` (or leaving the block,
    exceptions included) ends them all.
    ``daemon_java_opts``/``daemon_memory`` are the master's and workers' own JVM settings
    (the environment's ``SPARK_DAEMON_JAVA_OPTS``, if set, is added after them)."""

    def __init__(
        self,
        workers: int = 2,
        cores: int = 1,
        memory: str = "1g",
        *,
        daemon_java_opts: str = QUICK_JVM,
        daemon_memory: str = "256m",
        startup_timeout_s: float = 90.0,
        master_host: str = MASTER_HOST,
    ) -> None:
        if not 0 <= workers <= 250:
            raise ValueError("workers must be in 0..250 (one loopback address each)")
        self.master_host = master_host
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.daemon_java_opts, self.daemon_memory = daemon_java_opts, daemon_memory
        self.startup_timeout_s = startup_timeout_s
        self.home = spark_home()
        self.port = 0
        self.webui_port = 0
        self.dir: Path | None = None
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[StandaloneWorker] = []
        self._logs: list[IO[bytes]] = []

    # -- addresses and environments --------------------------------------------------------
    @property
    def url(self) -> str:
        return f"spark://{self.master_host}:{self.port}"

    @property
    def webui_url(self) -> str:
        return f"http://{self.master_host}:{self.webui_port}"

    def env(self, local_ip: str = MASTER_HOST) -> dict[str, str]:
        """The environment of a process of this cluster, or of a driver (its default)."""
        env = dict(os.environ)
        env.update(SPARK_HOME=self.home, SPARK_LOCAL_IP=local_ip, PYSPARK_PYTHON=sys.executable)
        env.pop("SPARK_CONF_DIR", None)
        java_home = _java_home()
        if java_home:
            env["JAVA_HOME"] = java_home
        return env

    def driver_conf(self) -> dict[str, str]:
        """Spark settings of a driver: this master, reachable by the executors on loopback."""
        return {
            "spark.master": self.url,
            "spark.driver.host": MASTER_HOST,
            "spark.driver.bindAddress": MASTER_HOST,
            "spark.pyspark.python": sys.executable,
        }

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> StandaloneCluster:
        self.dir = Path(tempfile.mkdtemp(prefix="ftlayer-standalone-"))
        try:
            self.port, self.webui_port = free_port(), free_port()
            opts = f"--host {self.master_host} --port {self.port} --webui-port {self.webui_port}"
            self.master = self._spawn("master", MASTER_CLASS, opts.split(), self.master_host)
            for k in range(self.n_workers):
                host = f"127.0.0.{k + 2}"
                work = self.dir / f"work-{k}"
                work.mkdir()
                opts = f"--host {host} --cores {self.cores} --memory {self.memory}"
                opts += f" --webui-port {free_port()}"
                args = [*opts.split(), "--work-dir", str(work), self.url]
                proc = self._spawn(f"worker-{k}", WORKER_CLASS, args, host)
                self.workers.append(
                    StandaloneWorker(host, proc.pid, self.dir / f"worker-{k}.log", proc)
                )
            self._wait_alive()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, cls: str, args: list[str], host: str) -> subprocess.Popen[bytes]:
        assert self.dir is not None
        log = open(self.dir / f"{name}.log", "wb")  # noqa: SIM115 -- closed in stop()
        self._logs.append(log)
        cmd = [os.path.join(self.home, "bin", "spark-class"), cls, *args]
        env = self.env(host)
        opts = (self.daemon_java_opts, env.get("SPARK_DAEMON_JAVA_OPTS", ""))  # the caller's last
        env.update(SPARK_DAEMON_JAVA_OPTS=" ".join(o for o in opts if o),
                   SPARK_DAEMON_MEMORY=self.daemon_memory)  # fmt: skip
        return subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.dir, start_new_session=True
        )

    def status(self) -> dict[str, Any]:
        """The master's state (its web UI's ``/json/``): workers, applications."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=5) as resp:
            return dict(json.load(resp))

    def alive_hosts(self) -> set[str]:
        return {w["host"] for w in self.status().get("workers", []) if w["state"] == "ALIVE"}

    def _wait_alive(self) -> None:
        want = {w.host for w in self.workers}
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            dead = [(n, p) for n, p in self._procs() if p.poll() is not None]
            if dead:
                raise StandaloneError(
                    f"{dead[0][0]} exited with {dead[0][1].returncode}\n" + self.log_tails()
                )
            try:
                if want <= self.alive_hosts():
                    return
            except (OSError, ValueError):
                # the master's web UI is not up yet, or is still attaching its handlers
                # (then /json/ is answered by the HTML page: seen once in CI)
                pass
            if time.monotonic() > deadline:
                raise StandaloneError(
                    f"workers {sorted(want)} not all ALIVE after {self.startup_timeout_s:.0f} s\n"
                    + self.log_tails()
                )
            time.sleep(0.25)

    def _procs(self) -> list[tuple[str, subprocess.Popen[bytes]]]:
        procs = [(f"worker-{k} ({w.host})", w.proc) for k, w in enumerate(self.workers)]
        return procs + ([("master", self.master)] if self.master else [])

    def log_tails(self, lines: int = 30) -> str:
        """The last ``lines`` lines of every process's log."""
        if self.dir is None or not self.dir.exists():
            return ""
        out = []
        for path in sorted(self.dir.glob("*.log")):
            tail = path.read_bytes().decode("utf-8", "replace").splitlines()[-lines:]
            out.append(f"--- {path.name} ---\n" + "\n".join(tail))
        return "\n".join(out)

    def kill_worker(self, i: int) -> None:
        """kill -9 worker ``i`` and its executors (children in its process group)."""
        w = self.workers[i]
        _killpg(w.pid, signal.SIGKILL)
        w.proc.wait()
        w.killed = True

    def stop(self) -> None:
        """SIGTERM every process group (workers first), SIGKILL what is left after 10 s."""
        procs = self._procs()
        for _, p in procs:
            _killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for _, p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _killpg(p.pid, signal.SIGKILL)  # the group: executors and Python workers too
            p.wait()
        for log in self._logs:
            log.close()
        self._logs.clear()
        self.workers, self.master = [], None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self, tp: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
