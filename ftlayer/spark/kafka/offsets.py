"""Offsets of Kafka topic-partitions, as Spark's Kafka source writes them in its checkpoint:
``{"topic": {"partition": offset}}`` (JSON; partitions as strings), the offset being the
next one to read. ``-2`` stands for the earliest offset and ``-1`` for the latest, in
``startingOffsets`` as in Spark's.

Pure functions: no client, no Spark (ftlayer.spark.kafka.client reads the watermarks).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

__all__ = ["EARLIEST", "LATEST", "Offsets", "TopicPartition", "dump", "limited", "load", "runs"]

EARLIEST, LATEST = -2, -1

TopicPartition = tuple[str, int]
Offsets = dict[TopicPartition, int]
"""(topic, partition) -> the next offset to read."""


def load(text: str | Mapping[str, Mapping[str, int]]) -> Offsets:
    """Offsets from Spark's JSON form (or its parsed dict)."""
    raw = json.loads(text) if isinstance(text, str) else text
    return {(t, int(p)): int(o) for t, parts in raw.items() for p, o in parts.items()}


def dump(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Offsets in Spark's JSON form, as a dict (topics and partitions sorted)."""
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = o
    return out


def limited(start: Offsets, end: Offsets, max_records: int | None) -> Offsets:
    """``end`` cut so that at most ``max_records`` lie between ``start`` and it, shared
    among the partitions in proportion to what each has to read (Spark's Kafka source
    shares ``maxOffsetsPerTrigger`` the same way); each partition with records gets at
    least one, so every partition advances."""
    lag = {tp: max(0, o - start.get(tp, o)) for tp, o in end.items()}
    total = sum(lag.values())
    if max_records is None or total <= max_records:
        return dict(end)
    out = {}
    for tp, o in end.items():
        if lag[tp] == 0:
            out[tp] = o
            continue
        share = max(1, lag[tp] * max_records // total)
        out[tp] = start.get(tp, o) + min(lag[tp], share)
    return out


def runs(offsets: Iterable[int], gap: int) -> list[tuple[int, int]]:
    """Sorted offsets as ranges ``[first, last]`` to read, one seek each: offsets closer
    than ``gap`` share a range (reading the records between costs less than a seek)."""
    out: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if out and o - out[-1][1] <= gap:
            out[-1] = (out[-1][0], o)
        else:
            out.append((o, o))
    return out
