"""What a run of the FT scripts did: one :class:`Tally` for flushes, expiry and segment
settlement, summed over their calls.

Each script fills the fields it knows: a flush (lua/flush.lua) ``completed``,
``replayed``, ``dead_lettered``, ``orphans`` and ``duplicates`` (shard calls a retry
found already applied); expiry (lua/expire.lua) ``processed`` (timeout entries handled),
``timed_out`` and ``orphans``; segment settlement (lua/segment_settle.lua) ``segments``,
``completed``, ``replayed``, ``dead_lettered``, ``pending`` and ``skipped`` (segments
settled already). ``calls`` counts script calls (Redis round trips). Flushes and
settlements also name the source ids they dead-lettered (``dead_ids``), and settlements the
segments they skipped (``skipped_members``): a driver attributes each failed row's outcome
to the stage it failed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

__all__ = ["Tally"]


@dataclass(slots=True)
class Tally:
    calls: int = 0
    completed: int = 0
    replayed: int = 0
    dead_lettered: int = 0
    orphans: int = 0
    duplicates: int = 0
    processed: int = 0
    timed_out: int = 0
    segments: int = 0
    pending: int = 0
    skipped: int = 0
    dead_ids: list[int] = field(default_factory=list)
    skipped_members: list[str] = field(default_factory=list)

    def merge(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def add_flush(self, reply: list[Any]) -> None:
        """One flush call's reply: {completed, replayed, dead_lettered, orphans, dead
        ids}, or a negative first value when its token was applied already."""
        self.calls += 1
        if reply[0] < 0:
            self.duplicates += 1
            return
        self.completed += reply[0]
        self.replayed += reply[1]
        self.dead_lettered += reply[2]
        self.orphans += reply[3]
        self.dead_ids += _ids(reply[4])

    def add_settle(self, reply: list[Any]) -> None:
        """One settlement call's reply: {segments, completed, replayed, dead_lettered,
        pending, skipped, dead ids, skipped members}."""
        self.calls += 1
        self.segments += int(reply[0])
        self.completed += int(reply[1])
        self.replayed += int(reply[2])
        self.dead_lettered += int(reply[3])
        self.pending += int(reply[4])
        self.skipped += int(reply[5])
        self.dead_ids += _ids(reply[6])
        self.skipped_members += [m for m in _text(reply[7]).split(",") if m]


def _ids(raw: bytes | str) -> list[int]:
    """Source ids packed end to end (8 bytes each, big-endian)."""
    data = raw.encode("latin-1") if isinstance(raw, str) else raw
    return np.frombuffer(data, ">u8").tolist() if data else []


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw
