"""A streaming query whose micro-batches do not carry the replay stream: said, once.

A pipeline run by ``foreachBatch`` claims its queued replays when a micro-batch runs. Built
with ``pipeline.stream(spark)`` or ``pipeline.with_replays(stream)``, its query's input
carries the replay stream (ftlayer.spark.replay_stream), which makes Spark run a
micro-batch whenever replays are queued. Written as streaming jobs were before (the
source's own stream straight into ``foreachBatch``), micro-batches run only when new input
arrives: once the input stops, queued replays wait, with nothing saying why.

The driver (ftlayer.spark.driver) notices at the first such micro-batch: the batch runs
inside a streaming query (Spark's local property ``sql.streaming.queryId``, set on the
query's thread, which runs ``foreachBatch``; classic PySpark) and its DataFrame lacks the
replay stream's columns. It logs one WARNING naming the fix, and notes the source in Redis
(``Keyspace.unreplayed``) so that the status page (ftlayer.service.status) warns while that
source has queued replays. A micro-batch that carries the replay stream removes the note
(once per process). Batches of a static DataFrame, and those ``drain()`` runs, are not
streaming micro-batches: never warned. Core, not Spark: the sidecar reads the notes.

Invariant: this only says; it never changes what a batch runs or settles.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer

__all__ = ["Unreplayed", "warnings_of"]

log = logging.getLogger(__name__)

FIX = "build the query's input with pipeline.stream(spark) or pipeline.with_replays(stream)"


@dataclass
class Unreplayed:
    """What one driver said about its pipelines' streams (per source)."""

    warned: set[int] = field(default_factory=set)
    cleared: set[int] = field(default_factory=set)

    def seen(self, layer: FTLayer | None, source: int, name: str, carries_replays: bool,
             query_of: Callable[[], str | None]) -> None:  # fmt: skip
        """Look at one batch of ``source`` (its pipeline ``name``) before it runs: whether
        its input carries the replay stream, and (asked only when it matters) the id of
        the streaming query running it (None: none)."""
        if layer is None:
            return
        if carries_replays:
            if source not in self.cleared:
                self.cleared.add(source)
                self.warned.discard(source)
                _quietly(lambda: layer.client.hdel(layer.keyspace.unreplayed, str(source)))
            return
        if source in self.warned:
            return
        query = query_of()
        if query is None:  # a static DataFrame, a drain's batch, or Spark Connect
            return
        self.warned.add(source)
        self.cleared.discard(source)
        log.warning("pipeline %s (source %d) runs in streaming query %s, whose input does "
                    "not carry the replay stream: its queued replays run only when new "
                    "input arrives (or at drain()), and wait while the input is quiet; %s",
                    name, source, query, FIX)  # fmt: skip
        note = json.dumps({"pipeline": name, "query": query, "since": time.time()})
        _quietly(lambda: layer.client.hset(layer.keyspace.unreplayed, str(source), note))


def warnings_of(layer: FTLayer, queued_by_source: dict[int, int]) -> list[str]:
    """The status page's warnings: each noted source that has queued replays."""
    out = []
    for key, raw in sorted(layer.client.hgetall(layer.keyspace.unreplayed).items()):
        source = int(key)
        queued = queued_by_source.get(source, 0)
        if queued:
            note = json.loads(raw)
            out.append(f"source {source} (pipeline {note.get('pipeline')}): {queued:,} "
                       "replays queued, and its streaming query's input does not carry the "
                       f"replay stream: they wait for new input; {FIX}")  # fmt: skip
    return out


def _quietly(call: Any) -> None:
    """A note to Redis that may fail without failing the batch (it only informs)."""
    try:
        call()
    except redis.RedisError as e:
        log.debug("note of the replay stream's absence not written: %s", e)
