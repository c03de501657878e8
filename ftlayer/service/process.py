"""``ftlayer serve`` as a child process: what the demo, the cluster run and the tests start.

``ServeProcess`` starts the CLI (so what runs is exactly what an operator runs), waits for
the line naming its HTTP endpoint, and keeps reading its stdout in a daemon thread (a full
pipe would block the sidecar). Its stderr (the log) goes to ``log``. ``kill()`` is a
``kill -9``: the lease it held stays in Redis until it expires, which is the fault a
standby must take over from.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

__all__ = ["ServeProcess", "ServeStartError"]


class ServeStartError(RuntimeError):
    """The sidecar exited or printed no endpoint (the message holds its log's tail)."""


class ServeProcess:
    """One ``ftlayer serve --redis-url URL --namespace NS`` process with its HTTP endpoint
    on a free port (``base``: ``http://127.0.0.1:PORT``); ``extra`` are more CLI options."""

    def __init__(
        self,
        url: str,
        namespace: str,
        log: Path,
        *extra: str,
        timeout_s: float | None = None,
        lease_s: float = 3.0,
    ) -> None:
        self.log = log
        cmd = [sys.executable, "-m", "ftlayer.cli", "serve", "--redis-url", url,
               "--namespace", namespace, "--lease-s", str(lease_s), "--metrics-port", "0",
               *(["--timeout-s", str(timeout_s)] if timeout_s is not None else []),
               *extra]  # fmt: skip
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"metrics at (http://\S+)/metrics", line)
        if not m:
            self.stop()
            raise ServeStartError(f"ftlayer serve printed {line!r}; log: {self._log_tail()}")
        self.base = m.group(1)
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    @property
    def page(self) -> str:
        """The status page's URL."""
        return f"{self.base}/"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def get(self, path: str, timeout_s: float = 5.0,
            headers: dict[str, str] | None = None) -> tuple[int, str]:  # fmt: skip
        """(HTTP status, body) of ``path`` on its endpoint (redirects followed)."""
        ask = urllib.request.Request(self.base + path, headers=headers or {})
        try:
            with urllib.request.urlopen(ask, timeout=timeout_s) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def lease(self) -> str | None:
        """``"leader"`` or ``"standby"`` as its ``/readyz`` says; None when it is not ready
        (Redis unreachable) or does not answer."""
        try:
            status, body = self.get("/readyz", timeout_s=2.0)
        except OSError:
            return None
        if status != 200:
            return None
        return "leader" if "leader" in body else "standby" if "standby" in body else None

    def kill(self) -> None:
        """``kill -9``: no shutdown, the lease is left to expire."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """SIGTERM (it releases its lease and exits), SIGKILL after 30 s; the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def _log_tail(self) -> str:
        try:
            return " / ".join(self.log.read_text(errors="replace").splitlines()[-5:])
        except OSError:
            return ""

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(
        self, tp: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
