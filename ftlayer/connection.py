"""Connecting to Redis: a user's server by URL, or the embedded one."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.retry import Retry

from ftlayer.backoff import jittered
from ftlayer.errors import ConfigError, RedisUnavailableError

__all__ = ["connect", "is_cluster", "redact_url", "with_retries"]


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (its pipelines cannot run scripts)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


log = logging.getLogger(__name__)

_USERINFO = re.compile(r"^(?P<scheme>[a-z+]+://)(?P<user>[^:@/]*)(:(?P<pw>[^@/]*))?@")


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to log or print)."""
    m = _USERINFO.match(url)
    if not m or m.group("pw") is None:
        return url
    return f"{m.group('scheme')}{m.group('user')}:***@{url[m.end() :]}"


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``redis://``, ``rediss://`` (TLS) or ``unix://`` URLs,
    user:password included, or a Redis Cluster client for ``redis+cluster://`` (and
    ``rediss+cluster://``) naming any node; checked with PING."""
    if not re.match(r"^(redis|rediss|unix|redis\+cluster|rediss\+cluster)://", url):
        raise ConfigError(
            f"unsupported Redis URL {redact_url(url)!r}: use redis://, rediss://, unix:// "
            "or redis+cluster://"
        )
    kwargs.setdefault("socket_connect_timeout", 5)
    client: Any
    if "+cluster://" in url:
        from redis.cluster import RedisCluster

        client = RedisCluster.from_url(url.replace("+cluster://", "://", 1), **kwargs)
    else:
        kwargs.setdefault("health_check_interval", 30)
        client = redis.Redis.from_url(url, **kwargs)
    try:
        client.ping()
    except redis.RedisError as e:
        raise RedisUnavailableError(f"cannot reach Redis at {redact_url(url)}: {e}") from e
    return client


T = TypeVar("T")


def with_retries(fn: Callable[[], T], *, retries: int, backoff_s: float, what: str) -> T:
    """Run ``fn``; on a connection or timeout error retry up to ``retries`` times (redis-py's
    ``Retry`` with ftlayer's one backoff, ftlayer.backoff: jittered, capped), then raise
    RedisUnavailableError naming ``what``. Only safe for idempotent calls."""
    retry = Retry(jittered(backoff_s), retries, (redis.ConnectionError, redis.TimeoutError))

    def note(e: Exception, failures: int) -> None:
        log.warning("redis call failed what=%s attempt=%d error=%s", what, failures, e)

    try:
        return retry.call_with_retry(fn, note, with_failure_count=True)
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise RedisUnavailableError(
            f"{what}: Redis unreachable after {retries + 1} attempts: {e}"
        ) from e
