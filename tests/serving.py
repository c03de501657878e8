"""A real ``ftlayer serve`` process for tests (ftlayer.service.process), with the tests'
short record timeout and lease."""

from __future__ import annotations

from pathlib import Path

from ftlayer.service.process import ServeProcess

T = 0.6  # record timeout of the tests that use it
LEASE_S = 1.5


class Serve(ServeProcess):
    """One `ftlayer serve` process (record timeout ``T``, lease ``LEASE_S`` by default)."""

    def __init__(self, url: str, namespace: str, log: Path, *extra: str,
                 timeout_s: float = T) -> None:  # fmt: skip
        super().__init__(url, namespace, log, *extra, timeout_s=timeout_s, lease_s=LEASE_S)
