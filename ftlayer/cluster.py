"""A Redis Cluster client that rides out a failover.

When a master dies, its slots have no reachable master until the cluster promotes a
replica: about two ``cluster-node-timeout`` s. redis-py's ``RedisCluster`` retries a command
that meets a dead node (re-reading the slot map each time) but without waiting between
attempts, so its retries are spent in well under a second and the caller -- an executor's
flush, the driver's batch bookkeeping, a sidecar's rotation -- fails in the middle of an
ordinary failover. ``FailoverCluster`` wraps each command in an outer redis-py ``Retry``
with ftlayer's one backoff (ftlayer.backoff: jittered, capped at 1 s), for up to
``FAILOVER_RETRIES`` attempts (about 15-20 s in all), on the errors a failover produces.
Single commands only: a cluster pipeline's ``execute`` is not retried (docs/architecture.md,
"Redis Cluster").

Retrying is safe for what ftlayer sends: every script is idempotent or carries the token of
its work (a flush applied before its reply was lost is applied once, lua/flush.lua), and
redis-py's own retries already resend commands the same way, only faster.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, ConnectionError, SlotNotCoveredError, TimeoutError
from redis.retry import Retry

from ftlayer.backoff import jittered

__all__ = ["FAILOVER_RETRIES", "FailoverCluster"]

log = logging.getLogger(__name__)

FAILOVER_RETRIES = 30
"""Outer attempts of a command while a failover runs: full-jitter waits growing from
0.1 s to at most 1 s, about 15-20 s in all (a few cluster-node-timeouts)."""

FAILOVER_ERRORS = (ConnectionError, TimeoutError, ClusterDownError, SlotNotCoveredError)


class FailoverCluster(RedisCluster):
    """``RedisCluster`` whose commands wait for a failover instead of failing in it."""

    def __init__(self, *args: Any, failover_retries: int = FAILOVER_RETRIES, **kw: Any) -> None:
        # set first: the constructor already sends commands (the slot map)
        self.failover_retry = Retry(jittered(0.1, 1.0), failover_retries, FAILOVER_ERRORS)
        super().__init__(*args, **kw)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        def note(e: Exception, failures: int) -> None:
            if failures == 1 or failures % 5 == 0:
                log.warning("redis cluster command %s failed attempt=%d error=%s (waiting for "
                            "a failover)", args[0], failures, e)  # fmt: skip

        run = super().execute_command
        return self.failover_retry.call_with_retry(
            lambda: run(*args, **kwargs), note, with_failure_count=True
        )
