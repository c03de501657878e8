"""The installed ``ftlayer`` command and the README's example, run as a user would."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftlayer.scripts import SCRIPTS
from tests.faults import session_pids
from tests.toolkit import CLI, Started, ended, start, stop

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


def test_help_lists_commands_and_env_vars() -> None:
    exe = Path(sys.executable).with_name("ftlayer")
    out = _run([str(exe) if exe.exists() else "ftlayer", "--help"])
    assert out.returncode == 0, out.stderr
    for word in ("counters", "status", "demo", "redis"):
        assert re.search(rf"^    {word} ", out.stdout, re.M), (word, out.stdout)
    assert not re.search(r"^    stats\b", out.stdout, re.M), "the old name is hidden"
    sub = _run([*CLI, "counters", "--help"])
    assert "FTLAYER_REDIS_URL" in sub.stdout and "FTLAYER_NAMESPACE" in sub.stdout


def test_core_api_example_runs_as_written() -> None:
    core = (ROOT / "docs" / "core-api.md").read_text()
    code = re.search(r"```python\n(.*?)```", core, re.S).group(1)
    # a session of its own: what the example started and left running stays in it
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    lines = stdout.splitlines()
    assert lines[0] == "completed=2 failed=1 pending=1"
    assert lines[1].startswith("{'order': 1} hash_code 1 new id ")
    left = session_pids(proc.pid)
    assert not left, f"the example left processes running (the embedded redis-server?): {left}"


def test_core_api_array_example_runs_as_written() -> None:
    core = (ROOT / "docs" / "core-api.md").read_text()
    code = re.findall(r"```python\n(.*?)```", core, re.S)[1]
    assert "persist_many" in code
    out = _run([sys.executable, "-c", code], cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["completed=990 queued_replays=10"]


def test_readme_pipelines_are_the_tested_ones() -> None:
    """The README's pipelines are the ones tests/spark runs: the DataFrame one first (from
    docs/dataframe-stages.md), then the Arrow one (from docs/vectorized.md)."""
    block = re.compile(r"```python\n(.*?)```", re.S)
    readme = (ROOT / "README.md").read_text()
    blocks = block.findall(readme[readme.index("## A fault-tolerant") :])
    first = blocks[0]
    frames = (ROOT / "docs" / "dataframe-stages.md").read_text()
    assert first == block.search(frames).group(1)
    assert ".transform(" in first and ".sink_dataframe(" in first and "write" in first
    arrow = block.search((ROOT / "docs" / "vectorized.md").read_text()).group(1)
    assert arrow in blocks[1:4], "the Arrow pipeline follows the DataFrame one"
    assert len(first.strip().splitlines()) < 25 and len(arrow.strip().splitlines()) < 25


def test_demo_json_loses_nothing() -> None:
    """The main job, small: a real streaming query, a real sidecar process, every kind of
    failure injected; `lost` is counted from the sink's contents. With -v, the logs go to
    stderr, never into the JSON on stdout."""
    out = _run([*CLI, "demo", "--records", "3000", "--batches", "3", "--fail-rate", "0.05",
                "--drop-rate", "0.03", "--crash-rate", "1.0", "--timeout-s", "1.5", "--json",
                "-v"])  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("\n") == 1, out.stdout  # --json: the object and nothing else
    assert "INFO ftlayer.spark.report batch done" in out.stderr  # -v shows more
    r = json.loads(out.stdout)
    assert set(r) == {
        "source_records", "completed", "replayed", "failed_explicit", "timed_out",
        "dead_lettered", "lost", "pending", "sink_rows", "dead_in_sink", "duplicates", "rewrites",
        "misplaced", "crashed_tasks", "micro_batches", "elapsed_s", "sink", "source",
    }  # fmt: skip
    assert r["lost"] == 0 and r["pending"] == 0 and r["misplaced"] == 0
    assert r["failed_explicit"] > 0 and r["timed_out"] > 0, "both failure kinds injected"
    assert r["crashed_tasks"] >= 3, "every source task crashed once and was retried"
    assert r["replayed"] == r["failed_explicit"] + r["timed_out"] - r["dead_lettered"]
    assert r["completed"] + r["dead_lettered"] == r["source_records"] == 3000
    assert r["sink_rows"] - r["duplicates"] + r["dead_lettered"] == 3000
    assert r["dead_in_sink"] == 0, "the list holds confirmed writes only"


IDEMPOTENT = [("delta", "kafka"), ("postgres", "files")]


@pytest.fixture(scope="module")
def idempotent_demos(postgres: Any) -> Iterator[dict[tuple[str, str], Started]]:
    """The demo runs of the test below, started side by side (a demo waits on timeouts
    much of its time)."""
    runs = {}
    for sink, source in IDEMPOTENT:
        extra = ["--sink-url", postgres.url] if sink == "postgres" else []
        runs[(sink, source)] = start(
            [*CLI, "--log-level", "WARNING", "demo", "--records", "2000", "--batches", "2",
             "--drop-rate", "0.3", "--timeout-s", "1.5", "--sink", sink, "--source", source,
             *extra, "--json"])  # fmt: skip
    yield runs
    for started in runs.values():
        stop(started)


@pytest.mark.slow
@pytest.mark.parametrize(("sink", "source"), IDEMPOTENT)
def test_demo_into_an_idempotent_table_counts_from_it(
    sink: str, source: str, idempotent_demos: dict[tuple[str, str], Started]
) -> None:
    """``--sink delta`` / ``--sink postgres``: the orders also go through ftlayer's
    idempotent sink, the unconfirmed writes too (their rows landed): records are written
    again, and the table -- where lost and duplicates are counted -- holds each once.
    ``--source kafka`` (with Delta): the orders come from a topic on a broker the demo
    starts, kept by reference, their replays read back by offset. Catches: rewrites that
    become duplicates in the table, a report counted from the Redis list instead of the
    table, a record in the table and dead-lettered counted twice, Kafka replays lost or
    read back as other records."""
    out = ended(idempotent_demos[(sink, source)], 300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    assert r["sink"] == sink and r["source"] == source
    assert r["lost"] == 0 and r["pending"] == 0
    assert r["rewrites"] > 0, "unconfirmed writes landed and were written again"
    # a record whose write landed unconfirmed and whose replays all failed is in the
    # table and dead-lettered (at a 30 % drop rate, ~0.3**4 of them): counted once
    assert r["duplicates"] == 0 and r["dead_in_sink"] > 0
    assert r["sink_rows"] + r["dead_lettered"] - r["dead_in_sink"] == 2000


def test_demo_postgres_sink_without_a_server_says_so() -> None:
    out = _run([*CLI, "demo", "--records", "10", "--sink", "postgres"])
    assert out.returncode == 2 and "--sink-url" in out.stderr, out.stderr[-2000:]  # usage
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.slow
def test_demo_reads_like_a_report_and_serve_keeps_the_status_page_up() -> None:
    """The default output is a report: its table, its progress lines and its verdict, and
    none of Spark's JVM noise, progress bar or INFO lines (it was a wall of log lines;
    -v shows them: test_demo_json_loses_nothing). With --serve the report comes first,
    then the sidecar's status page stays up, showing the demo's records, until Ctrl-C.
    Catches: --serve that tears the sidecar down with the report (nothing to look at), a
    page that does not show the demo's records, and Ctrl-C that does not end it."""
    import signal
    import urllib.request

    cmd = [*CLI, "demo", "--records", "1000", "--batches", "2", "--timeout-s", "1.5",
           "--serve"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stderr is not None
        page, lines = None, []
        for line in proc.stdout:
            lines.append(line)
            if m := re.search(r"status page: (http://\S+)", line):
                page = m.group(1)
            if "stays up" in line:
                break
        report = "".join(lines)
        assert page, "no status page URL printed"
        assert "ftlayer demo report" in report and "lost" in report, report
        assert re.search(r"^OK: 1,000 records, 0 lost, \d+ replayed, 0 dead-lettered, \d+ "
                         r"crashed tasks? recovered \([\d.]+ s\)$", report, re.M), report
        assert re.search(r"^micro-batch 2/2: 1,000 records in", report, re.M), report
        assert re.search(r"^draining: \d+ pending$", report, re.M), report
        with urllib.request.urlopen(page + "api/status", timeout=10) as reply:
            status = json.load(reply)
        assert status["totals"]["completed"] == 1000 and status["totals"]["pending"] == 0
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        text = report + proc.stdout.read() + proc.stderr.read()
        for noise in ("INFO", "WARN", "log4j", "[Stage", "Traceback", "NativeCodeLoader"):
            assert noise not in text, (noise, text[-3000:])
    finally:
        if proc.poll() is None:  # and its Redis, sidecar and JVM: none outlives a failure
            os.killpg(proc.pid, signal.SIGKILL)


def test_counters_json_on_an_explicit_url(redis_server) -> None:
    from ftlayer import FTConfig, FTLayer

    args = [*CLI, "counters", "--json", "--redis-url", redis_server.url, "--namespace",
            "cli-e"]  # fmt: skip
    out = _run(args)  # never opened: said so, not zeros (tests/test_settings.py)
    assert out.returncode == 1 and "does not exist" in out.stderr, out.stderr
    layer = FTLayer(redis_server.client(), FTConfig(namespace="cli-e"))  # opened, empty
    try:
        out = _run(args)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["pending"] == 0
    finally:
        layer.clear()


def test_script_mode_picks_functions_or_eval(redis_server, redis7_server) -> None:
    """``--script-mode``: functions on Redis 7, refused on 6.2 with one line; eval on both."""
    from ftlayer import FTConfig, FTLayer

    for server in (redis_server, redis7_server):
        FTLayer(server.client(), FTConfig(namespace="cli-sm"))
    try:
        cases = ((redis7_server, "functions", True), (redis_server, "eval", True),
                 (redis7_server, "eval", True), (redis_server, "functions", False))  # fmt: skip
        for server, mode, ok in cases:
            out = _run([*CLI, "counters", "--redis-url", server.url, "--namespace",
                        "cli-sm", "--script-mode", mode])  # fmt: skip
            if ok:
                assert out.returncode == 0 and "persisted" in out.stdout, (mode, out.stderr)
            else:
                assert out.returncode == 1 and "cannot load functions" in out.stderr, out.stderr
                assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    finally:
        for server in (redis_server, redis7_server):
            FTLayer(server.client(), FTConfig(namespace="cli-sm", script_mode="eval")).clear()


def test_functions_lists_this_builds_library_and_prunes_other_builds_only(
    redis_server, redis7_server
) -> None:
    """An upgrade leaves the old build's library: listed as another build's, deleted by
    --prune; this build's library and a user's own library are never touched; on 6.2 the
    command says there are no functions."""
    from ftlayer import FTConfig, FTLayer
    from ftlayer.scripts import library_source

    client = redis7_server.client()
    client.function_flush()
    current = library_source()[0]
    old = "ftlayer_000000000000"
    client.function_load(
        f"#!lua name={old}\nredis.register_function('{old}_flush', function() return 1 end)"
    )
    client.function_load(
        "#!lua name=userlib\nredis.register_function('userfn', function() return 2 end)"
    )
    FTLayer(client, FTConfig(namespace="cli-fn", script_mode="functions"))  # loads current
    out = _run([*CLI, "functions", "--redis-url", redis7_server.url])
    assert out.returncode == 0, out.stderr
    assert f"{current}  {len(SCRIPTS):>2} functions  this build's" in out.stdout, out.stdout
    assert f"{old}   1 functions  another build's" in out.stdout, out.stdout
    assert "userlib" not in out.stdout and "--prune` deletes it" in out.stdout
    out = _run([*CLI, "functions", "--redis-url", redis7_server.url, "--prune", "--json"])
    report = json.loads(out.stdout)
    assert [lib["name"] for lib in report["pruned"]] == [old]
    assert [(lib["name"], lib["current"]) for lib in report["libraries"]] == [(current, True)]
    names = {_lib_name(lib) for lib in client.function_list()}
    assert names == {current, "userlib"}, names
    out = _run([*CLI, "functions", "--redis-url", redis_server.url])
    assert out.returncode == 0 and "no functions (Redis < 7)" in out.stdout, out
    client.function_delete("userlib")


def _lib_name(flat: list) -> str:
    return dict(zip(flat[::2], flat[1::2], strict=True))[b"library_name"].decode()


def test_unreachable_redis_is_a_clear_error() -> None:
    out = _run([*CLI, "counters", "--redis-url", "redis://u:hunter2@127.0.0.1:1/0"])
    assert out.returncode == 1
    assert "cannot reach Redis" in out.stderr and "hunter2" not in out.stderr


def test_counters_and_dlq_need_a_url() -> None:
    for args in (["counters"], ["dlq", "list"]):
        out = _run([*CLI, *args])
        assert out.returncode == 2 and "give --redis-url" in out.stderr, out.stderr  # usage


def test_global_options_go_anywhere_and_bad_values_are_one_line(redis_server) -> None:
    url = redis_server.url
    from ftlayer import FTConfig, FTLayer

    FTLayer(redis_server.client(), FTConfig(namespace="cli-globals")).handler()
    for args in (["--log-level", "warning", "counters"], ["counters", "--log-level", "warning"]):
        out = _run([*CLI, *args, "--redis-url", url, "--namespace", "cli-globals"])
        assert out.returncode == 0 and "persisted" in out.stdout, out.stderr
    for bad in (["counters", "--log-level", "loud"], ["--log-format", "xml", "counters"],
                ["counters", "--shards", "many"], ["dlq", "list", "--bogus"], ["dlq"],
                ["counters", "--script-mode", "fast"]):  # fmt: skip
        out = _run([*CLI, *bad])
        assert out.returncode == 2, (bad, out)
        assert len(out.stderr.strip().splitlines()) == 1, (bad, out.stderr)
        assert "error:" in out.stderr and "Traceback" not in out.stderr
    env = {**os.environ, "FTLAYER_LOG_LEVEL": "shouting"}
    out = _run([*CLI, "counters"], env=env)
    assert out.returncode == 2 and "'shouting' is not one of" in out.stderr
    env = {**os.environ, "FTLAYER_SCRIPT_MODE": "fast"}  # argparse's choices never see these
    out = _run([*CLI, "counters"], env=env)
    assert out.returncode == 2 and "'fast' is not one of" in out.stderr


def test_every_error_of_ours_is_one_line_usage_2_runtime_1(redis_server) -> None:
    cases = {
        "no url": (["counters"], 2),
        "bad id": (["dlq", "replay", "zz", "--redis-url", redis_server.url], 2),
        "unreachable": (["counters", "--redis-url", "redis://127.0.0.1:1/0"], 1),
        "nobody opened it": (["dlq", "list", "--redis-url", redis_server.url, "--namespace",
                              "never-opened"], 1),
    }  # fmt: skip
    for why, (args, status) in cases.items():
        out = _run([*CLI, *args])
        assert out.returncode == status, (why, out)
        assert len(out.stderr.strip().splitlines()) == 1, (why, out.stderr)
        assert out.stderr.startswith("ftlayer"), (why, out.stderr)


def test_json_logs_are_one_object_per_line_with_the_messages_fields() -> None:
    out = _run([*CLI, "counters", "--log-format", "json", "--log-level", "debug"])
    assert out.returncode == 2
    *logs, last = out.stderr.strip().splitlines()
    assert last.startswith("ftlayer counters: error: `ftlayer counters` reads an existing "
                           "namespace"), last  # fmt: skip
    records = [json.loads(line) for line in logs]
    failed = [r for r in records if r["message"] == "command failed"]
    assert failed and failed[0]["level"] == "DEBUG" and "UsageError" in failed[0]["exception"]
    from ftlayer.logs import JsonFormatter

    rec = logging.LogRecord("ftlayer.x", logging.INFO, __file__, 1,
                            "batch done batch_id=%s error=%r", (7, "a b"), None)  # fmt: skip
    assert {k: v for k, v in json.loads(JsonFormatter().format(rec)).items()
            if k in ("batch_id", "error", "level")} == {"batch_id": "7", "error": "a b",
                                                         "level": "INFO"}  # fmt: skip


def test_bash_completion_completes_commands_and_options(tmp_path) -> None:
    out = _run([*CLI, "completion", "bash"])
    assert out.returncode == 0, out.stderr
    script = tmp_path / "ftlayer.bash"
    script.write_text(out.stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(words)
        cmd = (f"source {script}; COMP_WORDS=({' '.join(repr(w) for w in words)}); "
               f"COMP_CWORD={len(words) - 1}; COMP_LINE={line!r}; COMP_POINT={len(line)}; "
               "_shtab_ftlayer; printf '%s\\n' \"${COMPREPLY[@]}\"")  # fmt: skip
        res = _run(["bash", "-c", cmd])
        assert res.returncode == 0, res.stderr
        return res.stdout.split()

    assert complete("ftlayer", "dl") == ["dlq"]
    assert set(complete("ftlayer", "dlq", "")) >= {"list", "replay", "purge"}
    assert "--log-format" in complete("ftlayer", "counters", "--log-f")
    assert _run([*CLI, "completion", "zsh"]).stdout.startswith("#compdef ftlayer")


def test_an_interrupt_re_raised_as_another_error_is_still_an_interrupt() -> None:
    """py4j re-raises a Ctrl-C that lands inside a gateway call as a Py4JError whose
    context is the KeyboardInterrupt: commands exit 130 for it (ftlayer.errors)."""
    from py4j.protocol import Py4JError

    from ftlayer.errors import interrupted

    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise Py4JError("Gateway must be connected to send cancel cmd.") from None
    except Py4JError as e:
        assert not interrupted(e), "from None hides the interrupt: not ours to claim"
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise Py4JError("Gateway must be connected to send cancel cmd.")  # noqa: B904
    except Py4JError as e:
        assert interrupted(e)
    assert not interrupted(ValueError("a plain error"))
