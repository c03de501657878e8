"""A throwaway PostgreSQL server for tests and benchmarks: ``initdb`` into a temporary
directory, ``pg_ctl`` on a free loopback port, stopped (or killed) by its owner.

Debian's ``postgresql`` package puts the binaries in ``/usr/lib/postgresql/<v>/bin``;
they are found there or on ``PATH``. PostgreSQL refuses to run as root: as root the
server runs as the ``postgres`` system user (``runuser``), its directory handed to it.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["LocalPostgres", "postgres_bin", "worker_connection"]

_CONNECTIONS: dict[tuple[int, int, str], Any] = {}


def worker_connection(url: str) -> Any:
    """One open connection per (process, thread, URL), kept for the process's life (a
    Spark Python worker reuses it for every task): the policy of PostgresSink, for a
    benchmark's plain PostgreSQL writes."""
    import psycopg

    k = (os.getpid(), threading.get_ident(), url)
    conn = _CONNECTIONS.get(k)
    if conn is None or conn.closed or conn.broken:
        conn = _CONNECTIONS[k] = psycopg.connect(url, autocommit=False)
    return conn


def postgres_bin(name: str) -> str:
    """The path of a PostgreSQL server binary (``initdb``, ``pg_ctl``)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found: install PostgreSQL (apt-get install "
                                "postgresql) or put its bin directory on PATH")  # fmt: skip
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalPostgres:
    """One PostgreSQL server on 127.0.0.1 (trust authentication, superuser ``postgres``,
    database ``postgres``); ``url`` names it. A context manager; ``kill()`` is a real
    ``kill -9`` of the postmaster, ``start()`` brings it back on the same port."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ftlayer-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self._as_root = os.geteuid() == 0
        if self._as_root:
            os.chmod(self.dir, 0o755)
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(postgres_bin("initdb"), "-D", str(self.data), "-U", "postgres",
                  "--auth=trust", "-E", "UTF8", "--no-sync")  # fmt: skip

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *cmd: str) -> None:
        if self._as_root:
            cmd = ("runuser", "-u", "postgres", "--", *cmd)
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=self.dir)
        if out.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed: {out.stderr.strip()[-2000:]}")

    def start(self) -> LocalPostgres:
        # fsync off: only a machine crash loses what it skips; a killed server keeps
        # every commit (synchronous_commit stays on: a commit is in the OS when it returns)
        opts = f"-p {self.port} -h 127.0.0.1 -k {self.dir} -c fsync=off"
        deadline = time.monotonic() + 30
        while True:  # after a kill: until the old backends have left its shared memory
            try:
                self._run(postgres_bin("pg_ctl"), "-D", str(self.data), "-o", opts, "-w",
                          "-t", "60", "-l", str(self.dir / "server.log"), "start")  # fmt: skip
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 1).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def kill(self) -> None:
        """``kill -9`` of the postmaster (its backends exit when they notice). Its lock
        file is removed once it is dead: a container whose init reaps no orphans keeps
        it a zombie, which PostgreSQL would take for a live server."""
        lock = self.data / "postmaster.pid"
        pid = int(lock.read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                break
            if state == "Z":
                break
            time.sleep(0.02)
        lock.unlink(missing_ok=True)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run(postgres_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate",
                          "-w", "stop")  # fmt: skip
            except RuntimeError:
                pass

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
