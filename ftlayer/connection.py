"""Connecting to Redis: a user's server by URL, or the embedded one."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.connection import HiredisRespSerializer, PythonRespSerializer
from redis.exceptions import RedisClusterException
from redis.retry import Retry

from ftlayer.backoff import jittered
from ftlayer.errors import ConfigError, RedisUnavailableError

__all__ = ["BufferPacker", "connect", "is_cluster", "masters", "redact_url", "with_retries"]


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (its pipelines cannot run scripts)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def masters(client: Any) -> list[tuple[str, redis.Redis]]:
    """``(address, client of that server)`` for every master: the one server of a plain
    client, or each primary of a RedisCluster (its per-node redis.Redis connection)."""
    if is_cluster(client):
        return [(n.name, client.get_redis_connection(n)) for n in client.get_primaries()]
    kw = client.connection_pool.connection_kwargs
    return [(str(kw.get("path") or f"{kw.get('host', '?')}:{kw.get('port', '?')}"), client)]


log = logging.getLogger(__name__)


def _driver_info() -> Any:
    """redis-py's client name and version for ``CLIENT SETINFO``, made once: redis-py 8
    otherwise makes it for every new connection, looking its own version up among the
    installed distributions -- a scan of every ``sys.path`` entry, 148 ms the first time
    in a Spark Python worker, whose path holds the 16 MB jar of Spark's core. None where
    redis-py has no ``DriverInfo`` (it looks its version up once, at import)."""
    try:
        from redis.driver_info import DriverInfo
    except ImportError:
        return None
    return DriverInfo(lib_version=redis.__version__)


_DRIVER_INFO = _driver_info()

_USERINFO = re.compile(r"^(?P<scheme>[a-z+]+://)(?P<user>[^:@/]*)(:(?P<pw>[^@/]*))?@")


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe to log or print)."""
    m = _USERINFO.match(url)
    if not m or m.group("pw") is None:
        return url
    return f"{m.group('scheme')}{m.group('user')}:***@{url[m.end() :]}"


class BufferPacker:
    """redis-py's command packer for ftlayer's connections: hiredis packs ordinary
    commands; a command with a ``memoryview`` argument (a segment, a flush chunk: megabytes)
    is packed by redis-py's Python serializer, which sends such an argument as its own
    buffer instead of copying it into the command (hiredis copies it). Callers pass
    ``memoryview(buf)`` to ask for that."""

    def __init__(self) -> None:
        encode = redis.connection.Encoder("utf-8", "strict", False).encode
        self._views = PythonRespSerializer(1 << 16, encode)
        self._plain = HiredisRespSerializer() if redis.utils.HIREDIS_AVAILABLE else self._views

    def pack(self, *args: Any) -> list[bytes | memoryview]:
        if memoryview in map(type, args):
            return self._views.pack(*args)
        return self._plain.pack(*args)


class _BufferConnection(redis.Connection):
    """A TCP connection packing with BufferPacker (how a cluster's node pools get it: a
    cluster client passes ``connection_class`` to its nodes but not ``command_packer``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("command_packer", BufferPacker())
        super().__init__(**kwargs)


def connect(url: str, **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``redis://``, ``rediss://`` (TLS) or ``unix://`` URLs,
    user:password included, or a Redis Cluster client for ``redis+cluster://`` (and
    ``rediss+cluster://``) naming one node or several, comma-separated
    (``redis+cluster://h1:7000,h2:7000,h3:7000/0``: a new client bootstraps from the first
    that answers, so one dead node does not stop a process from starting) -- a
    ftlayer.cluster.FailoverCluster, whose commands wait out a failover; checked with PING."""
    if not re.match(r"^(redis|rediss|unix|redis\+cluster|rediss\+cluster)://", url):
        raise ConfigError(
            f"unsupported Redis URL {redact_url(url)!r}: use redis://, rediss://, unix:// "
            "or redis+cluster://"
        )
    kwargs.setdefault("socket_connect_timeout", 5)
    if _DRIVER_INFO is not None:
        kwargs.setdefault("driver_info", _DRIVER_INFO)
    client: Any
    try:
        if "+cluster://" in url:
            from ftlayer.cluster import FailoverCluster

            first, seeds = _cluster_seeds(url.replace("+cluster://", "://", 1))
            if seeds:
                kwargs["startup_nodes"] = seeds
            # TLS (rediss+cluster): the URL's SSLConnection wins, hiredis packs everything
            kwargs.setdefault("connection_class", _BufferConnection)
            # asks its seeds for the slot map as it is made; waits out failovers
            client = FailoverCluster.from_url(first, **kwargs)
        else:
            kwargs.setdefault("health_check_interval", 30)
            kwargs.setdefault("command_packer", BufferPacker())
            client = redis.Redis.from_url(url, **kwargs)
        client.ping()
    except (redis.RedisError, RedisClusterException) as e:
        raise RedisUnavailableError(f"cannot reach Redis at {redact_url(url)}: {e}") from e
    return client


def _cluster_seeds(url: str) -> tuple[str, list[Any]]:
    """``scheme://[auth@]h1:p1,h2:p2/…`` → the URL with only ``h1:p1`` and ClusterNodes of the
    others (redis-py adds the URL's own node to them)."""
    from redis.cluster import ClusterNode

    m = re.match(r"^(?P<head>[a-z]+://(?:[^@/]*@)?)(?P<hosts>[^/?]*)(?P<tail>.*)$", url)
    if not m or "," not in m.group("hosts"):
        return url, []
    hosts = m.group("hosts").split(",")
    seeds = []
    for h in hosts[1:]:
        host, _, port = h.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"bad node {h!r} in Redis URL {redact_url(url)!r}: use host:port")
        seeds.append(ClusterNode(host, int(port)))
    return m.group("head") + hosts[0] + m.group("tail"), seeds


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
