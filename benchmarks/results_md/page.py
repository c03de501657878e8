"""Formatting helpers and the page model: how a figure, a ratio, quartiles and a table are
printed, goals and whether they are met, and the ``Page`` each results file's renderer
fills (its facts, rows, extra tables, notes and goals)."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from typing import Any

NONE = "–"

Json = dict[str, Any]


# -- formatting -----------------------------------------------------------------------------
def num(x: Any) -> str:
    """A figure as the JSON records it: ints with thousands separators, floats in their
    shortest form (integral ones from 1,000 up as ints), None as a dash."""
    if x is None:
        return NONE
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x.is_integer() and abs(x) >= 1000:
            return f"{int(x):,}"
        return format(x, ",")
    if isinstance(x, list):
        return ", ".join(num(v) for v in x)
    if isinstance(x, dict):
        return ", ".join(f"{k} {num(v)}" for k, v in sorted(x.items()))
    return str(x)


def is_num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def ratio(a: Any, b: Any) -> float | None:
    """a / b rounded to 3 decimals (None unless both are numbers and b is not 0)."""
    return round(a / b, 3) if is_num(a) and is_num(b) and b else None


def quartiles(q: Any) -> str:
    return f"{num(q[0])}–{num(q[1])}" if isinstance(q, list) and len(q) == 2 else ""


def natural(key: str) -> tuple[int, str]:
    """Sort key of a JSON object's keys that are numbers written as text ("1024")."""
    return (int(key), "") if key.isdigit() else (sys.maxsize, key)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) or NONE for c in r) + " |" for r in rows]
    return "\n".join(lines)


# -- goals ----------------------------------------------------------------------------------
SYMBOLS = {">=": "≥", "<=": "≤", "==": "="}


@dataclass(frozen=True)
class Goal:
    op: str  # ">=", "<=" or "=="
    target: float

    def holds(self, value: Any) -> bool | None:
        if not is_num(value):
            return None
        if self.op == ">=":
            return bool(value >= self.target)
        if self.op == "<=":
            return bool(value <= self.target)
        return bool(value == self.target)

    def __str__(self) -> str:
        t = float(self.target)
        return f"{SYMBOLS[self.op]} {num(int(t) if t.is_integer() else t)}"


def parse_goal(text: Any) -> Goal | None:
    """``">= 1e+06"``, ``"<= 64"`` (as the JSON records targets) as a Goal."""
    m = re.fullmatch(r"\s*(>=|<=|==)\s*([-+0-9.eE]+)\s*", str(text))
    return Goal(m.group(1), float(m.group(2))) if m else None


def met_text(met: bool | None) -> str:
    return NONE if met is None else ("met" if met else "**unmet**")


@dataclass
class GoalResult:
    file: str
    name: str
    measured: str
    goal: str
    met: bool | None
    date: str


# -- a section ------------------------------------------------------------------------------
@dataclass
class Row:
    figure: str
    measured: str
    baseline: str = ""
    ratio: str = ""
    quartiles: str = ""
    goal: str = ""
    met: str = ""


HEADER = ["figure", "measured", "baseline (same run)", "ratio", "quartiles", "goal", "met?"]


@dataclass
class Page:
    """One results file's section, built by its renderer."""

    name: str
    data: Json
    results: dict[str, Json]
    facts: list[tuple[str, str]] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    blocks: list[str] = field(default_factory=list)
    goals: list[GoalResult] = field(default_factory=list)
    used_goals: set[str] = field(default_factory=set)
    what: str = ""
    notes: list[str] = field(default_factory=list)
    inferred_date: str = ""

    @property
    def date(self) -> str:
        return str(self.data.get("date") or self.inferred_date or "not recorded")

    def fact(self, label: str, value: Any) -> None:
        if value is not None and value != "":
            self.facts.append((label, num(value)))

    def row(
        self,
        figure: str,
        measured: Any,
        baseline: Any = None,
        baseline_label: str = "",
        ratio_value: Any = None,
        q: Any = None,
        goal: Goal | None = None,
        goal_value: Any = None,
        recorded_met: bool | None = None,
        unit: str = "",
        goal_on: str = "",
        goal_label: str = "",
        summary: bool = True,
    ) -> None:
        """A table row. With a goal, whether it is met is computed on ``goal_value``
        (default: ``measured``; ``goal_on`` names it, e.g. "ratio"), a recorded verdict
        that disagrees flagged; the goal joins the summary (as ``goal_label``) unless
        ``summary`` is False."""
        shown = measured if isinstance(measured, str) else num(measured)
        if unit and shown != NONE:
            shown = f"{shown} {unit}"
        base = ""
        if baseline is not None:
            base = baseline if isinstance(baseline, str) else num(baseline)
            if unit and base != NONE and not isinstance(baseline, str):
                base = f"{base} {unit}"
            if baseline_label:
                base = f"{base} ({baseline_label})"
        met: bool | None = None
        met_cell = ""
        if goal is not None:
            met = goal.holds(measured if goal_value is None else goal_value)
            met_cell = met_text(met)
            if recorded_met is not None and met is not None and recorded_met != met:
                met_cell += f" (recorded: {'met' if recorded_met else 'unmet'}!)"
            if summary:
                value = shown if goal_value is None else num(goal_value)
                self.goals.append(GoalResult(self.name, goal_label or figure, value, str(goal),
                                             met, self.date))  # fmt: skip
        goal_cell = f"{goal_on} {goal}".strip() if goal else ""
        self.rows.append(Row(figure, shown, base, num(ratio_value) if ratio_value is not None
                             else "", quartiles(q), goal_cell, met_cell))

    def goal_of(self, name: str, op: str, goals: Json | None = None) -> Goal | None:
        """The goal recorded under ``name`` in the JSON's ``goals`` (a bare number: ``op``
        says which way it points), marked used."""
        goals = self.data.get("goals") if goals is None else goals
        if not isinstance(goals, dict) or name not in goals:
            return None
        self.used_goals.add(name)
        g = goals[name]
        if isinstance(g, dict):
            return parse_goal(g.get("target"))
        return Goal(op, float(g)) if is_num(g) else parse_goal(g)

    def table(self, title: str, header: list[str], rows: list[list[str]]) -> None:
        if rows:
            self.blocks.append(f"{title}\n\n{md_table(header, rows)}")

    def render_rows(self) -> str:
        cols = [i for i in range(len(HEADER))
                if i < 2 or any(astuple(r)[i] for r in self.rows)]  # fmt: skip
        return md_table([HEADER[i] for i in cols],
                        [[astuple(r)[i] for i in cols] for r in self.rows])  # fmt: skip


def astuple(r: Row) -> list[str]:
    return [r.figure, r.measured, r.baseline, r.ratio, r.quartiles, r.goal, r.met]


FACTS = (
    ("date", "date"), ("machine", "machine"), ("cpus", "CPUs"), ("redis", "Redis"),
    ("redis_version", "Redis"), ("mem_allocator", "allocator"), ("scripts", "scripts as"),
    ("cluster", "Redis Cluster"), ("masters", "masters"), ("shards", "shards"),
    ("records", "records"), ("batch", "records per task"), ("calls", "calls"),
    ("xors", "XORs"), ("limit", "per claim call"), ("payload_bytes", "payload bytes"),
    ("source", "source"), ("source_bytes", "source bytes"), ("repeat", "rounds"),
    ("warmup", "warm-up rounds"),
)  # fmt: skip


def common_facts(page: Page, data: Json | None = None) -> None:
    data = page.data if data is None else data
    for key, label in FACTS:
        if key == "date" and "date" not in data:
            page.fact("date", page.inferred_date or "not recorded")
        elif key in data and not isinstance(data[key], dict | list):
            page.fact(label, data[key])
