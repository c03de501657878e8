"""Figures have one source: benchmarks/results/RESULTS.md, generated from the benchmarks'
JSON results. The prose documents (README.md and docs/*.md, except the generated
docs/configuration.md) keep no measurement history of their own:

* no ISO date (a dated figure is a copy that drifts; history belongs in git and
  CHANGELOG.md);
* no "before: …" annotation (``before: 1.75``, ``before the buckets: 1.75``), no "before"
  column, no commit id quoted as the origin of a change;
* every ``benchmarks/results/<file>.json`` they name, with its directory or bare
  (``cluster_e2e.json``), exists;
* every figure they quote from a results file is marked as such, a link to the file's
  section of RESULTS.md titled with the figure's key (``[0.93×](…/RESULTS.md#pipeline_overheadjson
  "ratio_arrow_idcol_vs_arrow")``), and is that key's value as the file holds it, to the
  figure's last digit; in a paragraph, list item or table row that names a results file,
  a number that reads as a measurement (a ratio, a rate, a time, bytes, a count in K or
  M) is marked. Figures that are not measurements, configuration defaults and sizes
  (``timeout_s``, a 28-byte header, 1 KB events), and arithmetic on figures (``200,000 × 6``)
  are neither marked nor checked.

Each check is a function of a text, so the ``*_can_fail`` tests feed it a bad one.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

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


# -- figures quoted from results files --------------------------------------------------------
# A figure a prose doc quotes from a results file is a link to that file's section of
# RESULTS.md (or to the file) whose title names the figure's key in the JSON, keys joined
# by "/" (a list's items by their index):
#
#     [0.93×](../benchmarks/results/RESULTS.md#pipeline_overheadjson "ratio_arrow_idcol_vs_arrow")
#
# The link's text is the figure as the doc rounds it: a number (thousands with commas), an
# optional K or M (thousand, million) and a unit, after an optional "≈" or "~". It must be
# the key's value to the figure's last written digit. A time the file holds in another unit
# says which after the key ("capacity/redis_usec_per_s_idle in µs" for a figure in ms).
_FIGURE = re.compile(
    r"\[(?P<text>[^\]\n]*\d[^\]\n]*)\]"
    r"\((?P<target>[^)\s]*benchmarks/results/(?:RESULTS\.md#[\w-]+|[\w.-]+\.json))"
    r"\s+\"(?P<key>[^\"\n]+)\"\)"
)
_NUMBER = re.compile(
    r"^\**(?:[≈~]\s*)?(?P<num>\d{1,3}(?:,\d{3})+|\d+(?:\.(?P<dec>\d+))?(?:e(?P<exp>-?\d+))?)"
    r"(?:\s*(?P<mult>[KM])(?![A-Za-z]))?(?P<unit>[^\d]*?)\**$"
)
_MULT = {None: 1.0, "K": 1e3, "M": 1e6}
_TIME = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
# An unmarked number that reads as a measurement: a ratio (0.93×, 0.81 × the ...; not a
# product, "200,000 × 6"), a rate, a time per event, bytes per record, a count in K/M.
_MEASURED = re.compile(
    r"(?<![\w.,/#-])(?P<fig>\d[\d,]*(?:\.\d+)?(?:e-?\d+)?)"
    r"(?:\s?×(?!\s*\d)|\s?(?:µs|ms)\b|\s(?:M|K)\b(?!\s*×)|\s?(?:B|MB|GB)\b(?! \w+ \d)"
    r"|\s(?:records|events)/s\b|\s(?:records|events) a second\b)"
)


def results_anchors(results: Path = RESULTS) -> dict[str, str]:
    """The anchor of each results file's section of RESULTS.md (``## <file>.json``, as
    GitHub spells a heading's anchor) -> the file's name."""
    headings = re.findall(r"^## (\S+\.json)$", (results / "RESULTS.md").read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-"): h for h in headings}


def lookup(data: Any, key: str) -> Any:
    for part in key.split("/"):
        if isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            raise KeyError(part)
    return data


def figure_errors(text: str, results: Path = RESULTS) -> list[str]:
    """What is wrong with each marked figure of ``text``: a file or key not found, a text
    that is no figure, a value other than its key's (beyond the figure's rounding)."""
    anchors, errors = results_anchors(results), []
    for m in _FIGURE.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        target, key, shown = m["target"], m["key"], m["text"]
        key, _, held_in = key.partition(" in ")
        name = anchors.get(target.split("#", 1)[1]) if "#" in target else Path(target).name
        where = f"line {line}: [{shown}] ({name or target} {key!r})"
        if name is None or not (results / name).is_file():
            errors.append(f"{where}: no such results file")
            continue
        try:
            value = lookup(json.loads((results / name).read_text()), key)
        except KeyError:
            errors.append(f"{where}: no such key")
            continue
        fig = _NUMBER.match(shown.strip())
        if not fig or isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(f"{where}: not a figure, or not a number in the file: {value!r}")
            continue
        if held_in:  # the file's time unit -> the figure's
            shown_in = fig["unit"].split()[0] if fig["unit"].split() else ""
            if held_in not in _TIME or shown_in not in _TIME:
                errors.append(f"{where}: not a time in s, ms, µs or ns")
                continue
            value = value * _TIME[held_in] / _TIME[shown_in]
        scale = _MULT[fig["mult"]] * 10.0 ** int(fig["exp"] or 0)
        mantissa = float(fig["num"].replace(",", "").split("e")[0])
        half = 0.5 * 10.0 ** -len(fig["dec"] or "") * scale
        if abs(mantissa * scale - value) > half * (1 + 1e-9):
            errors.append(f"{where}: the file holds {value}")
    return errors


def citing_units(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each table row, list item and paragraph of ``text`` (fenced
    code left out) that names a results file."""
    units: list[tuple[int, str]] = []
    cur: list[str] = []
    start, fenced = 0, False
    benchmarks = benchmark_names()

    def close() -> None:
        if cur:
            units.append((start, "\n".join(cur)))
            cur.clear()

    for n, raw in enumerate(text.split("\n"), 1):
        head = raw.lstrip()
        if head.startswith("```"):
            fenced = not fenced
            close()
        elif fenced or not head:
            close()
        else:
            if head.startswith(("|", "- ", "* ")) or not cur:
                close()
                start = n
            cur.append(raw)
            if head.startswith("|"):
                close()
    close()
    return [(n, u) for n, u in units if "benchmarks/results/" in u or named_results(u, benchmarks)]


def unmarked_figures(text: str) -> list[str]:
    """Measurement-like numbers (ratios, rates, times, bytes, K/M counts) written without
    the figure link in a paragraph or table row that names a results file."""
    found = []
    for line, unit in citing_units(text):
        bare = _FIGURE.sub(" ", unit)
        bare = re.sub(r"`[^`\n]*`", " ", bare)  # code spans: names, not figures
        for m in _MEASURED.finditer(bare):
            found.append(f"line {line}: {' '.join(m[0].split())!r}")
    return found


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


def test_every_figure_quoted_from_a_results_file_is_the_files_value() -> None:
    """Each figure a prose doc marks (a RESULTS.md link titled with its key) is its file's
    value at the doc's rounding, and no measurement-like number beside a results file is
    left unmarked. Catches: a figure edited by hand, a results file re-recorded without
    its quoted figures, a key renamed or gone, a figure quoted without naming its key."""
    errors = {}
    marked = 0
    for p in prose_docs():
        text = p.read_text()
        marked += len(_FIGURE.findall(text))
        if found := figure_errors(text) + unmarked_figures(text):
            errors[p.relative_to(ROOT).as_posix()] = found
    assert marked > 20  # the scan finds the docs' figures
    assert not errors, (
        "figures in the prose docs that are not their results file's value, or quoted "
        'without naming it (write [figure](…/RESULTS.md#<file>json "<key>"), or link the '
        f"file and quote nothing): {errors}"
    )


def test_the_figure_checks_can_fail() -> None:
    """The checks above on bad texts: a figure off by more than its rounding, a missing
    key or file, and unmarked ratios, rates, times and bytes next to a results file (but
    not products, sizes or settings, nor a figure in a paragraph naming no results file)."""
    link = "../benchmarks/results/RESULTS.md#pipeline_overheadjson"
    held = json.loads((RESULTS / "pipeline_overhead.json").read_text())  # (re-recorded)
    idcol, rate = held["ratio_arrow_idcol_vs_arrow"], held["records_per_s"]["ft_on"]
    expiry = json.loads((RESULTS / "rotation.json").read_text())["expiry_records_per_s"]
    ok = (f'runs at [{idcol:.2f}×]({link} "ratio_arrow_idcol_vs_arrow"), '
          f'[{rate / 1e6:.2f} M records/s]({link} "records_per_s/ft_on"), '
          f'[{rate:,}]({link} "records_per_s/ft_on"), [1.4e-5]({link} "redis_calls_per_record"), '
          f'[≈ 0.3](../benchmarks/results/rotation.json "expiry_records_per_s") no: ')  # fmt: skip
    assert figure_errors(ok)[:-1] == []
    assert figure_errors(ok)[-1].endswith(f"the file holds {expiry}")
    off = round(idcol + 0.05, 2)
    assert figure_errors(f'[{off}×]({link} "ratio_arrow_idcol_vs_arrow")') == [
        f"line 1: [{off}×] (pipeline_overhead.json 'ratio_arrow_idcol_vs_arrow'): "
        f"the file holds {idcol}"
    ]
    assert "no such key" in figure_errors(f'[0.93×]({link} "ratio_gone")')[0]
    assert "no such results file" in figure_errors(
        '[0.93×](../benchmarks/results/RESULTS.md#gonejson "x")')[0]  # fmt: skip
    text = ("FT on runs at 0.91× the plain pipeline (`pipeline_overhead.json`), 1.2 M / 6.4 M\n"
            "events, 135 µs, 57 B a record, 65,000 records/s; 200,000 × 6 / 4 = 300,000 on a\n"
            "28-byte header, 1 KB events, `timeout_s` 30 s, 8 shards, 5 % failing.\n\n"
            "Not cited: 0.5×.\n\n| a | 0.81 × the prediction | `cluster_e2e.json` |")  # fmt: skip
    assert unmarked_figures(text) == [
        "line 1: '0.91×'", "line 1: '1.2 M'", "line 1: '6.4 M'", "line 1: '135 µs'",
        "line 1: '57 B'", "line 1: '65,000 records/s'", "line 7: '0.81 ×'",
    ]  # fmt: skip
