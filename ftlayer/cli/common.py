"""What every ``ftlayer`` command shares: flags with FTLAYER_* environment fallbacks (the
only place that reads the environment) and the config of the namespace a command names."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError

__all__ = [
    "UsageError",
    "add_common",
    "add_redis_url",
    "config_of",
    "deprecated_flag",
    "env_flag",
    "env_name",
    "one_of",
    "open_existing",
    "opt",
]


class UsageError(ConfigError):
    """A command line that cannot run as given: options that do not go together, a
    malformed id, no ``--redis-url`` where one is needed. Exit status 2, like argparse's own
    usage errors; every other error of ours or Redis's is a runtime error, exit 1."""


def one_of(*values: str, fold: bool = False) -> Callable[[str], str]:
    """An argparse ``type`` for a flag with a fixed set of values (give it ``choices=``
    too, so ``--help`` lists them): checks the value -- also when it comes from the
    environment, which argparse's ``choices`` never sees -- and with ``fold`` takes any
    case, giving the upper-case spelling."""

    def convert(value: str) -> str:
        v = value.upper() if fold else value
        if v not in values:
            raise argparse.ArgumentTypeError(f"{value!r} is not one of {', '.join(values)}")
        return v

    return convert


def env_name(flag: str) -> str:
    """The environment variable a flag falls back to: ``--redis-url`` -> FTLAYER_REDIS_URL."""
    return "FTLAYER_" + flag.lstrip("-").upper().replace("-", "_")


def env_flag(name: str) -> bool | None:
    """A yes/no environment variable: True for 1/true/yes/on, False for 0/false/no/off,
    None when unset or empty (the flag's own default decides)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise UsageError(f"{name}={value!r}: say 1/true/yes/on or 0/false/no/off")


def opt(
    p: argparse.ArgumentParser,
    flag: str,
    kind: Callable[[str], Any],
    default: Any,
    text: str,
    choices: Sequence[str] | None = None,
) -> None:
    """A flag that falls back to its environment variable (env_name); argparse converts
    (and checks) the environment's string with ``kind`` like any command-line value. With
    ``choices`` (checked by ``kind``: see one_of), ``--help`` lists them."""
    env = env_name(flag)
    shown = "" if default is None else " (default: %(default)s)"
    p.add_argument(flag, type=kind, default=os.environ.get(env, default), choices=choices,
                   help=f"{text}{shown} [env: {env}]")  # fmt: skip


class _Deprecated(argparse.Action):
    """A hidden old spelling of a flag: stores into the new flag's ``dest`` and says, in
    one line on stderr, which spelling to use."""

    def __init__(self, *args: Any, new: str = "", **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:  # fmt: skip
        print(f"{parser.prog}: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def deprecated_flag(p: argparse.ArgumentParser, old: str, new: str, **kw: Any) -> None:
    """Keep ``old`` working, hidden from ``--help``, as a deprecated spelling of ``new``
    (add ``new`` first; ``kw``: its ``type``)."""
    dest = new.lstrip("-").replace("-", "_")
    p.add_argument(old, dest=dest, action=_Deprecated, new=new, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS, **kw)  # fmt: skip


def add_redis_url(p: argparse.ArgumentParser) -> None:
    opt(p, "--redis-url", str, None, "redis://[user:password@]host:port/db, rediss:// for "
         "TLS, redis+cluster://host:port for a Redis Cluster")  # fmt: skip


def add_common(p: argparse.ArgumentParser) -> None:
    add_redis_url(p)
    opt(p, "--namespace", str, "ftlayer", "key prefix of the pipeline")
    opt(p, "--shards", int, None, "hash-tagged key groups (default: the namespace's, "
         "stored by its first open; 8 for a new one)")  # fmt: skip
    modes = ("auto", "functions", "eval")
    opt(p, "--script-mode", one_of(*modes), "auto", "auto: the scripts as a Redis 7 function "
        "library where the server takes FUNCTION LOAD, else EVALSHA; functions; eval",
        choices=modes)  # fmt: skip


def open_existing(args: argparse.Namespace) -> Any:
    """The FTLayer of a namespace that lives in the user's Redis (stats, dlq): an
    embedded server would be empty, so a URL is required."""
    from ftlayer.layer import FTLayer

    if not args.redis_url:
        raise UsageError(
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
