"""Section renderers of the cluster rehearsals (``cluster_e2e``): one run's faults and
verdict, and a ``--repeat N`` run's verdict per run."""

from __future__ import annotations

from benchmarks.results_md.page import (
    NONE,
    Goal,
    GoalResult,
    Page,
    common_facts,
    num,
    ratio,
)


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
