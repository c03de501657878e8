"""The ``ftlayer`` command's conventions, run as a user would: exit status 2 for a usage
error and 1 for a runtime error in every command, old names (``stats``, ``status
--timeout-s``) kept as hidden aliases that say so, fixed sets of values listed in
``--help``, and ``serve`` without a URL saying that its Redis is an empty one."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import psutil

from ftlayer import FTConfig, FTLayer
from ftlayer.cli import build_parser
from tests.toolkit import CLI, cli

UNREACHABLE = ["--redis-url", "redis://127.0.0.1:1/0"]


def _one_line(out: subprocess.CompletedProcess[str]) -> str:
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    return lines[0]


def test_usage_errors_exit_2_in_every_command(tmp_path: Path) -> None:
    """Catches: a command whose own checks (ids, option combinations, a missing URL)
    exit 1 like a runtime error, or argparse's 2 lost on the way."""
    cases = [
        ["counters", "--shards", "many"],
        ["counters"],  # no --redis-url: it reads an existing namespace
        ["sources", "--forget", "one"],
        ["functions"],
        ["serve", "--metrics-port", "high"],
        ["status", "--http-timeout-s", "soon"],
        ["dlq", "list", "--since", "yesterday-ish", *UNREACHABLE],
        ["dlq", "show", "not-hex", *UNREACHABLE],
        ["dlq", "replay", *UNREACHABLE],  # neither ids, --all nor filters
        ["dlq", "replay", "--all", "--rate", "0", *UNREACHABLE],
        ["dlq", "purge", "zz", *UNREACHABLE],
        ["dlq", "purge", "00ff", "--source", "1", *UNREACHABLE],  # ids or filters
        ["dlq", "export", str(tmp_path / "x"), "--format", "csv", *UNREACHABLE],
        ["dlq", "export", "-", "--format", "parquet", *UNREACHABLE],
        ["demo", "--sink", "postgres"],  # no --sink-url
        ["completion", "fish"],
    ]
    for args in cases:
        out = cli(*args)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
        assert "error:" in _one_line(out), (args, out.stderr)


def test_runtime_errors_exit_1_in_every_command(tmp_path: Path) -> None:
    """Redis unreachable (and, for ``status``, no sidecar answering): exit 1, one line.
    Catches: the old exit 2 of runtime errors, or a traceback."""
    cases = [
        ["counters"],
        ["stats"],
        ["sources"],
        ["functions"],
        ["serve", "--metrics-port", "-1"],
        ["dlq", "list"],
        ["dlq", "show", "00000000000000ff"],
        ["dlq", "export", str(tmp_path / "x.parquet"), "--format", "parquet"],
        ["dlq", "replay", "--all"],
        ["dlq", "replay", "--all", "--dry-run"],
        ["dlq", "purge", "--yes"],
    ]
    for args in cases:
        out = cli(*args, *UNREACHABLE)
        assert out.returncode == 1, (args, out.returncode, out.stderr)
        assert "cannot reach Redis" in out.stderr.strip().splitlines()[-1], (args, out.stderr)
    out = cli("status", "--url", "http://127.0.0.1:1")
    assert out.returncode == 1 and "no ftlayer sidecar answers" in _one_line(out), out.stderr


def test_refused_and_missing_are_runtime_errors(redis_server) -> None:
    """A namespace nobody opened, a dead letter that is not there, a purge refused
    without --yes: exit 1."""
    ns = f"conv{uuid.uuid4().hex[:8]}"
    url = ["--redis-url", redis_server.url]
    missing = cli("counters", *url, "--namespace", ns)
    assert missing.returncode == 1 and "does not exist" in _one_line(missing)
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, max_replays=0))
    try:
        h = layer.handler()
        rid = h.persist_record({"n": 1}, source=0)
        h.flush()
        layer.fail([rid], error="boom")  # max_replays=0: a dead letter
        common = [*url, "--namespace", ns]
        gone = cli("dlq", "show", "00000000000000ff", *common)
        assert gone.returncode == 1 and "no dead letter" in _one_line(gone)
        refused = cli("dlq", "purge", *common, stdin="")
        assert refused.returncode == 1 and "without --yes" in _one_line(refused)
        assert layer.stats().dead_letters == 1
    finally:
        layer.clear()


def test_top_level_help_states_the_exit_statuses() -> None:
    out = cli("--help")
    assert out.returncode == 0
    text = out.stdout[out.stdout.index("exit status:") :]
    for status, words in (("0", "success"), ("1", "a runtime error"), ("2", "a usage error"),
                          ("130", "interrupted")):  # fmt: skip
        assert re.search(rf"^  {status} +{words}", text, re.M), (status, text)


def test_stats_is_a_hidden_deprecated_alias_of_counters(redis_server) -> None:
    """``ftlayer stats`` still works, same output, plus one line on stderr naming the new
    name; ``ftlayer counters`` says nothing of the kind."""
    ns = f"conv{uuid.uuid4().hex[:8]}"
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns))
    try:
        common = ["--redis-url", redis_server.url, "--namespace", ns, "--json"]
        new, old = cli("counters", *common), cli("stats", *common)
        assert new.returncode == old.returncode == 0, (new.stderr, old.stderr)
        assert new.stdout == old.stdout and '"pending": 0' in new.stdout
        assert new.stderr == ""
        assert _one_line(old) == "ftlayer: `ftlayer stats` is deprecated, use `ftlayer counters`"
    finally:
        layer.clear()


def test_status_timeout_s_is_a_hidden_deprecated_alias_of_http_timeout_s() -> None:
    """``status --timeout-s`` (an HTTP timeout, unlike serve's record timeout) is now
    ``--http-timeout-s``; the old spelling still sets it, says so, and is not in --help."""
    parser = build_parser()
    assert parser.parse_args(["status", "--http-timeout-s", "7"]).http_timeout_s == 7.0
    assert parser.parse_args(["status", "--timeout-s", "9"]).http_timeout_s == 9.0
    assert parser.parse_args(["status"]).http_timeout_s == 5.0
    help_text = cli("status", "--help").stdout
    assert "--http-timeout-s" in help_text and "--timeout-s" not in help_text.replace(
        "--http-timeout-s", "")  # fmt: skip
    old = cli("status", "--url", "http://127.0.0.1:1", "--timeout-s", "2")
    new = cli("status", "--url", "http://127.0.0.1:1", "--http-timeout-s", "2")
    assert old.returncode == new.returncode == 1
    note, error = old.stderr.strip().splitlines()
    assert note == "ftlayer status: --timeout-s is deprecated, use --http-timeout-s", note
    assert error == _one_line(new)


def test_fixed_sets_of_values_are_listed_in_help() -> None:
    """Catches: a flag with a fixed set of values checked by a type function only, so
    --help does not list them (and completion cannot offer them)."""
    wanted = {
        ("counters",): ["--log-level {DEBUG,INFO,WARNING,ERROR}", "--log-format {text,json}",
                        "--script-mode {auto,functions,eval}"],
        (): ["--log-level {DEBUG,INFO,WARNING,ERROR}", "--log-format {text,json}"],
        ("dlq", "export"): ["--format {jsonl,parquet}", "--script-mode {auto,functions,eval}"],
        ("demo",): ["--sink {redis,delta,postgres}"],
        ("completion",): ["{bash,zsh,tcsh}"],
    }  # fmt: skip
    for command, listed in wanted.items():
        text = cli(*command, "--help").stdout
        for choice in listed:
            assert choice in text, (command, choice, text)
    parser = build_parser()
    assert parser.parse_args(["--log-level", "debug", "counters"]).log_level == "DEBUG"


def _lines(stream, into: queue.Queue) -> None:
    for line in stream:
        into.put(line)
    into.put(None)


def test_serve_without_a_url_says_its_redis_is_an_empty_embedded_one() -> None:
    """Catches: a sidecar that silently times out records in a Redis no pipeline uses,
    with the warning only in a log line (or on stdout, among the URLs)."""
    env = {k: v for k, v in os.environ.items() if k != "FTLAYER_REDIS_URL"}
    proc = subprocess.Popen([*CLI, "--log-level", "ERROR", "serve", "--metrics-port", "-1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)  # fmt: skip
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_lines, args=(proc.stderr, lines), daemon=True).start()
    try:
        end, found = time.monotonic() + 60, None
        while found is None and time.monotonic() < end:
            try:
                line = lines.get(timeout=max(0.1, end - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            found = re.search(r"empty embedded Redis on 127\.0\.0\.1:(\d+) ", line) and line
        assert found, f"no warning on stderr; exit {proc.poll()}"
        assert found.startswith("ftlayer serve: no --redis-url") and found.count("\n") == 1
        assert "--redis-url" in found and "FTLAYER_REDIS_URL" in found
        port = int(re.search(r"127\.0\.0\.1:(\d+)", found).group(1))
        redis = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if p.name() == "redis-server"]  # fmt: skip
        assert redis and any(c.laddr.port == port for p in redis for c in p.net_connections()
                             if c.status == "LISTEN"), "the port named is the embedded one"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
