"""One backoff policy for every retry loop: exponential with full jitter, capped.

redis-py's ``ExponentialWithJitterBackoff``: the n-th wait is ``random() * base * 2**n``,
never more than the cap (AWS's "full jitter": retries of many tasks that failed together
spread out instead of hammering Redis in step). Used by the Redis call retries
(:func:`ftlayer.connection.with_retries`, through redis-py's ``Retry``), the sidecar's
reconnect loop, backpressure waits, drain pauses and stage retries
(``ftlayer.spark.policy.ErrorPolicy``).
"""

from __future__ import annotations

from redis.backoff import ExponentialWithJitterBackoff

__all__ = ["MAX_BACKOFF_S", "Backoff", "jittered"]

MAX_BACKOFF_S = 5.0
"""The longest single wait of a Redis retry loop (a sidecar reconnecting, a flush)."""

Backoff = ExponentialWithJitterBackoff


def jittered(base_s: float, cap_s: float = MAX_BACKOFF_S) -> Backoff:
    """The backoff of a loop whose first wait is about ``base_s`` (at most 2x)."""
    return ExponentialWithJitterBackoff(cap=cap_s, base=base_s)
