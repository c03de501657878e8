"""Per-worker-process state of the Spark side: Redis clients and FT layers, rebuilt from
the plain config a task carries (no live client is ever pickled), and the task context.

One Redis client per (process, redis_url) and one FTLayer per (process, config); a forked
worker builds its own (the cache is keyed by pid).
"""

from __future__ import annotations

import os
import threading

import redis

from ftlayer.config import FTConfig
from ftlayer.connection import connect
from ftlayer.handler import AbstractFTHandler, NonFTHandler
from ftlayer.layer import FTLayer

__all__ = ["task_context", "task_handler", "worker_layer"]

# -- worker connections ----------------------------------------------------------------
_lock = threading.Lock()
_clients: dict[tuple[int, str], redis.Redis] = {}
_layers: dict[tuple[int, FTConfig], FTLayer] = {}


def worker_layer(config: FTConfig) -> FTLayer:
    """The FTLayer of ``config`` in this worker process: one Redis client per
    (process, redis_url), one FTLayer per (process, config). Rebuilt after a fork."""
    if not config.redis_url:
        raise ValueError("a task needs config.redis_url (FaultTolerance fills it in)")
    pid = os.getpid()
    with _lock:
        layer = _layers.get((pid, config))
        if layer is None:
            client = _clients.get((pid, config.redis_url))
            if client is None:
                client = _clients[(pid, config.redis_url)] = connect(config.redis_url)
            layer = _layers[(pid, config)] = FTLayer(client, config)
        return layer


def task_handler(config: FTConfig, partition: int) -> AbstractFTHandler:
    if not config.enabled:
        return NonFTHandler()
    return worker_layer(config).handler(partition)


def task_context() -> tuple[int, int]:
    """(partition, attempt) of the running Spark task; (-1, 0) outside one."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    return (tc.partitionId(), tc.attemptNumber()) if tc else (-1, 0)
