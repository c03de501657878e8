"""A real ``ftlayer serve`` process for tests, with its HTTP endpoint."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

T = 0.6  # record timeout of the tests that use it
LEASE_S = 1.5


class Serve:
    """One `ftlayer serve` process."""

    def __init__(self, url: str, namespace: str, log: Path, *extra: str,
                 timeout_s: float = T) -> None:  # fmt: skip
        self.log = log
        cmd = [sys.executable, "-m", "ftlayer.cli", "serve", "--redis-url", url,
               "--namespace", namespace, "--timeout-s", str(timeout_s),
               "--lease-s", str(LEASE_S), "--metrics-port", "0", *extra]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=open(log, "ab"),
            text=True,  # noqa: SIM115
        )
        line = self.proc.stdout.readline()
        m = re.search(r"metrics at (http://\S+)/metrics", line)
        assert m, f"no metrics line: {line!r} {log.read_text()[-2000:]}"
        self.base = m.group(1)

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(timeout=30)
