"""``ftlayer status``: where a sidecar's status page is, and what it says right now.

It asks a running ``ftlayer serve`` (its ``--metrics-host``/``--metrics-port``) for
``/api/status`` and prints the page's URL and a short summary; ``--open`` also opens the
page in a browser, ``--json`` prints the whole answer. A sidecar bound beyond loopback
asks for its status token (``--status-token`` / ``FTLAYER_STATUS_TOKEN``): sent as a
Bearer header, and in the link ``--open`` opens (the page sets a cookie and drops it from
the address). Not to be confused with ``ftlayer
counters`` (formerly ``stats``), which reads the counters from Redis itself.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
import webbrowser
from typing import Any

from ftlayer.cli.common import deprecated_flag, opt
from ftlayer.errors import ConfigError

__all__ = ["add_status_command"]


def _fetch(url: str, timeout_s: float, token: str | None) -> dict[str, Any]:
    ask = urllib.request.Request(f"{url}/api/status")
    if token:
        ask.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(ask, timeout=timeout_s) as reply:
            return dict(json.load(reply))
    except urllib.error.HTTPError as e:
        if e.code == 401:
            raise ConfigError(f"the sidecar at {url} asks for its status token: "
                              f"{e.read().decode(errors='replace').strip()} (pass "
                              "--status-token or set FTLAYER_STATUS_TOKEN)") from e  # fmt: skip
        raise ConfigError(f"the sidecar at {url} answered {e.code} {e.reason}") from e
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(f"no ftlayer sidecar answers at {url}: {reason} "
                          "(start one with `ftlayer serve`, or pass --url)") from e  # fmt: skip


def _num(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.2f}".rstrip("0").rstrip(".") if isinstance(v, float) else f"{v:,}"


def _cmd_status(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    data = _fetch(url, args.http_timeout_s, args.status_token)
    if args.json:
        print(json.dumps(data, sort_keys=True))
    else:
        print(f"status page: {url}/")
        print(f"namespace {data['namespace']}  sidecar {data['sidecar']['id']} "
              f"({'leader' if data['sidecar']['leader'] else 'standby'})  "
              f"lease holder {data.get('lease_holder') or '-'}")  # fmt: skip
        if not data.get("redis_up"):
            print(f"Redis unreachable: {data.get('error')}")
        else:
            t, lat = data["totals"], data["latency_ms"]
            print(f"pending {_num(t['pending'])} (queued replays {_num(t['queued_replays'])}, "
                  f"oldest {_num(t['oldest_pending_age_s'])} s)  completed "
                  f"{_num(t['completed'])}  replayed {_num(t['replayed'])}  dead letters "
                  f"{_num(t['dead_letters'])}")  # fmt: skip
            print(f"completion latency ms: p50 {_num(lat['p50'])}  p90 {_num(lat['p90'])}  "
                  f"p99 {_num(lat['p99'])}")  # fmt: skip
    if args.open:
        token = args.status_token
        webbrowser.open(f"{url}/" + (f"?token={urllib.parse.quote(token)}" if token else ""))
    return 0 if data.get("redis_up") else 1


def add_status_command(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="the status page of a running sidecar: its URL and a summary",
        description="Asks a running `ftlayer serve` for /api/status (`ftlayer counters` "
        "reads the counters from Redis instead). Exit status 1 when no sidecar answers or "
        "the sidecar cannot reach Redis.",
    )
    opt(p, "--url", str, "http://127.0.0.1:9464", "the sidecar's HTTP address "
        "(its --metrics-host and --metrics-port)")  # fmt: skip
    opt(p, "--status-token", str, None, "the sidecar's status token (its --status-token), "
        "if it asks for one")  # fmt: skip
    p.add_argument("--open", action="store_true", help="also open the page in a browser")
    p.add_argument("--json", action="store_true", help="print the whole /api/status answer")
    opt(p, "--http-timeout-s", float, 5.0, "how long to wait for the sidecar's answer")
    deprecated_flag(p, "--timeout-s", "--http-timeout-s", type=float)
    p.set_defaults(func=_cmd_status)
