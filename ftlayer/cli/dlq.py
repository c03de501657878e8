"""``ftlayer dlq``: dead letters an operator can work with -- list with filters and a
decoded payload preview, show one whole, export as JSON lines or Parquet, re-drive by id
or filter (``--dry-run``; ``--rate N`` paces it at N a second), purge by id or filter.
Modelled on Kafka Connect's dead-letter topics and Pub/Sub / SQS redrive: a dead letter
keeps its bytes, its source and every failed attempt with time and error."""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TextIO

from ftlayer.cli.common import UsageError, add_common, one_of, open_existing
from ftlayer.deadletters import dead_letter_dict, iso_time, preview
from ftlayer.errors import ConfigError
from ftlayer.ids import shard_of
from ftlayer.persistence import DeadLetter

__all__ = ["DeadLetterFilter", "add_dlq_commands", "dead_letter_dict", "parse_since"]

log = logging.getLogger("ftlayer.cli")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_MAX_CHUNK = 500
"""Most dead letters one paced re-drive call takes (``--rate``: about ten calls a
second, fewer records each at a low rate)."""

_FORMATS = ("jsonl", "parquet")


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


def _hex_ids(texts: Sequence[str]) -> list[int]:
    try:
        return [int(i, 16) for i in texts]
    except ValueError:
        text = f"dead-letter ids are hex, as `dlq list` prints them: {list(texts)}"
        raise UsageError(text) from None


def _by_ids(layer: Any, ids: Sequence[int]) -> tuple[list[DeadLetter], list[int]]:
    """(the dead letters of ``ids`` that exist, the ids that do not)."""
    found, missing = [], []
    for i in dict.fromkeys(ids):
        d = layer.persistence.dead_letter(i)
        if d is None:
            missing.append(i)
        else:
            found.append(d)
    return found, missing


def _plan(verb: str, letters: Sequence[DeadLetter], missing: Sequence[int]) -> None:
    """``--dry-run``: how many would be acted on, per source and (last failure) reason."""
    print(f"dry run: would {verb} {len(letters)} dead letter{'' if len(letters) == 1 else 's'}; "
          "nothing changed")  # fmt: skip
    groups = Counter(
        ("?" if d.frame is None else str(d.frame.source), d.history[-1].reason if d.history
         else "-") for d in letters
    )  # fmt: skip
    if groups:
        print(f"  {'source':>6}  {'reason':<9} {'count':>7}")
    for (source, reason), n in sorted(groups.items()):
        print(f"  {source:>6}  {reason:<9} {n:>7}")
    if missing:
        print(f"  not found: {' '.join(f'{i:016x}' for i in missing)}")


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
    (wanted,) = _hex_ids([args.id])
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
    if args.format == "parquet" and args.file == "-":
        raise UsageError("--format parquet writes a file: give its path, not -")
    with open_existing(args) as layer:
        letters = _selected(layer, args)
    if args.format == "parquet":
        from ftlayer.cli.dlq_parquet import write_parquet

        write_parquet(letters, args.file)
    else:
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
        raise UsageError("give dead-letter ids, --all, or filters (--source/--since/--reason)")
    ids = _hex_ids(args.ids)
    with open_existing(args) as layer:
        if args.dry_run:
            letters, missing = _by_ids(layer, ids) if ids else (_selected(layer, args), [])
            _plan("re-drive", letters, missing)
            return 0
        if by_filter or (args.all and args.rate):
            ids = [d.source_id for d in _selected(layer, args)]
            if not ids:
                print("re-driven: 0 (no dead letter " + ("matches)" if by_filter else "held)"))
                return 0
        if args.rate:
            return _paced(layer, ids, args.rate)
        n = layer.dlq_replay(None if args.all else ids)
    print(f"re-driven: {n}")
    return 0 if args.all or n == len(ids) else 1


class _Stop:
    """Ctrl-C asked for a stop. A flag the signal handler sets, and sleeps short enough to
    see it soon: never a lock (a threading.Event's, taken by a handler that interrupted
    its own thread holding it, would deadlock)."""

    asked = False

    def ask(self, *_: Any) -> None:
        self.asked = True

    def wait_until(self, due: float) -> bool:
        """Sleep until ``due`` (time.monotonic) or a stop; whether one was asked."""
        while not self.asked and (left := due - time.monotonic()) > 0:
            time.sleep(min(left, 0.05))
        return self.asked


def _paced(layer: Any, ids: list[int], rate: float) -> int:
    """Re-drive ``ids`` in chunks, each sent no sooner than the average since the start
    allows (at most ``rate`` a second, counting the chunk); progress on stderr. Ctrl-C
    (SIGINT) stops between chunks -- the chunk in flight completes, so the count is
    exact -- with a line saying how many were re-driven; exit status 130."""
    chunk = max(1, min(_MAX_CHUNK, int(rate / 10)))
    stop = _Stop()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, stop.ask) if main else None
    tty = sys.stderr.isatty()
    done = sent = 0
    start = shown = time.monotonic()
    try:
        for i in range(0, len(ids), chunk):
            part = ids[i : i + chunk]
            due = start + (done + len(part)) / rate
            if stop.wait_until(due):
                break
            done += layer.dlq_replay(part)
            sent += len(part)
            now = time.monotonic()
            if tty or i == 0 or now - shown >= 1.0 or sent == len(ids):
                shown = now
                line = f"re-driving: {done}/{len(ids)} ({done / max(now - start, 1e-9):.1f}/s)"
                print(f"\r{line}" if tty else line, end="" if tty else "\n", file=sys.stderr,
                      flush=True)  # fmt: skip
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
        if tty:
            print(file=sys.stderr)
    elapsed = time.monotonic() - start
    if sent < len(ids):
        print(f"re-driven: {done} of {len(ids)}, stopped by Ctrl-C after {elapsed:.1f} s; "
              f"the other {len(ids) - sent} are still dead letters", flush=True)  # fmt: skip
        return 130
    print(f"re-driven: {done} in {elapsed:.1f} s ({done / max(elapsed, 1e-9):.1f}/s)")
    return 0 if done == len(ids) else 1


def _confirm(args: argparse.Namespace, n: int) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigError(f"refusing to purge {n} dead letters without --yes")
    answer = input(f"Delete {n} dead letter{'' if n == 1 else 's'} for good? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def _delete(layer: Any, ids: Sequence[int]) -> int:
    """Delete the dead letters ``ids`` (one HDEL per shard; what ``FTLayer.dlq_purge``
    does to all of them). Returns how many were still there."""
    by_shard: dict[int, list[bytes]] = {}
    for src in ids:
        by_shard.setdefault(shard_of(src, layer.config.shards), []).append(src.to_bytes(8, "big"))
    n = sum(int(layer.client.hdel(layer.keyspace[k].dlq, *fields))
            for k, fields in by_shard.items())  # fmt: skip
    if n:
        log.warning("dead letters purged namespace=%s purged=%d", layer.config.namespace, n)
    return n


def _cmd_purge(args: argparse.Namespace) -> int:
    ids = _hex_ids(args.ids)
    some = _filter(args).given or args.limit is not None
    if ids and some:
        raise UsageError("give dead-letter ids or filters (--source/--since/--reason/--limit), "
                         "not both")  # fmt: skip
    missing: list[int] = []
    with open_existing(args) as layer:
        letters: list[DeadLetter] | None = None  # None: every dead letter
        if ids:
            letters, missing = _by_ids(layer, ids)
        elif some:
            letters = _selected(layer, args)
        if args.dry_run:
            _plan("purge", layer.persistence.dead_letters() if letters is None else letters,
                  missing)  # fmt: skip
            return 0
        n = layer.stats().dead_letters if letters is None else len(letters)
        if not n:
            print("no dead letters" + ("" if letters is None else " match"))
            return 1 if missing else 0
        if not _confirm(args, n):
            print("nothing purged")
            return 1
        purged = layer.dlq_purge() if letters is None else _delete(
            layer, [d.source_id for d in letters])  # fmt: skip
    gone = f"; not found: {' '.join(f'{i:016x}' for i in missing)}" if missing else ""
    print(f"purged: {purged}{gone}")
    return 1 if missing or (letters is not None and purged < len(letters)) else 0


def _positive(value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{value!r}: records per second, more than 0")
    return v


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
    export = actions.add_parser(
        "export", help="dead letters as JSON lines or Parquet (payload included)",
        description="jsonl: one JSON object a line, as `dlq show --json` prints one. parquet "
        "(a file Spark reads: spark.read.parquet(FILE)): a row per dead letter with id, "
        "source, hash_code, partition, lineage, attempts, dead_lettered, reason and error "
        "(the last failure's), history (every failure: reason, time, attempt, error), "
        "frame_error, payload_error, payload_raw (the record's msgpack bytes), "
        "payload_json, and payload: the decoded record's columns as a struct where records "
        "are maps (dicts, Arrow/Spark rows); `select('payload.*')` gives them as columns.",
    )  # fmt: skip
    add_common(export)
    export.add_argument("file", help="file to write, - for stdout (jsonl only)")
    export.add_argument("--format", type=one_of(*_FORMATS), choices=_FORMATS, default="jsonl",
                        help="default: %(default)s")  # fmt: skip
    _add_filters(export)
    export.set_defaults(func=_cmd_export)
    replay = actions.add_parser(
        "replay", help="re-drive dead letters (after a fix) under new ids, by id, --all, or "
        "filter",
        description="Each goes back to its source's replay queue under a new id, its "
        "history kept, its replay budget fresh. --dry-run prints how many would go, per "
        "source and reason. --rate N re-drives at most N a second (like SQS's redrive "
        "velocity), in chunks (with --all: the dead letters held when it starts), with progress "
        "on stderr; Ctrl-C stops it between chunks and says how many were re-driven (exit "
        "status 130). Exit status 1 when an id given was not re-driven.",
    )  # fmt: skip
    add_common(replay)
    replay.add_argument("ids", nargs="*", help="ids as `dlq list` prints them (hex)")
    replay.add_argument("--all", action="store_true", help="every dead letter")
    _add_filters(replay)
    replay.add_argument("--dry-run", action="store_true",
                        help="print what would be re-driven; change nothing")  # fmt: skip
    replay.add_argument("--rate", type=_positive, default=None, metavar="N",
                        help="records per second, at most (default: all at once)")  # fmt: skip
    replay.set_defaults(func=_cmd_replay)
    purge = actions.add_parser(
        "purge", help="delete dead letters for good: by id, by filter, or all",
        description="Without ids or filters it deletes every dead letter. It asks first "
        "(on a terminal) or needs --yes. --dry-run prints how many would go, per source "
        "and reason.",
    )  # fmt: skip
    add_common(purge)
    purge.add_argument("ids", nargs="*", help="ids as `dlq list` prints them (hex)")
    _add_filters(purge)
    purge.add_argument("--dry-run", action="store_true",
                       help="print what would be purged; change nothing")  # fmt: skip
    purge.add_argument("--yes", action="store_true", help="do not ask")
    purge.set_defaults(func=_cmd_purge)
