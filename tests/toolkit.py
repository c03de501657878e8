"""Helpers every test file shares: the command line as a user runs it, and polling.

Server and backend fixtures live in ``conftest.py``; real faults (a reply-dropping proxy,
``kill -9``) in ``faults.py``.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["CLI", "cli", "until"]

CLI = [sys.executable, "-m", "ftlayer.cli"]
"""``ftlayer`` as a user runs it, in this interpreter."""


def cli(
    *args: str, stdin: str | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``ftlayer <args>`` in a process of its own; its exit status and output."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout_s,
                          input=stdin)  # fmt: skip


def until(check: Callable[[], Any], what: str, timeout_s: float = 15.0, pause: float = 0.1) -> None:
    """Poll ``check`` until it is true; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(pause)
