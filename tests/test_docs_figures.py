"""Figures have one source: benchmarks/results/RESULTS.md, generated from the benchmarks'
JSON results. The prose documents (README.md and docs/*.md, except the generated
docs/configuration.md) keep no measurement history of their own:

* no ISO date (a dated figure is a copy that drifts; history belongs in git and
  CHANGELOG.md);
* no "before: …" annotation (``before: 1.75``, ``before the buckets: 1.75``), no "before"
  column, no commit id quoted as the origin of a change;
* every ``benchmarks/results/<file>.json`` they name, with its directory or bare
  (``cluster_e2e.json``), exists.

Each check is a function of a text, so the ``*_can_fail`` tests feed it a bad one.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GENERATED = {"docs/configuration.md"}  # ftlayer/reference.py writes it

_DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
_BEFORE = (
    # "before: 1.75", "before the buckets: 1.75", "before `fail_many`: 170,823"
    re.compile(r"\bbefore\b(?:[^.;:()|]{0,40}:\s*[~≈]?\d|:)", re.I),
    re.compile(r"^\|(?:[^|\n]*\|)*\s*before\s*\|", re.I | re.M),  # a table column "before"
)
_COMMIT = re.compile(r"\bcommit\s+`?[0-9a-f]{7,40}\b", re.I)
# a results file named with its directory, or bare: a benchmark's name and an optional suffix
_RESULTS_PATH = re.compile(r"benchmarks/results/([A-Za-z0-9_.-]+\.json)\b")
_BARE_JSON = re.compile(r"(?<![\w<>*…/.-])([a-z][a-z0-9_]*\.json)\b")


def prose_docs(root: Path = ROOT) -> list[Path]:
    """README.md and every docs/*.md but the generated ones."""
    docs = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    return [p for p in docs if p.relative_to(root).as_posix() not in GENERATED]


def benchmark_names(root: Path = ROOT) -> set[str]:
    """The benchmarks (``python -m benchmarks.<name>``): the prefixes of results files."""
    return {p.stem for p in (root / "benchmarks").glob("*.py") if not p.stem.startswith("_")}


def history(text: str) -> list[str]:
    """The dates, "before" annotations and commit ids of ``text``, each with its line (an
    annotation may wrap onto the next line)."""
    found = []
    for rx in (_DATE, _COMMIT, *_BEFORE):
        for m in rx.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append((line, " ".join(m.group(0).split())))
    return [f"line {n}: {h!r}" for n, h in sorted(dict.fromkeys(found))]


def named_results(text: str, benchmarks: set[str]) -> set[str]:
    """The results files ``text`` names: ``benchmarks/results/x.json``, or a bare
    ``x.json`` whose name starts with a benchmark's (``pending_memory_redis7.json``)."""
    names = set(_RESULTS_PATH.findall(text))
    for name in _BARE_JSON.findall(text):
        stem = name[: -len(".json")]
        if any(stem == b or stem.startswith(b + "_") for b in benchmarks):
            names.add(name)
    return names


def test_the_prose_docs_are_found() -> None:
    docs = {p.relative_to(ROOT).as_posix() for p in prose_docs()}
    assert {"README.md", "docs/deployment.md", "docs/storage-layout.md",
            "docs/architecture.md"} <= docs  # fmt: skip
    assert not docs & GENERATED
    assert {"cluster_e2e", "pending_memory", "pipeline_overhead"} <= benchmark_names()


def test_no_prose_doc_keeps_dates_before_columns_or_commit_ids() -> None:
    found = {
        p.relative_to(ROOT).as_posix(): hits
        for p in prose_docs()
        if (hits := history(p.read_text()))
    }
    assert not found, (
        "figures with dates or a measurement history in the prose docs: keep an undated figure "
        f"naming its results file, or link benchmarks/results/RESULTS.md instead: {found}"
    )


def test_every_results_file_the_docs_name_exists() -> None:
    benchmarks = benchmark_names()
    named = {
        (p.relative_to(ROOT).as_posix(), name)
        for p in prose_docs()
        for name in named_results(p.read_text(), benchmarks)
    }
    assert len(named) > 5  # the scan finds the docs' references
    missing = sorted(f"{doc}: {name}" for doc, name in named if not (RESULTS / name).is_file())
    assert not missing, f"the docs name results files that do not exist: {missing}"


def test_the_history_check_can_fail() -> None:
    assert history("memory use, 2026-11-24: 77.1 B") == ["line 1: '2026-11-24'"]
    assert history("a\nwith strings 1.23 (before the\n  buckets: 1.75)") == [
        "line 2: 'before the buckets: 1'"
    ]
    assert history("170,823 (before: 263,769)") == ["line 1: 'before: 2'"]
    assert history("x\n\n| layout | now | before |\n|---|---|---|") == [
        "line 3: '| layout | now | before |'"
    ]
    assert history("the even spread arrived with commit b7b03d7 (issue 7)") == [
        "line 1: 'commit b7b03d7'"
    ]
    clean = (
        "Rows failing before the first shuffle replay at once. Before it settles, a\n"
        "batch holds its segments; `--since 2h|ISO`; 57 B (`pending_memory.json`)."
    )
    assert history(clean) == []


def test_the_results_file_check_can_fail() -> None:
    benchmarks = {"cluster_e2e", "pending_memory", "rotation"}
    text = ("`cluster_e2e.json`, `benchmarks/results/rotation_redis7.json`, "
            "`benchmarks/results/<name>.json`, `…_redis7.json`, `pending_memory*.json`, "
            "`inbox/1.json`, `deploy/grafana/ftlayer-dashboard.json`, `rotation_gone.json`, "
            "`claim.jsonl`")  # fmt: skip
    assert named_results(text, benchmarks) == {
        "cluster_e2e.json", "rotation_redis7.json", "rotation_gone.json"
    }  # fmt: skip
    missing = [n for n in named_results(text, benchmarks) if not (RESULTS / n).is_file()]
    assert missing == ["rotation_gone.json"]
