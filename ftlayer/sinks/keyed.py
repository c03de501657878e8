"""What the idempotent sinks share: their key, the retry of a write, the counts.

A write is retried whole (it is one transaction or one commit, and it skips the rows
whose key the table holds, so a retry never inserts twice); what it inserted and skipped
is counted per sink object and process.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from ftlayer.backoff import jittered
from ftlayer.errors import ConfigError

__all__ = ["KeyedSink"]

log = logging.getLogger(__name__)


class KeyedSink:
    """Base of a sink keeping one row per ``(lineage, *key)``."""

    def __init__(self, lineage: str, key: Sequence[str], attempts: int) -> None:
        self.ft_lineage = lineage
        self.key = (lineage, *key)
        self.attempts = attempts
        self.inserted = self.skipped = 0
        """Rows this object inserted and skipped (as duplicates) in this process."""

    def check_key(self, batch: Any) -> None:
        """Refuse a batch without the key's columns, naming them."""
        missing = [k for k in self.key if k not in batch.schema.names]
        if missing:
            raise ConfigError(f"{self!r}: the batch has no column {missing} (its columns: "
                              f"{batch.schema.names})")  # fmt: skip

    def retried(self, write: Callable[[], int], errors: tuple[type[BaseException], ...],
                base_s: float, note: Callable[[int, BaseException], None]) -> int:  # fmt: skip
        """``write()`` tried up to ``attempts`` times while it raises one of ``errors``
        (``note(attempt, error)`` before each wait), with backoff."""
        backoff = jittered(base_s, 2.0)
        for attempt in range(self.attempts):
            try:
                return write()
            except errors as e:
                if attempt + 1 >= self.attempts:
                    raise
                note(attempt + 1, e)
                time.sleep(backoff.compute(attempt))
        raise AssertionError("unreachable")

    def counted(self, sent: int, inserted: int, where: str) -> None:
        """Count a write of ``sent`` rows that inserted ``inserted``."""
        self.inserted += inserted
        self.skipped += sent - inserted
        if inserted < sent:
            log.info("rows already written, skipped sink=%s skipped=%d", where, sent - inserted)
