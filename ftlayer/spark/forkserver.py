"""A warm Python for the replay source's reader: a process that has PySpark and ftlayer
imported already forks each reader Spark asks for.

Spark starts the replay stream's reader in a new Python process at every query's start
(ftlayer.spark.source_launcher); importing PySpark, pyarrow, redis and ftlayer is most of
what that costs (about half a second on a fast machine). On Linux the launcher hands the
start to this server instead: its client (ftlayer.spark.fork_client, a Python started
with ``-S`` that imports only the standard library) passes its arguments, environment,
working directory and standard streams over a Unix socket; the server forks, and the
child takes them over and runs the module Spark named (``-m``) as ``__main__``. The child
writes its exit code to a pipe the client holds; the client exits with it, and passes on
the signals Spark sends it (``Process.destroy``: SIGTERM) to the child.

Invariants:

* The child runs what a plain start would have run: the same interpreter, the same
  PySpark files (the server is started with the launcher's ``PYTHONPATH``), Spark's
  arguments and environment; ``PYTHONPATH`` entries Spark adds (``--py-files``) are put
  first on ``sys.path``. Modules already imported stay imported: that is the gain.
* Nothing waits on the server: a client that cannot reach it, or gets no child from it,
  runs the plain start itself (``exec`` of the same Python with the same arguments).
* The server lives as long as the driver that started it (it exits when its standard
  input, a pipe from the driver, closes: also on ``kill -9`` of the driver); its children
  are reaped by the kernel (SIGCHLD ignored) and outlive it only as long as Spark keeps
  their socket open.
* The socket is in the launcher's private directory (``tempfile.mkdtemp``: mode 0700),
  bound by the driver before the server starts: a client that comes while the server
  imports waits in its backlog, it never finds the socket missing.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["PRELOADED", "Forkserver", "serve"]

PRELOADED = (
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyspark.sql.worker.create_data_source",
    "ftlayer.spark.replay_stream",
    "encodings.idna",  # a host name's lookup (socket.getaddrinfo)
    "secrets",  # redis-py's connection pool, lazily
)
"""What the server imports before it forks anything: the modules the replay source's
reader and its planner run (Spark runs them with ``-m``), the source itself, and what
its first Redis connection imports on the way."""

HEADER = struct.Struct("!I")
"""A request: its JSON body's length, sent with the client's four descriptors (standard
input, output, error, and the write end of its exit-code pipe); then the body. The reply:
the child's pid, 8 bytes (none: no child, the client starts Python itself)."""
PID = struct.Struct("!q")
MAX_BODY = 16 << 20


class Forkserver:
    """The driver's handle on its server: started once per launcher directory, started
    again if it died (a query then starts its reader the plain way meanwhile)."""

    def __init__(self, home: Path, python: str, pythonpath: str) -> None:
        self.home, self.python, self.pythonpath = home, python, pythonpath
        self.socket = home / "forkserver.sock"
        self.log = home / "forkserver.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def running(self) -> bool:
        """Whether the server is up (started again here if it is not)."""
        if self.proc is not None and self.proc.poll() is None:
            return True
        self.socket.unlink(missing_ok=True)
        env = {**os.environ, "PYTHONPATH": self.pythonpath,  # hashing as Spark's workers
               "PYTHONHASHSEED": os.environ.get("PYTHONHASHSEED", "0")}  # fmt: skip
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener, \
                open(self.log, "ab") as log:  # fmt: skip
            listener.bind(str(self.socket))  # bound here: a client never finds it missing
            listener.listen(64)
            fd = listener.fileno()
            self.proc = subprocess.Popen(
                [self.python, "-m", "ftlayer.spark.forkserver", str(fd)],
                stdin=subprocess.PIPE, stdout=log, stderr=log, env=env, pass_fds=(fd,),
                cwd=str(self.home))  # fmt: skip
        return False

    def stop(self) -> None:
        """Close the server's input (it exits) and wait for it."""
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def serve(fd: int) -> None:
    """Take over the listening socket ``fd`` (bound and listening: the driver made it),
    import :data:`PRELOADED`, then fork a child per request until standard input closes.
    Requests that arrive while the imports run wait in the socket's backlog."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reaped by the kernel
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the driver's to handle
    listener = socket.socket(fileno=fd)
    started = time.monotonic()
    for module in PRELOADED:
        try:
            __import__(module)
        except Exception as e:  # noqa: BLE001 (its children import it themselves)
            _say(f"could not preload {module}: {e!r}")
    try:
        _warm()
    except Exception as e:  # noqa: BLE001 (its children do it themselves)
        _say(f"could not warm up: {e!r}")
    _say(f"ready in {time.monotonic() - started:.2f}s, pid {os.getpid()}")
    events = selectors.DefaultSelector()
    events.register(listener, selectors.EVENT_READ, "accept")
    events.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    while True:
        for key, _ in events.select():
            if key.data == "parent" and not os.read(sys.stdin.fileno(), 4096):
                return  # the driver is gone
            if key.data == "accept":
                conn, _ = listener.accept()
                with conn:
                    _serve_one(conn, listener)


def _warm() -> None:
    """Do once, before forking, what every reader's first offset did again: read the
    Lua scripts' text (cached). (redis-py's version is not looked up per connection:
    ftlayer.connection gives every client one DriverInfo.)"""
    from ftlayer.scripts import SCRIPTS, library_source, script_source

    library_source()
    for name in SCRIPTS:
        script_source(name)


def _serve_one(conn: socket.socket, listener: socket.socket) -> None:
    """Read one request and fork its child; a malformed request gets no reply (its
    client starts Python itself)."""
    fds: list[int] = []
    try:
        conn.settimeout(10)
        head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 4)
        if len(head) != HEADER.size or len(fds) != 4:
            return
        (size,) = HEADER.unpack(head)
        if size > MAX_BODY:
            return
        body = _read_exactly(conn, size)
        request = json.loads(body)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            listener.close()
            _become(request, fds, conn)
        _say(f"forked {pid}: {' '.join(request['argv'])}")
        conn.sendall(PID.pack(pid))
    except (OSError, ValueError, KeyError) as e:
        _say(f"request refused: {e!r}")
    finally:
        for fd in fds:
            os.close(fd)


def _become(request: dict[str, Any], fds: list[int], conn: socket.socket) -> None:
    """In the child: take over the client's streams, environment and working directory,
    run its module as ``__main__``, write the exit code to the client's pipe, exit."""
    import runpy
    import traceback

    code: Any = 0
    status = fds[3]
    try:
        conn.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            os.close(fd)
        os.set_inheritable(status, False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        added = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                 if p and p not in sys.path]  # fmt: skip
        sys.path[:0] = added
        argv = request["argv"]
        sys.argv = [argv[1], *argv[2:]]
        sys.modules.pop(argv[1], None)  # it runs anew as __main__; what it imports stays
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 (the child's error goes to Spark's log, as ever)
        traceback.print_exc()
        code = 1
    if not isinstance(code, int):
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed by the module, or its reader gone
            pass
    try:
        os.write(status, str(code).encode())
    finally:
        os._exit(code & 0xFF)


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        part = conn.recv(min(n - got, 1 << 16))
        if not part:
            raise ValueError("request cut short")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def _say(text: str) -> None:
    print(f"ftlayer forkserver: {text}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    serve(int(sys.argv[1]))
