"""What every ``ftlayer`` command shares: flags with FTLAYER_* environment fallbacks (the
only place that reads the environment) and the config of the namespace a command names."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError

__all__ = ["add_common", "add_redis_url", "config_of", "env_name", "open_existing", "opt"]


def env_name(flag: str) -> str:
    """The environment variable a flag falls back to: ``--redis-url`` -> FTLAYER_REDIS_URL."""
    return "FTLAYER_" + flag.lstrip("-").upper().replace("-", "_")


def opt(
    p: argparse.ArgumentParser, flag: str, kind: Callable[[str], Any], default: Any, text: str
) -> None:
    """A flag that falls back to its environment variable (env_name); argparse converts
    (and checks) the environment's string with ``kind`` like any command-line value."""
    env = env_name(flag)
    shown = "" if default is None else " (default: %(default)s)"
    p.add_argument(flag, type=kind, default=os.environ.get(env, default),
                   help=f"{text}{shown} [env: {env}]")  # fmt: skip


def add_redis_url(p: argparse.ArgumentParser) -> None:
    opt(p, "--redis-url", str, None, "redis://[user:password@]host:port/db, rediss:// for "
         "TLS, redis+cluster://host:port for a Redis Cluster")  # fmt: skip


def add_common(p: argparse.ArgumentParser) -> None:
    add_redis_url(p)
    opt(p, "--namespace", str, "ftlayer", "key prefix of the pipeline")
    opt(p, "--shards", int, None, "hash-tagged key groups (default: the namespace's, "
         "stored by its first open; 8 for a new one)")  # fmt: skip
    opt(p, "--script-mode", _script_mode, "auto", "auto: the scripts as a Redis 7 function "
         "library where the server takes FUNCTION LOAD, else EVALSHA; functions; eval")  # fmt: skip


def _script_mode(value: str) -> str:
    if value not in ("auto", "functions", "eval"):
        raise argparse.ArgumentTypeError(f"{value!r}: auto, functions or eval")
    return value


def open_existing(args: argparse.Namespace) -> Any:
    """The FTLayer of a namespace that lives in the user's Redis (stats, dlq): an
    embedded server would be empty, so a URL is required."""
    from ftlayer.layer import FTLayer

    if not args.redis_url:
        raise ConfigError(
            f"`ftlayer {args.command}` reads an existing namespace: give --redis-url "
            "(or FTLAYER_REDIS_URL)"
        )
    return FTLayer.open(config_of(args, timeout_s=None, buckets=None), create=False)


_NEW = {"shards": 8, "timeout_s": 30.0, "buckets": 3}  # a new namespace's settings


def config_of(args: argparse.Namespace, **more: Any) -> FTConfig:
    """The config of ``args``: settings not given on the command line (None) are the
    namespace's stored ones (ftlayer.settings), or a new namespace's defaults. Given ones
    that differ from the stored ones are refused when the layer opens."""
    from ftlayer.settings import read_settings

    wanted = {"shards": args.shards, **more}
    stored = None
    if args.redis_url and None in wanted.values():
        from ftlayer.connection import connect

        client = connect(args.redis_url)
        try:
            stored = read_settings(client, args.namespace)
        finally:
            client.close()
    for name, value in wanted.items():
        if value is None:
            wanted[name] = getattr(stored, name) if stored else _NEW[name]
    return FTConfig(namespace=args.namespace, redis_url=args.redis_url,
                    script_mode=args.script_mode, **wanted)  # fmt: skip
