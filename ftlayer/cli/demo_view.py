"""``ftlayer demo``'s screen: one live progress display while it runs (rich), then a short
table and a one-line verdict. ``--json`` prints only the report object; ``-v`` shows
ftlayer's and Spark's logs instead of the live display. Off a terminal (a pipe, a CI log)
there is no live display: a progress line per finished micro-batch and one when it drains,
then the table. With ``--serve`` the report comes first, then the page stays up."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import threading
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ftlayer.demo import DemoProgress, DemoReport, run_demo, verdict

__all__ = ["run_demo_command"]

_SHOWN = (  # (DemoReport field, label)
    ("source_records", "source records"), ("sink_rows", "rows written to the sink"),
    ("completed", "completed"), ("replayed", "replays"),
    ("failed_explicit", "  failed by a stage"), ("timed_out", "  timed out (unconfirmed)"),
    ("crashed_tasks", "crashed tasks (Spark retried)"), ("dead_lettered", "dead-lettered"),
    ("dead_in_sink", "  of them in the sink all the same"),
    ("rewrites", "records written again"), ("duplicates", "duplicates in the sink"),
    ("misplaced", "replays off their key's partition"),
    ("pending", "pending after the drain"), ("lost", "lost"),
    ("micro_batches", "micro-batches"), ("elapsed_s", "seconds"),
)  # fmt: skip


def _live_table(p: DemoProgress | None, page: str | None) -> Table:
    t = Table(title="ftlayer demo", title_justify="left", show_header=False, box=None,
              padding=(0, 2))  # fmt: skip
    t.add_column(style="bold", justify="right")
    t.add_column()
    if p is None:
        t.add_row("…", "starting Spark, Redis and the sidecar")
    else:
        t.add_row(f"{p.micro_batches}/{p.batches_total}", f"micro-batches ({p.phase})")
        for value, label in ((p.records_in, "records in"), (p.completed, "completed"),
                             (p.replayed, "replayed"), (p.dead_lettered, "dead-lettered"),
                             (p.pending, "pending")):  # fmt: skip
            t.add_row(f"{value:,}", label)
        t.add_row(f"{p.elapsed_s:.1f}", "seconds")
    if page:
        t.add_row("", f"status page: {page}")
    return t


def _report_table(r: DemoReport) -> Table:
    t = Table(title="ftlayer demo report", title_justify="left", show_header=False)
    t.add_column()
    t.add_column(justify="right")
    values = asdict(r)
    if r.sink != "redis":
        t.add_row("sink", f"{r.sink} table (counted from it)")
    for key, label in _SHOWN:
        v = values[key]
        t.add_row(label, f"{v:,}" if isinstance(v, int) else f"{v:g}")
    return t


def _quiet() -> None:
    """ftlayer's INFO lines and py4j's chatter off (``-v`` keeps them)."""
    for name in ("ftlayer", "py4j"):
        logging.getLogger(name).setLevel(logging.WARNING)


def _hold(console: Console, page: str | None) -> None:
    """``--serve``: the report is out; Redis and the sidecar stay until Ctrl-C (or SIGTERM)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    console.print(f"[bold]--serve:[/] the status page stays up at {page or '(no page)'}; "
                  "Ctrl-C stops Redis and the sidecar", soft_wrap=True)  # fmt: skip
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass


def run_demo_command(args: argparse.Namespace) -> int:
    console = Console()
    live_ok = console.is_terminal and not args.json and not args.verbose
    if not args.verbose:
        _quiet()
    page: list[str] = []
    seen = {"batches": 0, "draining": False}
    live = Live(_live_table(None, None), console=console, refresh_per_second=4)

    def on_page(url: str) -> None:
        page.append(url)
        if live_ok:
            live.update(_live_table(None, url))
        elif not args.json:
            print(f"status page: {url}", flush=True)

    def progress(p: DemoProgress) -> None:
        if live_ok:
            live.update(_live_table(p, page[0] if page else None))
            return
        if args.json:
            return
        if p.micro_batches > seen["batches"]:  # off a terminal: a line per micro-batch
            seen["batches"] = p.micro_batches
            print(f"micro-batch {p.micro_batches}/{p.batches_total}: {p.records_in:,} records in, "
                  f"{p.completed:,} completed, {p.pending:,} pending", flush=True)  # fmt: skip
        if p.phase == "draining" and not seen["draining"]:
            seen["draining"] = True
            print(f"draining: {p.pending:,} pending", flush=True)

    shown: list[DemoReport] = []

    def show(report: DemoReport) -> None:
        live.stop()  # the last frame stays on screen, above the report
        shown.append(report)
        if args.json:
            print(json.dumps(asdict(report)), flush=True)
            return
        console.print()
        console.print(_report_table(report))
        style = "bold red" if report.lost or report.pending else "bold green"
        console.print(verdict(report), style=style, highlight=False, soft_wrap=True)

    def hold(report: DemoReport) -> None:
        show(report)
        _hold(Console(stderr=True) if args.json else console, page[0] if page else None)

    kwargs: dict[str, Any] = dict(
        records=args.records, fail_rate=args.fail_rate, drop_rate=args.drop_rate,
        crash_rate=args.crash_rate, timeout_s=args.timeout_s, redis_url=args.redis_url,
        batches=args.batches, progress=progress, verbose=args.verbose, on_status_page=on_page,
        hold=hold if args.serve else None, sink=args.sink, sink_url=args.sink_url,
        source=args.source,
    )  # fmt: skip
    with live if live_ok else contextlib.nullcontext():
        report = run_demo(**kwargs)
    if not shown:
        show(report)
    return 1 if report.lost else 0
