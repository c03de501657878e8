"""``on_dead_letter``: hand each dead letter of a pipeline's source to a driver callback.

Every dead-lettering (lua/core/failures.lua ``dead_letter``, lua/segment_settle.lua) appends
(src, source) to its shard's dead-letter log, a stream capped at about ``DLQ_LOG_MAX``
entries. After each batch the driver reads the log from the source's cursor (kept in
Redis, per shard), calls the callback with each dead letter still held, then moves the
cursor: delivery is at least once (a driver that dies between the callback and the
cursor write calls it again for those after a restart) and in order per shard. A
callback that raises is logged with the record's id and not retried: the dead letter
itself stays in the dead letters, nothing is lost. A dead letter re-driven or purged
before the callback ran is skipped; one dead-lettered by the sidecar's timeouts after the
last batch is delivered after the next one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from ftlayer.persistence import DeadLetter

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer

__all__ = ["DeadLetterFeed"]

log = logging.getLogger(__name__)

PAGE = 1000
"""Log entries read per round trip."""


class DeadLetterFeed:
    """The dead letters of one source, for one callback."""

    def __init__(
        self, layer: FTLayer, source: int, callback: Callable[[DeadLetter], object]
    ) -> None:
        self.layer = layer
        self.source = source
        self.callback = callback

    def deliver(self) -> int:
        """Call the callback with every dead letter logged since the last call (see the
        module docstring). Returns how many it was given."""
        given = 0
        client, store = self.layer.client, self.layer.persistence
        for shard in range(len(self.layer.keyspace)):
            cursor_key = self.layer.keyspace[shard].dlqlog_cursor(self.source)
            after = cast(bytes | None, client.get(cursor_key)) or b"0"
            while entries := store.dead_letter_log(shard, after, PAGE):
                for _, src, source in entries:
                    if source == self.source and (letter := store.dead_letter(src)):
                        given += 1
                        self._give(letter)
                after = entries[-1][0]
                client.set(cursor_key, after)
        return given

    def _give(self, letter: DeadLetter) -> None:
        try:
            self.callback(letter)
        except Exception:
            log.exception("on_dead_letter raised source_id=%016x (it stays a dead letter)",
                          letter.source_id)  # fmt: skip
