"""The ``ftlayer`` command. Flags fall back to FTLAYER_* environment variables, shown in
``--help``; this is the only place that reads the environment."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from ftlayer import __version__
from ftlayer.config import FTConfig
from ftlayer.connection import redact_url
from ftlayer.errors import FTLayerError

__all__ = ["build_parser", "main"]

log = logging.getLogger("ftlayer.cli")


def _env(name: str, default: Any = None) -> Any:
    return os.environ.get(f"FTLAYER_{name}", default)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--redis-url",
        default=_env("REDIS_URL"),
        help="redis://[user:password@]host:port/db, rediss:// for TLS; default: start an "
        "embedded redis-server [env: FTLAYER_REDIS_URL]",
    )
    p.add_argument(
        "--namespace",
        default=_env("NAMESPACE", "ftlayer"),
        help="key prefix of the pipeline (default: %(default)s) [env: FTLAYER_NAMESPACE]",
    )
    p.add_argument(
        "--shards",
        type=int,
        default=int(_env("SHARDS", 8)),
        help="hash-tagged key groups; must match the pipeline's (default: %(default)s) "
        "[env: FTLAYER_SHARDS]",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ftlayer",
        description="Record-level, Storm-style guaranteed processing for PySpark streaming.",
    )
    parser.add_argument("--version", action="version", version=f"ftlayer {__version__}")
    parser.add_argument(
        "--log-level",
        default=_env("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING (default: %(default)s) [env: FTLAYER_LOG_LEVEL]",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    stats = sub.add_parser("stats", help="print the FT counters of a namespace")
    _add_common(stats)
    stats.add_argument("--json", action="store_true", help="one JSON object")
    stats.set_defaults(func=_cmd_stats)

    demo = sub.add_parser(
        "demo",
        help="run a generated workload with injected failures through the FT layer",
        description="Generated records through source, map and sink tasks with explicit "
        "failures and drops injected; replays, drains and prints a report. Exit 1 if "
        "any record was lost.",
    )
    demo.add_argument(
        "--redis-url",
        default=_env("REDIS_URL"),
        help="default: an embedded redis-server [env: FTLAYER_REDIS_URL]",
    )
    demo.add_argument("--records", type=int, default=20_000, help="default: %(default)s")
    demo.add_argument(
        "--fail-rate",
        type=float,
        default=0.02,
        help="share of attempts failing with FailRecord (default: %(default)s)",
    )
    demo.add_argument(
        "--drop-rate",
        type=float,
        default=0.01,
        help="share of attempts never acked (default: %(default)s)",
    )
    demo.add_argument("--timeout-s", type=float, default=2.0, help="default: %(default)s")
    demo.add_argument("--seed", type=int, default=7, help="default: %(default)s")
    demo.add_argument("--json", action="store_true", help="print one JSON object")
    demo.set_defaults(func=_cmd_demo)

    server = sub.add_parser(
        "redis", help="run an embedded redis-server in the foreground and print its URL"
    )
    server.add_argument("--port", type=int, default=None, help="default: a free port")
    server.add_argument("--dir", default=None, help="data directory (default: a temp dir)")
    server.add_argument("--appendonly", action="store_true", help="turn AOF persistence on")
    server.set_defaults(func=_cmd_redis)
    return parser


def _config(args: argparse.Namespace) -> FTConfig:
    return FTConfig(namespace=args.namespace, shards=args.shards, redis_url=args.redis_url)


def _cmd_stats(args: argparse.Namespace) -> int:
    from ftlayer.layer import FTLayer

    with FTLayer.open(_config(args)) as layer:
        st = layer.stats().as_dict()
    if args.json:
        print(json.dumps(st, sort_keys=True))
        return 0
    where = redact_url(args.redis_url) if args.redis_url else "embedded (empty) redis"
    print(f"namespace {args.namespace} on {where}")
    for key in ("persisted", "completed", "completed_local", "failed_explicit",
                "failed_timeout", "replayed", "replays_claimed", "dead_lettered", "orphans",
                "pending", "queued_replays", "latency_count", "mean_latency_ms"):  # fmt: skip
        value = st[key]
        print(f"  {key:<16} {value if value is not None else '-':>12}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from ftlayer.demo import report_table, run_demo

    def progress(done: int, total: int, st: Any) -> None:
        if not args.json and sys.stderr.isatty():
            bar = "#" * int(30 * done / max(total, 1))
            print(
                f"\r[{bar:<30}] {done}/{total} pending={st.pending} replayed={st.replayed}",
                end="",
                file=sys.stderr,
                flush=True,
            )

    report = run_demo(
        records=args.records,
        fail_rate=args.fail_rate,
        drop_rate=args.drop_rate,
        timeout_s=args.timeout_s,
        redis_url=args.redis_url,
        seed=args.seed,
        progress=progress,
    )
    if args.json:
        print(json.dumps(asdict(report)))
    else:
        print("\nftlayer demo report\n" + report_table(report))
    return 1 if report.lost else 0


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args))
    except FTLayerError as e:
        print(f"ftlayer: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
