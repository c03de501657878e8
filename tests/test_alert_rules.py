"""The Prometheus alert rules shipped in ``deploy/prometheus/`` load in Prometheus (``promtool
check rules``), pass their unit tests (``promtool test rules``), query only metrics the sidecar
exports, and each one is tested both firing and quiet. promtool comes from Debian's
``prometheus`` package (``.ci/run`` installs it); without it these tests fail, never skip."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ftlayer.service.metrics import METRIC_NAMES
from tests.promql import metric_names

ROOT = Path(__file__).resolve().parents[1]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "ftlayer-alerts.yml"
RULE_TESTS = RULES_DIR / "ftlayer-alerts.test.yml"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: install Debian's `prometheus` package "
                    "(apt-get install prometheus; .ci/run does it)")  # fmt: skip
    return path


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_promtool(), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def _alerts(text: str) -> dict[str, str]:
    """Each alert rule of a rule file, by name: its YAML block (this file's layout: one
    ``- alert:`` item per rule, comments between them)."""
    blocks = re.split(r"^\s*- alert: ", text, flags=re.M)[1:]
    return {b.split("\n", 1)[0].strip(): b for b in blocks}


def _expr(block: str) -> str:
    """An alert's ``expr``: on its line, or a folded block (``>-``) indented below it."""
    m = re.search(r"^(\s*)expr: (.*)$", block, re.M)
    assert m, f"no expr in {block!r}"
    indent, value = m.group(1), m.group(2).strip()
    if value not in (">-", ">", "|", "|-"):
        return value
    lines = []
    for line in block[m.end() :].split("\n")[1:]:
        if line.strip() and len(line) - len(line.lstrip()) <= len(indent):
            break
        lines.append(line.strip())
    return " ".join(x for x in lines if x)



def test_promtool_checks_the_rules() -> None:
    out = _run("check", "rules", RULES)
    assert out.returncode == 0, f"promtool check rules failed:\n{out.stdout}{out.stderr}"
    assert "SUCCESS" in out.stdout, out.stdout + out.stderr


def test_the_rules_pass_their_unit_tests() -> None:
    out = _run("test", "rules", RULE_TESTS)
    assert out.returncode == 0, f"promtool test rules failed:\n{out.stdout}{out.stderr}"


def test_a_broken_rule_fails_its_unit_tests(tmp_path: Path) -> None:
    """The unit tests can fail: the same tests on a copy with a threshold raised tenfold."""
    rules = RULES.read_text()
    broken = rules.replace("(ftlayer_oldest_pending_age_seconds) > 90",
                           "(ftlayer_oldest_pending_age_seconds) > 900")  # fmt: skip
    assert broken != rules, "the threshold this test breaks is not in the rules any more"
    (tmp_path / RULES.name).write_text(broken)
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    out = _run("test", "rules", tmp_path / RULE_TESTS.name)
    assert out.returncode != 0, out.stdout + out.stderr
    assert "FtlayerOldestPendingTooOld" in out.stdout + out.stderr


def test_the_rules_query_only_exported_metrics() -> None:
    alerts = _alerts(RULES.read_text())
    assert len(alerts) >= 7, sorted(alerts)
    used: set[str] = set()
    for name, block in alerts.items():
        expr = _expr(block)
        names = metric_names(expr)
        assert names, f"{name}: its expr names no ftlayer metric: {expr}"
        unknown = names - METRIC_NAMES
        assert not unknown, f"{name}: {sorted(unknown)} are not exported (expr: {expr})"
        used |= names
    assert metric_names("rate(ftlayer_bogus_total[5m])") - METRIC_NAMES == {"ftlayer_bogus_total"}
    for must in ("ftlayer_dead_lettered_total", "ftlayer_replays_vanished_total",
                 "ftlayer_oldest_pending_age_seconds", "ftlayer_lease_held",
                 "ftlayer_redis_up", "ftlayer_redis_noeviction"):  # fmt: skip
        assert must in used, f"no alert on {must}"


def test_every_alert_is_actionable_and_tested_firing_and_quiet() -> None:
    alerts = _alerts(RULES.read_text())
    tests = RULE_TESTS.read_text()
    fires = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts:\s*\n\s+- exp_labels:", tests))
    quiet = set(re.findall(r"alertname: (\w+)\n\s+exp_alerts: \[\]", tests))
    for name, block in alerts.items():
        assert re.search(r"^\s+for: \d+[smh]$", block, re.M), f"{name}: no for:"
        assert re.search(r"^\s+severity: (warning|critical)$", block, re.M), f"{name}: severity"
        for key in ("summary", "description"):
            m = re.search(rf"^(\s+){key}: (.*(?:\n\1  .*)*)", block, re.M)
            assert m, f"{name}: no {key}"
            assert "{{ $labels.namespace }}" in m.group(2), f"{name}: {key} names no namespace"
        assert name in fires, f"{name}: no unit test where it fires"
        assert name in quiet, f"{name}: no unit test where it stays quiet"
