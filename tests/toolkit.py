"""Helpers every test file shares: the command line as a user runs it, polling, and a real
headless browser.

Server and backend fixtures live in ``conftest.py`` (``make_redis`` for a redis-server of a
test's own); real faults (a reply-dropping proxy, ``kill -9``) in ``faults.py``. Test files
import these modules as ``tests.<module>`` (pytest puts the repository root on
``sys.path``: ``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import IO, Any

from ftlayer import EmbeddedRedis

__all__ = ["CLI", "Started", "chromium", "cli", "ended", "replica_linked", "source_df",
           "start", "stop", "until"]

CLI = [sys.executable, "-m", "ftlayer.cli"]
"""``ftlayer`` as a user runs it, in this interpreter."""


def cli(
    *args: str, stdin: str | None = None, timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``ftlayer <args>`` in a process of its own; its exit status and output."""
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout_s,
                          input=stdin)  # fmt: skip


def until(
    check: Callable[[], Any],
    what: str | Callable[[], str],
    timeout_s: float = 15.0,
    pause: float = 0.1,
) -> Any:
    """Poll ``check`` until it returns something true, and return that; fail naming
    ``what`` after ``timeout_s`` (a callable ``what`` is called then, so the message can
    show the state the wait ended in)."""
    deadline = time.monotonic() + timeout_s
    while not (seen := check()):
        if time.monotonic() > deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout_s}s waiting for {described}")
        time.sleep(pause)
    return seen


def replica_linked(replica: EmbeddedRedis) -> bool:
    """Whether a ``--replicaof`` server's link to its master is up (for ``until``)."""
    client = replica.client()
    try:
        return bool(client.info("replication").get("master_link_status") == "up")
    finally:
        client.close()


def wide_host() -> str:
    """An address of this machine beyond loopback (its outward interface, found by routing a
    UDP socket, which sends nothing): what a sidecar bound for other pods listens on. A
    machine with no such interface answers ``0.0.0.0``."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: routed, never reached
            host = str(s.getsockname()[0])
        except OSError:
            return "0.0.0.0"
    return "0.0.0.0" if host.startswith("127.") else host


def chromium() -> Any:
    """A real headless Chromium under Selenium (Debian's ``chromium`` and
    ``chromium-driver``); the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert binary and driver, "Debian's chromium and chromium-driver must be installed"
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                 "--window-size=1280,900"):  # fmt: skip
        opts.add_argument(flag)
    return webdriver.Chrome(options=opts, service=Service(driver))


def source_df(spark: Any, n: int, keys: int = 29, parts: int = 3) -> Any:
    """The source most Spark tests run: ``n`` rows of ``id`` (0..n-1), ``key`` (id % keys)
    and ``amount`` (id % 100), in ``parts`` partitions."""
    from pyspark.sql import functions as F  # noqa: N812

    return (spark.range(n)
            .select("id", (F.col("id") % keys).alias("key"), (F.col("id") % 100).alias("amount"))
            .repartition(parts))  # fmt: skip


Started = tuple[subprocess.Popen[str], IO[str], IO[str]]
"""A process started with its output in temporary files: (process, stdout, stderr)."""


def start(args: list[str], **kw: Any) -> Started:
    """Start ``args`` with its output in temporary files (a pipe nobody reads yet would
    stall it): for runs started side by side, each read once it has ended."""
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    return subprocess.Popen(args, stdout=out, stderr=err, text=True, **kw), out, err


def ended(started: Started, timeout: float) -> subprocess.CompletedProcess[str]:
    """A started process's outcome once it has ended (killed after ``timeout`` seconds),
    as ``subprocess.run(..., capture_output=True)`` gives it."""
    proc, *files = started
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    texts = []
    for f in files:
        f.seek(0)
        texts.append(f.read())
    return subprocess.CompletedProcess(proc.args, proc.returncode, *texts)


def stop(started: Started) -> None:
    """Kill a started process if it still runs (no test waited for it) and close its files."""
    proc, *files = started
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for f in files:
        f.close()
