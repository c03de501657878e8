"""A namespace's settings, stored in Redis by its first open and checked by every later one.

Shards decide every key's name, the layout version (``frame_version``: ftlayer.keys.
LAYOUT_VERSION) how records and their histories are kept, and
timeout/buckets how pending records expire: a pipeline, sidecar or CLI that opened a
namespace with other values would read empty keys (``stats`` printing zeros), expire
nothing, or misread frames. So the first open of a namespace writes ``ft:{<ns>}:settings``
(``HSETNX`` per field: two first opens racing agree on one writer's values) and every open
compares; a mismatch is refused with one line naming both values.

The server's ``maxmemory-policy`` is checked too: under any policy but ``noeviction``
Redis may evict a pending record's keys to make room, and an evicted record is lost with
no error anywhere. ``check_eviction`` refuses such a server unless the config allows it
(``FTConfig.allow_eviction``), and then warns once per process.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from ftlayer.keys import LAYOUT_VERSION, Keyspace

__all__ = ["CHECKED", "NamespaceSettings", "check_eviction", "check_settings",
           "eviction_policy", "eviction_warning", "read_settings"]

log = logging.getLogger(__name__)

CHECKED = ("shards", "timeout_s", "buckets", "frame_version")


@dataclass(frozen=True)
class NamespaceSettings:
    shards: int
    timeout_s: float
    buckets: int
    frame_version: int

    @classmethod
    def of(cls, config: FTConfig) -> NamespaceSettings:
        return cls(config.shards, config.timeout_s, config.buckets, LAYOUT_VERSION)

    @classmethod
    def parse(cls, raw: dict[Any, Any]) -> NamespaceSettings:
        d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in raw.items()}
        return cls(int(d["shards"]), float(d["timeout_s"]), int(d["buckets"]),
                   int(d["frame_version"]))  # fmt: skip


def read_settings(client: Any, namespace: str) -> NamespaceSettings | None:
    """The stored settings of ``namespace`` (None: nothing was ever opened there)."""
    raw = client.hgetall(Keyspace(namespace, 1).settings)
    return NamespaceSettings.parse(raw) if raw else None


def check_settings(client: Any, config: FTConfig, create: bool = True) -> NamespaceSettings:
    """Store ``config``'s settings if the namespace has none (``create``), else compare:
    ConfigError on a mismatch, or when ``create`` is False and nothing is stored."""
    key = Keyspace(config.namespace, 1).settings
    mine = NamespaceSettings.of(config)
    stored: NamespaceSettings | None
    if create:
        try:
            with client.pipeline(transaction=False) as pipe:
                for name in CHECKED:
                    pipe.hsetnx(key, name, repr(getattr(mine, name)))
                pipe.hgetall(key)
                stored = NamespaceSettings.parse(pipe.execute()[-1])
        except redis.ReadOnlyError:  # a replica, read by an operator: compare only
            stored = read_settings(client, config.namespace) or mine
    else:
        stored = read_settings(client, config.namespace)
        if stored is None:
            raise ConfigError(
                f"namespace {config.namespace!r} does not exist here: no pipeline or sidecar "
                "ever opened it (check --namespace and --redis-url)"
            )
    for name in CHECKED:
        want, have = getattr(mine, name), getattr(stored, name)
        if want != have:
            raise ConfigError(
                f"namespace {config.namespace!r} was created with {name}={have!r}, this "
                f"process uses {name}={want!r}: use the namespace's value (or another "
                "namespace)"
            )
    return stored


SAFE_POLICY = "noeviction"


def eviction_policy(client: Any) -> str | None:
    """The server's ``maxmemory-policy`` (``INFO memory``: readable where ``CONFIG`` is
    renamed away, as on managed Redis); on a cluster the first master's that is not
    ``noeviction``, else ``noeviction``. None: the server does not say."""
    from redis.cluster import RedisCluster

    if isinstance(client, RedisCluster):
        per_node = client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        found = [i.get("maxmemory_policy") for i in per_node.values() if isinstance(i, dict)]
    else:
        found = [client.info("memory").get("maxmemory_policy")]
    known = [str(p) for p in found if p]
    if not known:
        return None
    return next((p for p in known if p != SAFE_POLICY), SAFE_POLICY)


def eviction_warning(policy: str | None) -> str | None:
    """What operators are told of a server whose policy may evict (None: nothing)."""
    if policy is None or policy == SAFE_POLICY:
        return None
    return f"redis maxmemory-policy is {policy}, not noeviction: an evicted key is a lost record"


_warned: set[str] = set()


def check_eviction(client: Any, config: FTConfig, refuse: bool = True) -> str | None:
    """The server's eviction policy; ConfigError when it may evict (anything but
    ``noeviction``) unless ``config.allow_eviction`` (then a warning in the log, once per
    process and policy). Not ``refuse`` (an operator's read-only look): only returned,
    for the caller to show."""
    policy = eviction_policy(client)
    if policy is None or policy == SAFE_POLICY:
        return policy
    if not refuse:
        return policy
    if not config.allow_eviction:
        raise ConfigError(
            f"Redis has maxmemory-policy {policy}: it may evict a pending record, which is "
            "then lost with no error; set 'maxmemory-policy noeviction' (redis.conf or "
            "CONFIG SET), or FTConfig(allow_eviction=True) to accept the risk")
    if policy not in _warned:
        _warned.add(policy)
        log.warning("%s", eviction_warning(policy))
    return policy
