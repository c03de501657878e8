"""The stages' circuit breakers, from one micro-batch to the next.

When most of the rows a stage was given fail (ftlayer.spark.policy.breaker_open), what it
calls is likely down. In the task, its failed rows are then not replayed at once (their
attempt counts: they were called). Across batches the driver keeps each stage's breaker in
Redis (one hash per source, a field per stage label):

* a batch in which most of the stage's rows failed opens it for
  ``ErrorPolicy.breaker_open_s``, twice as long each time it opens again in a row (at most
  ``breaker_max_open_s``);
* while it is open, the batch's tasks do not call the stage: the rows that reach it are
  *held* -- no attempt charged, an outage is not a verdict on the record -- and go back to
  the replay queue, not to be claimed before the breaker's next probe (``hold_until``:
  the delayed queue, lua/core/failures.lua);
* the first batch after that calls it again (the probe): if the stage's rows pass, the
  breaker closes; if most fail, it opens again, for longer.

So during an outage a record is called about once per probe, and a stage broken for good
spends a record's budget one probe at a time: it ends in the dead letters, never held
forever.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ftlayer.spark.policy import ErrorPolicy, breaker_open

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer
    from ftlayer.spark.results import StageCounts

__all__ = ["Breaker", "Breakers"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Breaker:
    """One stage's breaker: open until ``until`` (epoch seconds) after being open for
    ``open_s``; past ``until``, the next batch probes the stage."""

    until: float
    open_s: float


class Breakers:
    """The breakers of one source's stages, kept in Redis (Keyspace.breakers)."""

    def __init__(self, layer: FTLayer, source: int) -> None:
        self.client = layer.client
        self.key = layer.keyspace.breakers(source)
        self.states: dict[str, Breaker] = {}

    def read(self) -> tuple[str, ...]:
        """Read the states (one round trip); the labels of the stages open now (their
        tasks hold their rows instead of calling them)."""
        raw = self.client.hgetall(self.key)
        self.states = {}
        for label, value in raw.items():
            until, open_s = json.loads(value)
            self.states[label.decode() if isinstance(label, bytes) else label] = Breaker(
                float(until), float(open_s))
        now = time.time()
        return tuple(sorted(k for k, b in self.states.items() if b.until > now))

    def after(self, stages: Mapping[str, StageCounts], policies: Mapping[str, ErrorPolicy],
              open_now: tuple[str, ...]) -> float:  # fmt: skip
        """Update the states from a batch's stage counts: a stage called in this batch
        whose rows mostly failed (``policy.breaker_open`` over the batch) opens (again,
        for twice as long), one called whose rows did not closes. Returns when the rows
        held in this batch (those reaching a stage open for it) may be claimed again
        (epoch seconds; 0: none were held)."""
        now = time.time()
        sets: dict[str, str] = {}
        closed: list[str] = []
        hold_until = 0.0
        for label, c in stages.items():
            state = self.states.get(label)
            if label in open_now:  # not called: its rows wait for its probe
                if c.held and state is not None:
                    hold_until = max(hold_until, state.until)
                continue
            policy = policies.get(label)
            if policy is None or not c.rows_in:  # not a Python stage, or not called
                continue
            if breaker_open(policy, c.failed, c.rows_in):
                open_s = policy.breaker_open_s if state is None else min(
                    2 * state.open_s, policy.breaker_max_open_s)  # fmt: skip
                state = Breaker(now + open_s, open_s)
                self.states[label] = state
                sets[label] = json.dumps([state.until, open_s])
                hold_until = max(hold_until, state.until)
                log.warning("stage breaker opened stage=%r for_s=%.1f failed=%d of rows=%d",
                            label, open_s, c.failed, c.rows_in)  # fmt: skip
            elif state is not None:
                closed.append(label)
                del self.states[label]
                log.info("stage breaker closed stage=%r", label)
        if sets or closed:
            with self.client.pipeline(transaction=False) as pipe:
                for label, value in sets.items():
                    pipe.hset(self.key, label, value)
                if closed:
                    pipe.hdel(self.key, *closed)
                pipe.execute()
        return hold_until
