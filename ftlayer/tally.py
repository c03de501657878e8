"""What a run of the FT scripts did: one :class:`Tally` for flushes, expiry and segment
settlement, summed over their calls.

Each script fills the fields it knows: a flush (lua/flush.lua) ``completed``,
``replayed``, ``dead_lettered``, ``orphans`` and ``duplicates`` (shard calls a retry
found already applied); expiry (lua/expire.lua) ``processed`` (timeout entries handled),
``timed_out`` and ``orphans``; segment settlement (lua/segment_settle.lua) ``segments``,
``completed``, ``replayed``, ``dead_lettered``, ``pending`` and ``skipped`` (segments
settled already). ``calls`` counts script calls (Redis round trips).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

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

    def merge(self, other: Tally) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def add_flush(self, reply: list[int]) -> None:
        """One flush call's reply: {completed, replayed, dead_lettered, orphans}, or a
        negative first value when its token was applied already."""
        self.calls += 1
        if reply[0] < 0:
            self.duplicates += 1
            return
        self.completed += reply[0]
        self.replayed += reply[1]
        self.dead_lettered += reply[2]
        self.orphans += reply[3]

    def add_settle(self, reply: list[int]) -> None:
        """One settlement call's reply: {segments, completed, replayed, dead_lettered,
        pending, skipped}."""
        self.calls += 1
        self.segments += int(reply[0])
        self.completed += int(reply[1])
        self.replayed += int(reply[2])
        self.dead_lettered += int(reply[3])
        self.pending += int(reply[4])
        self.skipped += int(reply[5])
