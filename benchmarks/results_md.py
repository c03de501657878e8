"""``benchmarks/results/RESULTS.md``: every benchmark figure in one page, generated from the
JSON results files, never edited by hand.

    python -m benchmarks.results_md            # (re)write benchmarks/results/RESULTS.md
    python -m benchmarks.results_md --check    # exit 1, with a diff, if it is out of date

What it guarantees:

* every ``*.json`` in ``benchmarks/results/`` gets a section (``## <file name>``): what the
  benchmark measures (the first paragraph of its module's docstring), the command that
  reproduces it (the JSON's ``command`` where recorded, else the module's usage), the
  machine / Redis facts the JSON records, and a table of its headline figures: the
  measured value beside its baseline measured in the same run, the ratio (as recorded;
  computed as measured / baseline only where the JSON records none), quartiles where
  present, the goal and whether it is met;
* files holding older runs kept for reference (``pipeline_overhead_2026-11-25_11_rounds.json``,
  ``cluster_e2e_run2.json``, or any name ending in a date or ``_runN``) get a section
  labelled as such, and their goals stay out of the summary of standing goals at the top;
* a file with no renderer of its own (a new benchmark), or one its renderer cannot read,
  still gets a section: its top-level scalar fields and any goals it records. Generation
  never fails on a results file;
* the output depends on nothing but the JSON files and the benchmark modules' docstrings
  (read with ``ast``, nothing imported): files in sorted order, figures printed as the
  JSON records them (computed ratios rounded to 3 decimals), so ``--check`` is stable.

After a benchmark writes or changes a results file, run ``python -m benchmarks.results_md``
and commit RESULTS.md with it: ``tests/test_results_md.py`` fails while RESULTS.md differs
from what these files generate.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS_DIR = HERE / "results"
OUTPUT_NAME = "RESULTS.md"
COMMAND = "python -m benchmarks.results_md"
NONE = "–"

Json = dict[str, Any]

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


# -- renderers ------------------------------------------------------------------------------
ACK_ROWS = (
    # (field, figure, baseline field, baseline label, recorded ratio field)
    ("xor_events_per_s", "XOR events/s, per-record calls (client wall)",
     "naive_lua_events_per_s", "one EVALSHA per XOR", "ratio_vs_naive"),
    ("xor_events_per_s", "XOR events/s ÷ pipelined SET through redis-py",
     "raw_set_ops_per_s", "SETs/s", "ratio_vs_raw_set"),
    ("xor_events_per_s", "XOR events/s ÷ the server's own ceiling",
     "redis_benchmark_set_ops_per_s", "redis-benchmark SETs/s", "ratio_vs_redis_benchmark_set"),
    ("xor_events_per_s_numpy", "XOR events/s, numpy calls (`*_many`)",
     "xor_events_per_s", "per-record calls", ""),
    ("client_events_per_cpu_s", "client events per CPU-second, per-record calls",
     "naive_client_events_per_cpu_s", "one EVALSHA per XOR", ""),
    ("client_events_per_cpu_s_numpy", "client events per CPU-second, numpy calls",
     "client_events_per_cpu_s", "per-record calls", ""),
    ("redis_usec_per_event", "Redis µs per event (server, scripts)",
     "naive_redis_usec_per_event", "one EVALSHA per XOR", ""),
    ("redis_usec_per_event_numpy", "Redis µs per event, numpy calls",
     "redis_usec_per_event", "per-record calls", ""),
    ("redis_cpu_usec_per_event", "Redis CPU µs per event",
     "naive_redis_cpu_usec_per_event", "one EVALSHA per XOR", ""),
)  # fmt: skip


def ack_rows(page: Page, data: Json) -> None:
    """The ack path's headline rows; each goal in ``data["goals"]`` beside its figure."""
    goals = data.get("goals") or {}
    for key, figure, base, base_label, ratio_key in ACK_ROWS:
        if key not in data:
            continue
        goal_key = ratio_key if ratio_key in goals else key if key in goals else None
        if goal_key and goal_key in page.used_goals:
            goal_key = None  # one row per goal
        goal = page.goal_of(goal_key, ">=", goals) if goal_key else None
        recorded = goals[goal_key].get("met") if goal_key else None
        r = data.get(ratio_key) if ratio_key else ratio(data.get(key), data.get(base))
        on_ratio = goal_key is not None and goal_key == ratio_key
        page.row(figure, data[key], data.get(base), base_label, r, goal=goal,
                 goal_value=data.get(goal_key) if goal_key else None,
                 recorded_met=recorded if isinstance(recorded, bool) else None,
                 goal_on="ratio" if on_ratio else "",
                 goal_label=f"ack path: ratio to {base_label} (`{goal_key}`)" if on_ratio
                 else f"ack path: {figure}")  # fmt: skip


def sweep_table(page: Page, data: Json, title: str) -> None:
    sweep = data.get("sweep") or []
    if len(sweep) < 2:
        return
    keys = ["batch"] + sorted({k for p in sweep for k in p} - {"batch"})
    page.table(title, keys, [[num(p.get(k)) for k in keys]
                             for p in sorted(sweep, key=lambda p: p.get("batch", 0))])


def per_node_table(page: Page, data: Json, title: str) -> None:
    nodes = data.get("per_node") or []
    if len(nodes) < 2:
        return
    keys = ["node", "shards", "records", "events", "evalsha_calls", "evalsha_usec",
            "usec_per_event", "share_of_usec", "server_cpu_s"]  # fmt: skip
    page.table(title, keys, [[num(n.get(k)) for k in keys] for n in nodes])


def render_ack(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("ceiling", d.get("redis_benchmark_set_note"))
    if d.get("cluster_ceilings"):
        page.notes.append(f"Cluster ceilings: {d['cluster_ceilings']}.")
    ack_rows(page, d)
    sweep_table(page, d, "By batch size (records per task):")
    per_node_table(page, d, "Per master:")
    wall = d.get("client_wall_ns_per_record")
    if isinstance(wall, dict):
        page.table("Client wall time per record, by stage (ns):", ["stage", "ns per record"],
                   [[k, num(v)] for k, v in sorted(wall.items())])


def render_call_overhead(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.row("EVALSHA of the prelude + `return 0`", d.get("redis_usec_per_call_prelude"),
             d.get("redis_usec_per_call_bare"), "bare EVALSHA `return 0`",
             ratio(d.get("redis_usec_per_call_prelude"), d.get("redis_usec_per_call_bare")),
             unit="µs")  # fmt: skip
    page.row("the prelude, per script call (the difference)", d.get("prelude_usec_per_call"),
             unit="µs")
    if "redis_usec_per_fcall_begin" in d:
        page.row("FCALL of `begin` + `return 0` (Redis 7 function)",
                 d["redis_usec_per_fcall_begin"], d.get("redis_usec_per_fcall_bare"),
                 "bare FCALL `return 0`",
                 ratio(d["redis_usec_per_fcall_begin"], d.get("redis_usec_per_fcall_bare")),
                 unit="µs")  # fmt: skip
        page.row("`begin`, per function call (the difference)", d.get("begin_usec_per_fcall"),
                 unit="µs")
    page.row("pipelined SET (ceiling)", d.get("redis_usec_per_set"), unit="µs")


def render_claim(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("claim calls", d.get("claim_calls"))
    goal = None
    if is_num(d.get("goal_claim_records_per_s")):
        goal = Goal(">=", float(d["goal_claim_records_per_s"]))
    page.row("replays claimed per second", d.get("claim_records_per_s"),
             d.get("ceiling_lpop_records_per_s"), "LPOP of the same queue entries alone",
             d.get("ratio_to_ceiling"), goal=goal,
             goal_label="replays claimed per second")  # fmt: skip
    page.row("Redis µs per claimed record", d.get("claim_redis_usec_per_record"))
    page.row("expiry that queued them: records/s", d.get("expiry_records_per_s"))
    page.row("expiry: Redis µs per record", d.get("expiry_redis_usec_per_record"))


def render_cluster_compare(page: Page) -> None:
    d = page.data
    common_facts(page)
    if d.get("note"):
        page.notes.append(f"Note recorded with the run: {d['note']}.")
    single, clustered = d.get("single") or {}, d.get("cluster") or {}
    ratios = d.get("ratio_cluster_vs_single") or {}
    goals = clustered.get("goals") or {}
    single_goals = single.get("goals") or {}
    masters = d.get("masters", "?")
    for key in sorted(ratios):
        goal = None
        if key in goals:
            goal = parse_goal(goals[key].get("target"))
        page.row(f"`{key}`, {masters}-master cluster", clustered.get(key), single.get(key),
                 "one server", ratios[key], goal=goal,
                 goal_label=f"ack path on a {masters}-master cluster: `{key}`")  # fmt: skip
        if key in single_goals and page.rows[-1].met:
            one = parse_goal(single_goals[key].get("target"))
            met = one.holds(single.get(key)) if one else None
            page.rows[-1].met += f"; one server: {met_text(met)}"
            page.goals.append(GoalResult(page.name, f"ack path on one server: `{key}`",
                                         num(single.get(key)), str(one), met,
                                         page.date))  # fmt: skip
    per_node_table(page, clustered, f"Per master, {masters}-master cluster:")


def render_e2e(page: Page) -> None:
    d = page.data
    last = last_of_runs(page)
    common_facts(page)
    sink = d.get("sink")
    page.fact("sink", sink if sink else "not recorded (redis, the default)")
    for key, label in (("source_records", "source records"), ("micro_batches", "micro-batches"),
                       ("master_kill_at", "master killed at"),
                       ("master_kill_delay_s", "master kill delay s"),
                       ("rejoin_delay_s", "rejoin delay s")):  # fmt: skip
        page.fact(label, d.get(key))
    if last:
        page.notes.append(last)
    table = (sink or "redis") != "redis"
    zero = Goal("==", 0)
    page.row("records lost", d.get("lost"), goal=zero, summary=False)
    page.row("records pending at the end", d.get("pending"), goal=zero, summary=False)
    if table:
        page.row(f"duplicates in the {sink} table", d.get("duplicates"), goal=zero,
                 summary=False)
    else:
        page.row("duplicates (the Redis sink: counted, no goal)", d.get("duplicates"))
    planned = d.get("faults_planned") or []
    errors = d.get("fault_errors") or []
    page.row("faults not injected or failed", len(errors), goal=zero, summary=False)
    page.row("faults recovered", d.get("faults_recovered"), len(planned), "planned",
             goal=Goal("==", float(len(planned))), summary=False)  # fmt: skip
    for key in ("replayed", "rewrites", "failovers", "crashed_tasks", "dead_lettered",
                "misplaced", "driver_waits", "streaming_s", "elapsed_s"):  # fmt: skip
        if key in d:
            page.row(f"`{key}`", d[key])
    cap = d.get("capacity") or {}
    if cap:
        page.row("Redis µs per source record (masters)", cap.get("redis_usec_per_record_measured"),
                 cap.get("redis_usec_per_record_guide_batch_scope"),
                 "guide's batch-scope formula, docs/deployment.md",
                 cap.get("measured_vs_guide_batch_scope"))  # fmt: skip
        page.row("records/s, one master at 100 %",
                 cap.get("records_per_s_per_master_at_100pct_measured"),
                 cap.get("records_per_s_per_master_at_100pct_guide_batch_scope"),
                 "guide, batch scope",
                 ratio(cap.get("records_per_s_per_master_at_100pct_measured"),
                       cap.get("records_per_s_per_master_at_100pct_guide_batch_scope")))
        page.row("records/s per executor core", cap.get("records_per_s_per_executor_core_measured"),
                 cap.get("records_per_s_per_executor_core_guide"),
                 "guide, 1 M-record batches")  # fmt: skip
        page.row("Redis calls per source record", cap.get("redis_calls_per_record_measured"))
        page.row("seconds per micro-batch", cap.get("seconds_per_micro_batch"))
    faults = d.get("faults") or []
    page.table("Faults:", ["fault", "target", "at batch", "at s", "recovery s", "detail"],
               [[f.get("kind", ""), f.get("target", ""), num(f.get("at_batch")),
                 num(f.get("at_s")), "never" if f.get("recovery_s") is None
                 else num(f["recovery_s"]), num(f.get("detail") or {}) or NONE]
                for f in faults])  # fmt: skip
    ok = (d.get("lost") == 0 and d.get("pending") == 0 and not errors
          and d.get("faults_recovered") == len(planned)
          and (d.get("duplicates") == 0 or not table))  # fmt: skip
    page.goals.append(GoalResult(
        page.name, "cluster rehearsal: nothing lost or pending, every fault recovered"
        + (", no duplicates in the table" if table else ""),
        f"{num(d.get('lost'))} lost, {num(d.get('pending'))} pending, "
        f"{num(d.get('faults_recovered'))}/{len(planned)} recovered"
        + (f", {num(d.get('duplicates'))} duplicates" if table else ""),
        "all", ok, page.date))  # fmt: skip


def last_of_runs(page: Page) -> str:
    """For cluster_e2e.json: which run of cluster_e2e_runs.json it is, when it is one."""
    runs = page.results.get("cluster_e2e_runs.json", {})
    brief = (runs.get("runs") or [None])[-1]
    if page.name != "cluster_e2e.json" or not isinstance(brief, dict):
        return ""
    if all(page.data.get(k) == brief.get(k) for k in ("elapsed_s", "rewrites", "lost",
                                                      "master_kill_at", "master_kill_delay_s")):
        if runs.get("date"):
            page.inferred_date = f"{runs['date']} (that of cluster_e2e_runs.json)"
        return (f"This is the last run of `{runs.get('command', '').strip()}` "
                "(every run's verdict: `cluster_e2e_runs.json`).")
    return ""


def render_e2e_runs(page: Page) -> None:
    d = page.data
    common_facts(page)
    runs = d.get("runs") or []
    keys = ["sink", "master_kill_at", "master_kill_delay_s", "rejoin_delay_s", "lost",
            "pending", "duplicates", "rewrites", "driver_waits", "faults_recovered",
            "master_recovery_s", "elapsed_s", "ok"]  # fmt: skip
    ok = sum(1 for r in runs if r.get("ok"))
    page.row("runs passed (nothing lost or pending, no duplicates, every fault recovered)",
             f"{num(d.get('passed'))}/{len(runs)}", goal=Goal("==", float(len(runs))),
             goal_value=d.get("passed"), goal_label="cluster rehearsal runs passed")  # fmt: skip
    if d.get("passed") != ok:
        page.notes.append(f"`passed` ({num(d.get('passed'))}) differs from the runs marked "
                          f"ok ({ok}).")
    for key in ("lost", "duplicates", "pending"):
        page.row(f"`{key}`, summed over the runs", sum(r.get(key) or 0 for r in runs))
    page.table("The runs:", ["run", *keys],
               [[str(i), *(num(r.get(k)) for k in keys)] for i, r in enumerate(runs, 1)])


PAIR_ORDER = ("ft_off", "ft_on", "ft_on_copy", "ft_on_failing", "ft_on_failing_late",
              "ft_on_keyed", "ft_on_keyed_failing", "arrow_idcol")  # fmt: skip


def ordered(keys: Iterable[str]) -> list[str]:
    keys = list(keys)
    first = [k for k in PAIR_ORDER if k in keys]
    return first + sorted(k for k in keys if k not in first)


def paired_rows(page: Page, pairs: dict[str, str]) -> None:
    """Variant beside baseline: records/s of each, the recorded ratio ``ratio_<v>_vs_*``
    (a median of paired per-round ratios), its quartiles, the goal ``goals[<v>]``."""
    d = page.data
    rates = d.get("records_per_s") or {}
    qs = d.get("ratio_quartiles") or {}
    for variant, base in pairs.items():
        key = next((k for k in sorted(d) if k.startswith(f"ratio_{variant}_vs_")), None)
        value = d.get(key) if key else None
        page.row(f"`{variant}` ÷ `{base}`", rates.get(variant), rates.get(base),
                 f"`{base}`", value, qs.get(variant), goal=page.goal_of(variant, ">="),
                 goal_value=value, unit="rec/s", goal_on="ratio",
                 goal_label=f"`{variant}` ÷ `{base}` (median of paired ratios)")  # fmt: skip


def rates_table(page: Page, base: str) -> None:
    d = page.data
    rates = d.get("records_per_s") or {}
    if not rates:
        return
    medians = d.get("ratio_of_medians") or {}
    rows = []
    for k in [base, *sorted(k for k in rates if k != base)]:
        if k in rates:
            r = medians.get(k, ratio(rates[k], rates.get(base)))
            rows.append([f"`{k}`", num(rates[k]), num(r)])
    page.table(f"Records/s of every variant (medians; ÷ `{base}`: the ratio of the medians):",
               ["variant", "records/s", f"÷ `{base}`"], rows)


def render_pipeline(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.notes.append("Ratios: the median of per-round ratios, each variant timed beside an "
                      "`arrow` (`mapInArrow`) run of its own (paired, ABBA order), with their "
                      "quartiles; `records_per_s` are medians over the rounds.")
    paired_rows(page, {k: "arrow" for k in ordered(d.get("ratio_quartiles") or {})})
    rates = d.get("records_per_s") or {}
    if d.get("ratio_row_ft_on_vs_rdd") is not None:
        page.row("`row_ft_on` ÷ `rdd` (row API, one run each)", rates.get("row_ft_on"),
                 rates.get("rdd"), "`rdd`", d["ratio_row_ft_on_vs_rdd"], unit="rec/s")
    if "redis_calls_per_batch" in d:
        page.row("Redis calls on the success path, per batch / per record",
                 f"{num(d['redis_calls_per_batch'])} / {num(d.get('redis_calls_per_record'))}")
    rates_table(page, "arrow")
    scaling = d.get("scaling_records_per_s") or {}
    page.table("Growth with N (records/s, not paired):", ["records", "arrow", "ft_on",
                                                         "ft_on ÷ arrow"],
               [[num(int(n)) if n.isdigit() else n, num(s.get("arrow")), num(s.get("ft_on")),
                 num(ratio(s.get("ft_on"), s.get("arrow")))]
                for n, s in sorted(scaling.items(), key=lambda kv: natural(kv[0]))])  # fmt: skip
    merged_table(page)


MERGED_TOP = {
    "ratio_df_ft_on_vs_dataframe": "dataframe_stages",
    "ratio_df_ft_on_failing_vs_dataframe": "dataframe_stages",
    "ratio_df_parquet_vs_plain": "dataframe_stages",
    "ratio_stream_failing_late_vs_arrow": "wide_events",
    "redis_bytes_per_record": "wide_events",
}
"""Top-level figures of pipeline_overhead.json that other runs merged in."""


def merged_table(page: Page) -> None:
    """The figures other runs merged into pipeline_overhead.json, each checked against
    the file it was copied from."""
    d = page.data
    rows = []
    for group in ("dataframe_stages", "wide_events"):
        for _, entry in sorted((d.get(group) or {}).items(), key=lambda kv: natural(kv[0])):
            src = entry.get("source", "")
            source = page.results.get(src)
            for key in sorted(k for k in entry if k not in ("source", "date")):
                if source is None:
                    check = f"`{src}` missing"
                elif source.get(key) == entry[key]:
                    check = "same"
                else:
                    check = f"**differs** (`{src}`: {num(source.get(key))})"
                value = entry[key]
                if isinstance(value, dict) and key != "replay_latency_s":
                    shown = num({k: quartiles(v) if isinstance(v, list) else v
                                 for k, v in value.items()})
                else:
                    shown = ("p50 {p50}, p99 {p99}, bound {bound_s}".format(**value)
                             if isinstance(value, dict) else num(value))  # fmt: skip
                rows.append([f"`{src}`", entry.get("date", ""), f"`{key}`", shown, check])
    for key, group in MERGED_TOP.items():
        if key not in d:
            continue
        entries = d.get(group) or {}
        if group == "dataframe_stages":
            vals = [e.get(key) for e in entries.values() if is_num(e.get(key))]
            expect: Any = min(vals) if vals else None
            how = "the lowest over the widths"
        else:
            wide = (entries.get("1024") or {}).get(key)
            expect = wide.get("ft_on") if isinstance(wide, dict) else wide
            how = "the 1024-byte run's" + (" (`ft_on`)" if isinstance(wide, dict) else "")
        check = "same" if expect == d[key] else f"**differs** ({how}: {num(expect)})"
        rows.append(["top level", d.get("date", ""), f"`{key}`", num(d[key]), f"{how}: {check}"])
    page.table("Figures other runs merged into this file (copies: the runs' own sections are "
               "the source):", ["from", "date", "figure", "value", "matches its source?"], rows)


def render_wide(page: Page) -> None:
    d = page.data
    common_facts(page)
    for key in ("stream_batches", "stream_rounds", "stream_trigger"):
        page.fact(key.replace("_", " "), d.get(key))
    paired_rows(page, {k: "arrow" for k in ordered(d.get("ratio_quartiles") or {})})
    rates = d.get("records_per_s") or {}
    if "ratio_dataframe_vs_arrow" in d:
        page.row("`dataframe` ÷ `arrow` (ratio of medians, not paired)", rates.get("dataframe"),
                 rates.get("arrow"), "`arrow`", d["ratio_dataframe_vs_arrow"], unit="rec/s")
    srates = d.get("stream_records_per_s") or {}
    for k, q in sorted((d.get("ratio_stream_quartiles") or {}).items()):
        short = k.removeprefix("ft_on_")
        value = d.get(f"ratio_stream_{short}_vs_arrow")
        page.row(f"streaming, `{k}` ÷ `arrow` ({num(d.get('stream_batches'))} micro-batches)",
                 srates.get(k), srates.get("arrow"), "plain query", value, q,
                 goal=page.goal_of(f"stream_{short}", ">="), goal_value=value,
                 unit="rec/s", goal_on="ratio",
                 goal_label=f"streaming `{k}` ÷ `arrow` (median of paired ratios)")  # fmt: skip
    for key, label in (("redis_bytes_per_record", "Redis bytes received per record"),
                       ("redis_peak_fraction_of_source", "Redis memory peak ÷ source bytes"),
                       ("redis_peak_bytes", "Redis memory peak, bytes")):  # fmt: skip
        v = d.get(key)
        if isinstance(v, dict):
            page.row(f"{label}, `ft_on` (by reference)", v.get("ft_on"), v.get("ft_on_copy"),
                     "`ft_on_copy`", ratio(v.get("ft_on"), v.get("ft_on_copy")),
                     goal=page.goal_of(key, "<="), goal_on="`ft_on`")  # fmt: skip
    lat = d.get("replay_latency_s")
    if isinstance(lat, dict):
        page.row(f"replay latency on a quiet stream, p50 / p99 / max ({num(lat.get('records'))} "
                 f"records, {num(lat.get('replayed'))} replayed, T {num(lat.get('timeout_s'))} s,"
                 f" B {num(lat.get('buckets'))})",
                 f"{num(lat.get('p50'))} / {num(lat.get('p99'))} / {num(lat.get('max'))} s",
                 f"{num(lat.get('bound_s'))} s", "bound T·B/(B−1) + 2 triggers")  # fmt: skip
    elif "replay_latency_s" in d:
        page.row("replay latency on a quiet stream", "not measured (run without `--latency`)")
    rates_table(page, "arrow")


DATAFRAME_PAIRS = {"df_ft_on": "dataframe", "df_ft_on_failing": "dataframe",
                   "df_parquet": "parquet"}  # fmt: skip
SINK_PAIRS = {"delta_merge": "delta_append", "pg_merge": "pg_append"}


def render_dataframe(page: Page) -> None:
    d = page.data
    common_facts(page)
    qs = d.get("ratio_quartiles") or {}
    pairs = {k: DATAFRAME_PAIRS.get(k, "dataframe") for k in sorted(qs)}
    paired_rows(page, pairs)
    page.row("Redis bytes per record sent by a `df_ft_on` batch", d.get("redis_bytes_per_record"))
    rates_table(page, "dataframe")


def render_sink(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("table rows at the end", d.get("table_rows_at_end"))
    qs = d.get("ratio_quartiles") or {}
    pairs = {k: SINK_PAIRS.get(k, k.replace("merge", "append")) for k in sorted(qs)}
    paired_rows(page, pairs)
    rates_table(page, "delta_append")


def render_flush_cost(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.row("one flush of the XORs: client fold and pack + Redis wall", d.get("flush_total_ms"),
             unit="ms")
    page.row("client fold and pack", d.get("pack_ms"), unit="ms")
    page.row("Redis wall time of the pipelined script calls", d.get("redis_wall_ms"),
             d.get("ceiling_hset_pipeline_ms"), "as many pipelined HSETs",
             ratio(d.get("redis_wall_ms"), d.get("ceiling_hset_pipeline_ms")), unit="ms")
    page.row("Redis server time", d.get("redis_server_ms"), unit="ms")
    page.row("Redis server µs per XOR", d.get("server_usec_per_xor"))


def render_pending_memory(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("stored header bytes", d.get("stored_header_bytes"))
    page.fact("keys", d.get("keys"))
    beyond = d.get("bytes_per_pending_beyond_payload")
    for key, met_key, label in (("goal_beyond_payload", "goal_met", "goal"),
                                ("floor_beyond_payload", "floor_met", "floor")):  # fmt: skip
        goal = parse_goal(d.get(key))
        if goal:
            page.row(f"Redis bytes per pending record beyond its payload ({label})", beyond,
                     goal=goal, recorded_met=d.get(met_key))  # fmt: skip
    page.row("Redis bytes per pending record, payload included", d.get("bytes_per_pending"))
    page.row("records persisted per second", d.get("persist_records_per_s"))
    parts = d.get("breakdown_bytes_per_pending") or {}
    page.table("Where the bytes go (per pending record):", ["structure", "bytes"],
               [[k, num(v)] for k, v in sorted(parts.items())])


def render_layout(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("ack entry bytes", d.get("entry_bytes"))
    page.fact("frame header bytes", d.get("frame_header_bytes"))
    cands = d.get("candidates") or {}
    now = next((k for k in sorted(cands) if "(now)" in k), None)
    before = next((k for k in sorted(cands) if "(before)" in k), None)
    key = "bytes_per_pending_beyond_payload"
    if now:
        page.row(f"bytes per pending record beyond the payload: {now}", cands[now].get(key),
                 cands[before].get(key) if before else None, before or "",
                 ratio(cands[now].get(key), cands[before].get(key)) if before else None)
    cols = ["bytes_per_pending_beyond_payload", "memory_usage_beyond_payload", "keys",
            "encodings", "fill_s"]  # fmt: skip
    page.table("Every candidate (`used_memory` and `MEMORY USAGE`, beyond the payload):",
               ["candidate", *cols],
               [[k, *(num(c.get(col)) for col in cols)] for k, c in sorted(cands.items())])


def render_rotation(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("timeout s", d.get("timeout_s"))
    page.fact("buckets", d.get("buckets"))
    page.row("one idle rotation (N pending, none due)", d.get("idle_rotation_ms"), unit="ms")
    page.row("expiry of all N: records/s", d.get("expiry_records_per_s"))
    page.row("expiry of all N: total / longest rotation",
             f"{num(d.get('expiry_total_s'))} s / {num(d.get('expiry_longest_rotation_s'))} s "
             f"({num(d.get('expiry_rotations'))} rotations)")  # fmt: skip
    page.row("sidecar RSS, idle / peak",
             f"{num(d.get('sidecar_rss_mb_idle'))} / {num(d.get('sidecar_rss_mb_peak'))} MB")
    page.row("Redis bytes per pending record (payload included)",
             d.get("redis_bytes_per_pending"))
    page.row("records persisted per second", d.get("persist_records_per_s"))


def render_generic(page: Page) -> None:
    """Any results file: its facts and top-level scalar fields, and its goals."""
    d = page.data
    common_facts(page)
    shown = {k for k, _ in FACTS} | {"goals", "command", "goals_unmet"}
    for key in sorted(k for k, v in d.items() if k not in shown
                      and not isinstance(v, dict | list)):  # fmt: skip
        page.row(f"`{key}`", d[key])


Renderer = Callable[[Page], None]

RENDERERS: tuple[tuple[str, Renderer, str], ...] = (
    (r"ack_throughput(_.+)?", render_ack, ""),
    (r"call_overhead(_.+)?", render_call_overhead, ""),
    (r"claim(_.+)?", render_claim, ""),
    (r"cluster_compare(_.+)?", render_cluster_compare, ""),
    (r"cluster_e2e_runs", render_e2e_runs,
     "This file: each run's verdict figures from a `--repeat N` run."),
    (r"cluster_e2e(_.+)?", render_e2e, ""),
    (r"dataframe_overhead_\d+", render_dataframe, ""),
    (r"flush_cost(_.+)?", render_flush_cost, ""),
    (r"layout_candidates(_.+)?", render_layout, ""),
    (r"pending_memory(_.+)?", render_pending_memory, ""),
    (r"pipeline_overhead_(wide|stream)_\d+", render_wide,
     "This file: the `--payload-bytes W` run: events with a W-byte JSON payload read from "
     "JSON files each run, kept by reference (`ft_on`) or copied (`ft_on_copy`); a streaming "
     "query over K files with 5 % failing after the shuffle; replay latency on a quiet stream."),
    (r"pipeline_overhead(_.+)?", render_pipeline, ""),
    (r"rotation(_.+)?", render_rotation, ""),
    (r"sink_overhead(_.+)?", render_sink, ""),
)  # fmt: skip
"""Per-file renderers, by the file's stem (first match); the rest get ``render_generic``."""


# -- the module behind a file ---------------------------------------------------------------
def modules() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.py")
                  if not p.stem.startswith("_") and p.stem != "results_md")  # fmt: skip


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=COMMAND, description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=RESULTS_DIR,
                    help="the directory of results files (default: %(default)s)")
    ap.add_argument("--output", type=Path, default=None,
                    help=f"where to write (default: <results>/{OUTPUT_NAME})")
    ap.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 if the output file differs from what the "
                         "results generate")  # fmt: skip
    args = ap.parse_args(argv)
    output = args.output or args.results / OUTPUT_NAME
    text = render(args.results)
    if args.check:
        old = output.read_text() if output.exists() else ""
        if old == text:
            print(f"{output} is up to date")
            return 0
        diff = difflib.unified_diff(old.splitlines(), text.splitlines(), f"{output} (committed)",
                                    f"{output} (generated)", lineterm="", n=1)  # fmt: skip
        print("\n".join(list(diff)[:200]))
        print(f"\n{output} is out of date: run `{COMMAND}`", file=sys.stderr)
        return 1
    output.write_text(text)
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
