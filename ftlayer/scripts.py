"""The Lua scripts, loaded from ``ftlayer/lua`` and run through redis-py's Script
(EVALSHA first, reloaded on NoScriptError, usable inside pipelines)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any, TypeVar

import redis

from ftlayer.config import FTConfig
from ftlayer.connection import with_retries
from ftlayer.keys import Keyspace
from ftlayer.limits import lua_constants

__all__ = ["SCRIPTS", "NamespacePart", "Scripts", "script_source"]

T = TypeVar("T")

# scripts on one shard's keys: prefixed with the shared prelude lua/_common.lua
SHARD_SCRIPTS = (
    "flush", "expire", "claim", "fail", "reset_timeout", "dlq_replay",
    "segment_put", "segment_batch", "segment_settle", "summary_put",
)  # fmt: skip
# scripts on one key of their own
PLAIN_SCRIPTS = ("lease_acquire", "lease_release")
SCRIPTS = SHARD_SCRIPTS + PLAIN_SCRIPTS


@cache
def script_source(name: str) -> str:
    """The full text of a script: shard scripts get the constants of ftlayer.limits and
    the shared prelude first."""
    lua = files("ftlayer") / "lua"
    body = (lua / f"{name}.lua").read_text()
    if name in PLAIN_SCRIPTS:
        return body
    return lua_constants() + (lua / "_common.lua").read_text() + "\n" + body


class Scripts:
    """Registered scripts of one client, as attributes: ``scripts.flush(keys, args)``."""

    def __init__(self, client: Any) -> None:
        for name in SCRIPTS:
            setattr(self, name, client.register_script(script_source(name)))

    flush: Any
    expire: Any
    claim: Any
    fail: Any
    reset_timeout: Any
    dlq_replay: Any
    segment_put: Any
    segment_batch: Any
    segment_settle: Any
    summary_put: Any
    lease_acquire: Any
    lease_release: Any


class NamespacePart:
    """Base of the layer's Redis-backed parts (acker table, persistence, timeouts): each
    works on one namespace's keys, through one client and its registered scripts."""

    def __init__(
        self, client: redis.Redis, keyspace: Keyspace, scripts: Scripts, config: FTConfig
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.scripts = scripts
        self.config = config

    def retried(self, call: Callable[[], T], what: str) -> T:
        """``call`` retried with backoff on a lost connection (``flush_retries``,
        ``flush_backoff_s``); only for calls that are idempotent, by a token or by the
        state they retire. RedisUnavailableError naming ``what`` when Redis stays away."""
        cfg = self.config
        return with_retries(call, retries=cfg.flush_retries, backoff_s=cfg.flush_backoff_s,
                            what=what)  # fmt: skip
