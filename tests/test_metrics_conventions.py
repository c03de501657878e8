"""The sidecar's metrics follow Prometheus's conventions, checked on a real scrape of a
real ``ftlayer serve`` with records flowing: the rules of ``promtool check metrics``
(client_golang's promlint), restated here so the check runs everywhere, plus promtool
itself where the machine has it (Debian's ``prometheus`` package). And the Grafana
dashboard shipped in ``deploy/`` queries only metrics ftlayer exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ftlayer import FTConfig, FTLayer
from ftlayer.service.metrics import METRIC_NAMES
from tests.promql import metric_names
from tests.serving import Serve, T

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "ftlayer-dashboard.json"
_SNAKE = re.compile(r"^[a-z_][a-z0-9_]*$")
_NON_BASE_UNITS = ("milliseconds", "microseconds", "nanoseconds", "minutes", "hours",
                   "days", "kilobytes", "megabytes", "gigabytes", "percent")  # fmt: skip
_ABBREVIATIONS = ("_ms", "_sec", "_secs", "_us", "_ns", "_kb", "_mb", "_pct")


def lint(text: str) -> list[str]:
    """promlint's problems with an exposition (empty: clean)."""
    problems = []
    helped = {m.group(1) for m in re.finditer(r"^# HELP (\S+) \S", text, re.M)}
    for fam in text_string_to_metric_families(text):
        name, kind = fam.name, fam.type
        exposed = name + "_total" if kind == "counter" else name
        if name not in helped and exposed not in helped:
            problems.append(f"{name}: no help text")
        if not _SNAKE.match(name):
            problems.append(f"{name}: not snake_case")
        if kind != "counter" and name.endswith("_total"):
            problems.append(f"{name}: non-counter metrics should not have a _total suffix")
        if kind != "histogram" and name.endswith("_bucket"):
            problems.append(f"{name}: _bucket is reserved for histograms")
        if kind not in ("histogram", "summary") and name.endswith(("_count", "_sum")):
            problems.append(f"{name}: _count/_sum are reserved for histograms and summaries")
        if any(u in name for u in _NON_BASE_UNITS) or name.endswith(_ABBREVIATIONS):
            problems.append(f"{name}: use base units (seconds, bytes, ratios)")
        if any(t in name.split("_") for t in ("counter", "gauge", "histogram", "summary")):
            problems.append(f"{name}: metric type in the name")
        for sample in fam.samples:
            if sample.name.endswith("_created"):
                problems.append(f"{sample.name}: _created series exported")
            for label in sample.labels:
                if not _SNAKE.match(label):
                    problems.append(f"{name}: label {label} not snake_case")
                if label == "le" and kind != "histogram" or label == "quantile":
                    problems.append(f"{name}: reserved label {label}")
    return problems


def test_lint_catches_what_promtool_would() -> None:
    """The lint itself can fail: each rule on an exposition that breaks it."""
    bad = (
        "# HELP pending_total x\n# TYPE pending_total gauge\npending_total 1\n"
        "# TYPE no_help gauge\nno_help 1\n"
        "# HELP lat_ms x\n# TYPE lat_ms gauge\nlat_ms 1\n"
        "# HELP hits x\n# TYPE hits counter\nhits_total 1\nhits_created 1.7e9\n"
        '# HELP g x\n# TYPE g gauge\ng{Namespace="a"} 1\n'
    )
    found = "\n".join(lint(bad))
    for expected in ("_total suffix", "no help text", "base units", "_created", "snake_case"):
        assert expected in found, expected


def test_the_sidecars_metrics_pass_the_conventions(redis_server, tmp_path) -> None:
    ns = f"lint{uuid.uuid4().hex[:8]}"
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, timeout_s=T, max_replays=0))
    h = layer.handler()
    rids = [h.persist_record(i, source=i % 2) for i in range(4)]
    h.flush()
    layer.fail(rids[:1], error="bad row")
    sink = layer.handler()
    sink.ack(rids[1])
    sink.flush()
    sidecar = Serve(redis_server.url, ns, tmp_path / "serve.log")
    try:
        time.sleep(T * 1.5 + 0.3)  # the rest time out: every family has samples
        code, text = sidecar.get("/metrics")
    finally:
        sidecar.stop()
    assert code == 200
    assert lint(text) == []
    promtool = shutil.which("promtool")
    if promtool:  # also the real thing where the machine has it
        out = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                             capture_output=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
    layer.clear()


def _queries(node: object) -> list[str]:
    """Every PromQL expression in a Grafana dashboard (panel targets, variable queries)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                found.append(value)
            elif key == "query" and isinstance(value, str) and "(" in value:
                found.append(value)
            else:
                found.extend(_queries(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_queries(value))
    return found



@pytest.mark.parametrize("path", [DASHBOARD], ids=["ftlayer-dashboard"])
def test_the_grafana_dashboard_queries_only_exported_metrics(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    queries = _queries(dashboard)
    assert len(queries) >= 10
    used: set[str] = set()
    for expr in queries:
        names = metric_names(expr)
        assert names, f"a query naming no ftlayer metric: {expr}"
        unknown = names - METRIC_NAMES
        assert not unknown, f"{sorted(unknown)} are not exported (query: {expr})"
        used |= names
    for must in ("ftlayer_pending", "ftlayer_completed_total", "ftlayer_failed_total",
                 "ftlayer_dead_letters", "ftlayer_completion_latency_seconds",
                 "ftlayer_lease_held", "ftlayer_redis_up"):  # fmt: skip
        assert must in used, f"the dashboard shows no {must}"


def test_the_kubernetes_probes_use_liveness_and_readiness_apart() -> None:
    """Liveness on /healthz (never depends on Redis), readiness on /readyz: see
    test_sidecar.py::test_a_redis_outage_makes_the_sidecar_unready_never_dead for what
    each answers."""
    text = (ROOT / "deploy" / "kubernetes" / "ftlayer-sidecar.yaml").read_text()
    probes = dict(re.findall(r"^\s+(livenessProbe|readinessProbe):\s*\n\s+httpGet: \{path: (\S+),",
                             text, re.M))  # fmt: skip
    assert probes == {"livenessProbe": "/healthz", "readinessProbe": "/readyz"}
