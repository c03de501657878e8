"""``ftlayer dlq``: dead letters an operator can work with -- list with filters and a
decoded payload preview, show one whole, export as JSON lines, re-drive by id or filter,
purge. Modelled on Kafka Connect's dead-letter topics and Pub/Sub / SQS redrive: a dead
letter keeps its bytes, its source and every failed attempt with time and error."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from ftlayer.cli.common import add_common, open_existing
from ftlayer.deadletters import dead_letter_dict, iso_time, preview
from ftlayer.errors import ConfigError
from ftlayer.persistence import DeadLetter

__all__ = ["DeadLetterFilter", "add_dlq_commands", "dead_letter_dict", "parse_since"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(text: str, now_s: float | None = None) -> int:
    """Epoch milliseconds of ``--since``: a duration back from now (``90s``, ``15m``,
    ``2h``, ``7d``) or an ISO 8601 time (``2026-11-24T10:00``, UTC unless it says)."""
    now_s = time.time() if now_s is None else now_s
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if m:
        return int((now_s - float(m.group(1)) * _UNITS[m.group(2)]) * 1000)
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration (90s, 15m, 2h, 7d) nor an ISO time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return int(when.timestamp() * 1000)


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a command acts on; every given criterion must hold."""

    source: int | None = None
    since_ms: int | None = None
    reason: str | None = None
    """A failure reason of its history (``explicit``, ``timeout``), or text its errors
    contain (case-insensitive)."""

    def __call__(self, d: DeadLetter) -> bool:
        if self.source is not None and (d.frame is None or d.frame.source != self.source):
            return False
        if self.since_ms is not None and d.time_ms < self.since_ms:
            return False
        if self.reason is not None:
            want = self.reason.lower()
            return any(f.reason == want or want in f.error.lower() for f in d.history)
        return True

    @property
    def given(self) -> bool:
        return (self.source, self.since_ms, self.reason) != (None, None, None)


def _selected(layer: Any, args: argparse.Namespace) -> list[DeadLetter]:
    keep = _filter(args)
    letters = [d for d in layer.persistence.dead_letters() if keep(d)]
    limit = getattr(args, "limit", None)
    return letters[-limit:] if limit else letters  # the newest ``limit``


def _filter(args: argparse.Namespace) -> DeadLetterFilter:
    return DeadLetterFilter(getattr(args, "source", None), getattr(args, "since", None),
                            getattr(args, "reason", None))  # fmt: skip


def _cmd_list(args: argparse.Namespace) -> int:
    with open_existing(args) as layer:
        letters = _selected(layer, args)
    if args.json:
        print(json.dumps([dead_letter_dict(d, payload=False) | {"preview": preview(d)}
                          for d in letters]))  # fmt: skip
        return 0
    if not letters:
        print("no dead letters" + (" match" if _filter(args).given else ""))
        return 0
    print(f"{'id':<16}  {'source':>6}  {'dead-lettered (UTC)':<19}  {'tries':>5}  "
          f"{'reason':<8}  {'error':<30}  payload")  # fmt: skip
    for d in letters:
        last = d.history[-1] if d.history else None
        source = "?" if d.frame is None else d.frame.source
        error = (last.error if last else "")[:30]
        print(f"{d.source_id:016x}  {source:>6}  {iso_time(d.time_ms)[:19]:<19}  {d.attempts:>5}  "
              f"{last.reason if last else '':<8}  {error:<30}  {preview(d, 50)}")  # fmt: skip
    print(f"({len(letters)} shown; `ftlayer dlq show ID` for one whole)")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    try:
        wanted = int(args.id, 16)
    except ValueError:
        text = f"dead-letter ids are hex, as `dlq list` prints them: {args.id!r}"
        raise ConfigError(text) from None
    with open_existing(args) as layer:
        found = layer.persistence.dead_letter(wanted)
    if found is None:
        raise ConfigError(f"no dead letter {args.id} in namespace {args.namespace}")
    d = dead_letter_dict(found)
    if args.json:
        print(json.dumps(d))
        return 0
    for key in ("id", "source", "hash_code", "partition", "payload_bytes", "attempts",
                "dead_lettered", "frame_error", "payload_error"):  # fmt: skip
        if d[key] is not None:
            print(f"{key:<14} {d[key]}")
    print("payload")
    print(json.dumps(d["payload"], indent=2, default=repr) if d["payload_error"] is None
          else f"  raw (hex): {d['raw_hex']}")  # fmt: skip
    print("attempts")
    for h in d["history"]:
        print(f"  {h['time']}  {h['reason']:<8} #{h['attempt']}  {h['error']}")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    with open_existing(args) as layer:
        letters = _selected(layer, args)
    out: TextIO = sys.stdout if args.file == "-" else open(args.file, "w")  # noqa: SIM115
    try:
        for d in letters:
            out.write(json.dumps(dead_letter_dict(d)) + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    if args.file != "-":
        print(f"exported: {len(letters)} to {args.file}", file=sys.stderr)
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    by_filter = _filter(args).given
    if sum((bool(args.ids), args.all, by_filter)) != 1:
        raise ConfigError("give dead-letter ids, --all, or filters (--source/--since/--reason)")
    try:
        ids = [int(i, 16) for i in args.ids]
    except ValueError:
        raise ConfigError(f"ids are hex, as `dlq list` prints them: {args.ids}") from None
    with open_existing(args) as layer:
        if by_filter:
            ids = [d.source_id for d in _selected(layer, args)]
            if not ids:
                print("re-driven: 0 (no dead letter matches)")
                return 0
        n = layer.dlq_replay(None if args.all else ids)
    print(f"re-driven: {n}")
    return 0 if args.all or n == len(ids) else 1


def _cmd_purge(args: argparse.Namespace) -> int:
    with open_existing(args) as layer:
        n = layer.stats().dead_letters
        if not n:
            print("no dead letters")
            return 0
        if not args.yes:
            if not sys.stdin.isatty():
                raise ConfigError(f"refusing to purge {n} dead letters without --yes")
            answer = input(f"Delete {n} dead letters for good? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing purged")
                return 1
        print(f"purged: {layer.dlq_purge()}")
    return 0


def _add_filters(p: argparse.ArgumentParser, limit: bool = True) -> None:
    p.add_argument("--source", type=int, default=None, help="only this source index")
    p.add_argument("--since", type=parse_since, default=None,
                   help="dead-lettered since: 90s, 15m, 2h, 7d, or an ISO time (UTC)")  # fmt: skip
    p.add_argument("--reason", default=None, help="a failure reason (explicit, timeout) or "
                   "text its errors contain")  # fmt: skip
    if limit:
        p.add_argument("--limit", type=int, default=None, help="the newest N that match")


def add_dlq_commands(sub: Any) -> None:
    dlq = sub.add_parser("dlq", help="list, show, export, re-drive or purge dead letters")
    actions = dlq.add_subparsers(dest="dlq_command", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="dead letters, oldest first, with a payload preview")
    add_common(ls)
    _add_filters(ls)
    ls.add_argument("--json", action="store_true", help="a JSON list")
    ls.set_defaults(func=_cmd_list)
    show = actions.add_parser("show", help="one dead letter whole: payload and every attempt")
    add_common(show)
    show.add_argument("id", help="its id, as `dlq list` prints it (hex)")
    show.add_argument("--json", action="store_true", help="one JSON object")
    show.set_defaults(func=_cmd_show)
    export = actions.add_parser("export", help="dead letters as JSON lines (payload included)")
    add_common(export)
    export.add_argument("file", help="file to write, - for stdout")
    _add_filters(export)
    export.set_defaults(func=_cmd_export)
    replay = actions.add_parser("replay", help="re-drive dead letters (after a fix) under new "
                                "ids, by id, --all, or filter")  # fmt: skip
    add_common(replay)
    replay.add_argument("ids", nargs="*", help="ids as `dlq list` prints them (hex)")
    replay.add_argument("--all", action="store_true", help="every dead letter")
    _add_filters(replay)
    replay.set_defaults(func=_cmd_replay)
    purge = actions.add_parser("purge", help="delete every dead letter")
    add_common(purge)
    purge.add_argument("--yes", action="store_true", help="do not ask")
    purge.set_defaults(func=_cmd_purge)
