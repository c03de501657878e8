"""The installed ``ftlayer`` command and the README's example, run as a user would."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
FTLAYER = [sys.executable, "-m", "ftlayer.cli"]


def _run(args: list[str], **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=300, **kw)


def _redis_children() -> set[int]:
    return {p.pid for p in psutil.process_iter(["name"]) if p.info["name"] == "redis-server"}


def test_help_lists_commands_and_env_vars() -> None:
    exe = Path(sys.executable).with_name("ftlayer")
    out = _run([str(exe) if exe.exists() else "ftlayer", "--help"])
    assert out.returncode == 0, out.stderr
    for word in ("stats", "demo", "redis"):
        assert word in out.stdout
    sub = _run([*FTLAYER, "stats", "--help"])
    assert "FTLAYER_REDIS_URL" in sub.stdout and "FTLAYER_NAMESPACE" in sub.stdout


def test_readme_example_runs_as_written() -> None:
    readme = (ROOT / "README.md").read_text()
    core = readme[readme.index("## The core API") :]
    code = re.search(r"```python\n(.*?)```", core, re.S).group(1)
    before = _redis_children()
    out = _run([sys.executable, "-c", code], cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "completed=2 failed=1 pending=1"
    assert lines[1].startswith("{'order': 1} hash_code 1 new id ")
    assert _redis_children() <= before, "the embedded redis-server was left running"


def test_readme_pipeline_is_the_tested_one() -> None:
    """The README's pipeline is the one tests/spark runs (from docs/vectorized.md)."""
    block = re.compile(r"```python\n(.*?)```", re.S)
    readme = (ROOT / "README.md").read_text()
    pipeline = readme[readme.index("## A fault-tolerant") :]
    doc = (ROOT / "docs" / "vectorized.md").read_text()
    assert block.search(pipeline).group(1) == block.search(doc).group(1)
    assert len(block.search(pipeline).group(1).strip().splitlines()) < 25


def test_demo_json_loses_nothing() -> None:
    """The main job, small: a real streaming query, a real sidecar process, every kind of
    failure injected; `lost` is counted from the sink's contents."""
    out = _run([*FTLAYER, "--log-level", "WARNING", "demo", "--records", "3000",
                "--batches", "3", "--fail-rate", "0.05", "--drop-rate", "0.03",
                "--crash-rate", "1.0", "--timeout-s", "1.5", "--json"])  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["lost"] == 0 and r["pending"] == 0 and r["misplaced"] == 0
    assert r["failed_explicit"] > 0 and r["timed_out"] > 0, "both failure kinds injected"
    assert r["crashed_tasks"] >= 3, "every source task crashed once and was retried"
    assert r["replayed"] == r["failed_explicit"] + r["timed_out"] - r["dead_lettered"]
    assert r["completed"] + r["dead_lettered"] == r["source_records"] == 3000
    assert r["sink_rows"] - r["duplicates"] + r["dead_lettered"] == 3000


def test_stats_json_on_an_explicit_url(redis_server) -> None:
    from ftlayer import FTConfig, FTLayer

    args = [*FTLAYER, "stats", "--json", "--redis-url", redis_server.url, "--namespace", "cli-e"]
    out = _run(args)  # never opened: said so, not zeros (tests/test_settings.py)
    assert out.returncode == 2 and "does not exist" in out.stderr, out.stderr
    layer = FTLayer(redis_server.client(), FTConfig(namespace="cli-e"))  # opened, empty
    try:
        out = _run(args)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["pending"] == 0
    finally:
        layer.clear()


def test_unreachable_redis_is_a_clear_error() -> None:
    out = _run([*FTLAYER, "stats", "--redis-url", "redis://u:hunter2@127.0.0.1:1/0"])
    assert out.returncode == 2
    assert "cannot reach Redis" in out.stderr and "hunter2" not in out.stderr


def test_stats_and_dlq_need_a_url() -> None:
    for args in (["stats"], ["dlq", "list"]):
        out = _run([*FTLAYER, *args])
        assert out.returncode == 2 and "give --redis-url" in out.stderr, out.stderr
