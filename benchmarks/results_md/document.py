"""The page assembled: where the results live, the benchmark module behind each results
file (its docstring read with ``ast``), each file's section built and printed, and
``render``, which puts RESULTS.md together."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.results_md.page import (
    NONE,
    Goal,
    Json,
    Page,
    is_num,
    md_table,
    num,
    parse_goal,
)
from benchmarks.results_md.sections import RENDERERS, Renderer, render_generic

HERE = Path(__file__).resolve().parents[1]
"""``benchmarks/``: the benchmark modules, and their ``results/`` directory."""
RESULTS_DIR = HERE / "results"
OUTPUT_NAME = "RESULTS.md"
COMMAND = "python -m benchmarks.results_md"

OLDER_RUNS: dict[str, str] = {
    "pipeline_overhead_2026-11-25_11_rounds.json": (
        "Older run, kept for reference: the 11-round run of 2026-11-25 (`--repeat 11 "
        "--no-row`), superseded by the 25-round run in `pipeline_overhead.json`."
    ),
    "cluster_e2e_run2.json": (
        "Older run, kept for reference: the second of the two rehearsals of 2026-11-25 "
        "(Redis sink, the master killed at a micro-batch; before `--sink`, "
        "`--master-kill-at` and `--sweep` existed), superseded by `cluster_e2e.json` and "
        "`cluster_e2e_runs.json`."
    ),
}
"""Files that hold older or superseded runs, with what they are."""

OLDER_NAME = re.compile(r"_(\d{4}-\d{2}-\d{2})(_|$)|_run\d+$")
"""A results file named with a date or ``_runN`` holds an older run kept for reference."""


# -- the module behind a file ---------------------------------------------------------------
def modules() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))


def module_of(stem: str) -> str | None:
    """The benchmark module that writes ``<stem>.json``: the longest module name that is
    the stem or a prefix of it followed by ``_``."""
    found = [m for m in modules() if stem == m or stem.startswith(m + "_")]
    return max(found, key=len) if found else None


def docstring(module: str) -> str:
    path = HERE / f"{module}.py"
    try:
        return ast.get_docstring(ast.parse(path.read_text())) or ""
    except (OSError, SyntaxError):
        return ""


def summary_of(doc: str) -> str:
    """The docstring's first paragraph, on one line."""
    return " ".join(doc.split("\n\n")[0].split())


def usage_of(doc: str, module: str) -> str:
    """The ``python -m benchmarks.<module> ...`` line of the docstring (with its
    continuation lines), or the bare command."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith(f"python -m benchmarks.{module}"):
            indent = len(line) - len(line.lstrip())
            parts = [line.strip()]
            for nxt in lines[i + 1:]:
                if not nxt.strip() or len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                parts.append(nxt.strip())
            return " ".join(parts)
    return f"python -m benchmarks.{module}"


# -- the page -------------------------------------------------------------------------------
@dataclass
class Section:
    name: str
    current: bool
    label: str
    page: Page


def status_of(name: str) -> tuple[bool, str]:
    """(whether the file holds a standing result, its label)."""
    if name in OLDER_RUNS:
        return False, OLDER_RUNS[name]
    stem = name.removesuffix(".json")
    if OLDER_NAME.search(stem):
        return False, "Older run (by its file name), kept for reference."
    if stem.endswith("_redis7"):
        return True, "Redis 7.0 run: the same benchmark against a Redis 7 server."
    return True, ""


def build(name: str, data: Any, results: dict[str, Json]) -> Section:
    stem = name.removesuffix(".json")
    current, label = status_of(name)
    page = Page(name, data if isinstance(data, dict) else {}, results)
    if not isinstance(data, dict):
        page.notes.append(f"The file holds a JSON {type(data).__name__}, not an object: "
                          "nothing to tabulate.")
    module = module_of(stem)
    doc = docstring(module) if module else ""
    page.what = summary_of(doc) or "No benchmark module found for this file."
    renderer: Renderer = render_generic
    extra = ""
    for pattern, fn, note in RENDERERS:
        if re.fullmatch(pattern, stem):
            renderer, extra = fn, note
            break
    if extra:
        page.what += " " + extra
    try:
        renderer(page)
    except Exception as e:  # a file its renderer cannot read still gets a section
        page = Page(name, page.data, results, what=page.what)
        page.notes.append(f"Its renderer ({renderer.__name__}) could not read this file "
                          f"({type(e).__name__}: {e}): its top-level fields follow.")
        render_generic(page)
    unused_goals(page)
    command = str(page.data.get("command") or "").strip()
    if command:
        page.facts.insert(0, ("command", f"`{command}`"))
    elif module:
        usage = usage_of(doc, module)
        how = "the module's usage: the JSON does not record its command line"
        if stem.endswith("_redis7"):
            how = (f"with `--redis-url` to a Redis 7 server, the `{module}.json` it writes "
                   f"renamed to this file; {how}")
        page.facts.insert(0, ("command", f"`{usage}` ({how})"))
    return Section(name, current, label, page)


def unused_goals(page: Page) -> None:
    """Goals the JSON records that no row showed: a row each, so none is dropped."""
    goals = page.data.get("goals")
    if isinstance(goals, dict):
        for name in sorted(set(goals) - page.used_goals):
            g = goals[name]
            target = parse_goal(g.get("target")) if isinstance(g, dict) else (
                parse_goal(g) if isinstance(g, str) else None)
            measured = g.get("measured") if isinstance(g, dict) else page.data.get(name)
            if target is None and is_num(g):
                key = next((k for k in sorted(page.data)
                            if k.startswith(f"ratio_{name}_vs_")), None)  # fmt: skip
                if key:
                    target, measured = Goal(">=", float(g)), page.data[key]
            if target is not None:
                page.row(f"goal `{name}`", measured, goal=target,
                         recorded_met=g.get("met") if isinstance(g, dict) else None)
            else:
                page.row(f"goal `{name}` (direction not recorded)", measured,
                         goal=None)
                page.rows[-1].goal = num(g)
    unmet = page.data.get("goals_unmet")
    if isinstance(unmet, list) and unmet:
        page.notes.append("Goals not met, as recorded: " + "; ".join(map(str, unmet)) + ".")


def section_md(s: Section) -> str:
    p = s.page
    out = [f"## {s.name}", ""]
    if s.label:
        out += [f"*{s.label}*", ""]
    out += [f"**Measures:** {p.what}", ""]
    if p.facts:
        out += ["**Run:** " + " · ".join(f"{k}: {v}" for k, v in p.facts), ""]
    if p.rows:
        out += [p.render_rows(), ""]
    for note in p.notes:
        out += [note, ""]
    for block in p.blocks:
        out += [block, ""]
    return "\n".join(out)


def load(results_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            out[path.name] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            out[path.name] = {"unreadable": f"{type(e).__name__}: {e}"}
    return out


def render(results_dir: Path = RESULTS_DIR) -> str:
    """RESULTS.md for the JSON files in ``results_dir``."""
    results = load(results_dir)
    dicts = {k: v for k, v in results.items() if isinstance(v, dict)}
    sections = [build(name, data, dicts) for name, data in sorted(results.items())]
    head = [
        "# Benchmark results",
        "",
        f"<!-- Generated by `{COMMAND}` from benchmarks/results/*.json. Do not edit by hand. -->",
        "",
        f"*Generated from the JSON files in this directory by `{COMMAND}`: do not edit by "
        "hand. After a benchmark writes or changes a results file, run it again and commit "
        f"this file with the results; `{COMMAND} --check` (and `tests/test_results_md.py`) "
        "fails while this file is out of date.*",
        "",
        "Columns: *measured* and *baseline* come from the same run; *ratio* is the one the "
        "JSON records (the Spark pipelines': the median of per-round paired ratios, not the "
        "ratio of the medians) or else measured ÷ baseline; *quartiles* are those of the "
        "paired ratios.",
        "",
        "## Standing goals",
        "",
        "Every goal of the current results files (older runs kept for reference are left out; "
        "their sections show theirs).",
        "",
    ]
    goal_rows = [[f"[{g.file}](#{anchor(g.file)})", g.name, g.measured, g.goal,
                  "yes" if g.met else NONE if g.met is None else "**no**", g.date]
                 for s in sections if s.current for g in s.page.goals]  # fmt: skip
    head += [md_table(["file", "goal", "measured", "goal", "met?", "date"], goal_rows), ""]
    met = sum(1 for s in sections if s.current for g in s.page.goals if g.met)
    head += [f"{met} of {len(goal_rows)} standing goals met.", "", "## Files", ""]
    head += [md_table(["file", "date", "what it holds"],
                      [[f"[{s.name}](#{anchor(s.name)})", s.page.date,
                        s.label or "current run"] for s in sections]), ""]  # fmt: skip
    return "\n".join(head + [section_md(s) for s in sections]).rstrip() + "\n"


def anchor(heading: str) -> str:
    """GitHub's anchor of a ``## heading``."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
