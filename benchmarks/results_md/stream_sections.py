"""Section renderers of the streaming yardstick (``stream_overhead.json``: per cadence and
pipeline, each ftlayer query's seconds per micro-batch beside the plain query's (paired),
the median ratio and its quartiles, then the cost per query (measured) and the per-batch and
per-record costs fitted over the cadences) and of what an observation costs a micro-batch's
job (``observation_cost.json``)."""

from __future__ import annotations

from benchmarks.results_md.page import Page, common_facts, num


def render_stream(page: Page) -> None:
    d = page.data
    common_facts(page)
    page.fact("source", d.get("source", "files"))
    page.fact("attempts failing after the shuffle (failing runs)", d.get("fail_rate"))
    page.notes.append("Ratios: the plain query's time ÷ the ftlayer query's, the median of "
                      "per-round ratios (each ftlayer run beside a plain run of its own, "
                      "alternating order), with their quartiles; times are seconds per "
                      "micro-batch.")  # fmt: skip
    goals = d.get("goals") or {}
    cadences = d.get("cadences") or {}
    progress = []
    for cname in sorted(cadences, key=lambda k: (cadences[k].get("events_per_batch") or 0)):
        cad = cadences[cname]
        shape = f"{cad.get('batches')} × {num(cad.get('events_per_batch'))} events"
        for p in ("df", "arrow"):
            f = cad.get(p)
            if not isinstance(f, dict):
                continue
            ran = [v for v in ("ft_on", "ft_on_marked", "ft_on_failing")
                   if f"ratio_stream_{p}_{v}_vs_plain" in f]  # (marked: df, since 2026-11-30)
            progress += [[f"`{p}` `{v}`, {cname}", num(f.get(f"{v}_micro_batches")),
                          num(f.get(f"{v}_trigger_s_per_batch")),
                          num(f.get(f"{v}_outside_batches_s"))]
                         for v in ("plain", *ran)]  # fmt: skip
            for v in ran:
                key = f"ratio_stream_{p}_{v}_vs_plain"
                page.row(f"`{p}` `{v}` ÷ plain, {shape}", f.get(f"{v}_s_per_batch"),
                         f.get("plain_s_per_batch"), "plain", f.get(key),
                         f.get(f"{key}_quartiles"),
                         goal=page.goal_of(f"{cname}:{key}", ">=", goals), goal_value=f.get(key),
                         unit="s/batch", goal_on="ratio",
                         goal_label=f"`{key}` at {shape}")  # fmt: skip
    width = d.get("stage_input_arrow_bytes")
    for cname in sorted(cadences, key=lambda k: (cadences[k].get("events_per_batch") or 0)):
        for p in ("df", "arrow"):
            f = cadences[cname].get(p)
            if not isinstance(f, dict) or "ft_on_redis_bytes_per_record" not in f:
                continue
            key = f"{cname}:{p}:ft_on_redis_bytes_per_record"
            if key in goals:  # Kafka: a reference a record, no payload
                page.row(f"`{p}` Redis bytes per record, {cname} (no failures)",
                         f["ft_on_redis_bytes_per_record"], goal=page.goal_of(key, "<=", goals),
                         unit="B", goal_label=f"Redis bytes per record, `{p}` {cname}")  # fmt: skip
            if "ft_on_failing_redis_bytes_per_failure" not in f:
                page.row(f"`{p}` failures that reached Redis, {cname} (retried in their "
                         "task otherwise; too few to measure their bytes)",
                         f.get("ft_on_failing_failures"))  # fmt: skip
                continue
            key = f"{cname}:{p}:ft_on_failing_redis_bytes_per_failure"
            page.row(f"`{p}` Redis bytes per failed attempt, {cname} (beyond the run "
                     f"without failures; {num(f.get('ft_on_redis_bytes_per_record'))} B per "
                     "record without failures)",
                     f["ft_on_failing_redis_bytes_per_failure"], width,
                     "the failing stage's input row (Arrow)",
                     goal=page.goal_of(key, "<=", goals), unit="B",
                     goal_label=f"Redis bytes per failed attempt, `{p}` {cname}")  # fmt: skip
    page.table("From the queries' own progress (medians): micro-batches run (replay rounds "
               "included), Spark's `triggerExecution` per micro-batch, and a run's seconds "
               "outside its micro-batches (starting and ending the query):",
               ["query", "micro-batches", "s per micro-batch (Spark)", "s outside them"],
               progress)  # fmt: skip
    if "python_source_s_per_query" in d:
        page.row("any Python streaming source's cost per query (Spark's: the API the replay "
                 "stream is written in; a source that never has data, same session)",
                 d["python_source_s_per_query"], unit="s")  # fmt: skip
    for p, f in (d.get("fit") or {}).items():
        if "ft_s_per_query" in f:  # measured from the progress, not fitted
            page.row(f"`{p}` `ft_s_per_query` (starting and ending the query, over plain)",
                     f.get("ft_s_per_query"), unit="s")  # fmt: skip
        for key, unit in (("ft_ms_per_batch", "ms"), ("ft_us_per_record", "µs")):
            page.row(f"`{p}` `{key}` (fitted over the cadences)", f.get(key),
                     goal=page.goal_of(f"{p}:{key}", "<=", goals), unit=unit,
                     goal_label=f"`{p}` `{key}`")  # fmt: skip


def render_observation_cost(page: Page) -> None:
    """Per cadence and variant: the observed job's seconds beside the plain job's (paired),
    the ratio and its quartiles, and the milliseconds per observation with theirs."""
    d = page.data
    common_facts(page)
    page.fact("observations per job", d.get("observations_per_job"))
    page.notes.append("Ratios: the plain job's time ÷ the observed job's, the median of "
                      "per-round ratios; milliseconds per observation: the median of the "
                      "per-round extra times over the job's observations.")  # fmt: skip
    cadences = d.get("cadences") or {}
    for events in sorted(cadences, key=int):
        f = cadences[events]
        for v in ("count", "stage", "stage_one_text"):
            if f"{v}_s" not in f:  # (a file recorded before the variant existed)
                continue
            page.row(f"`{v}` job, {num(int(events))} events", f.get(f"{v}_s"),
                     f.get("plain_s"), "plain job", f.get(f"ratio_{v}_vs_plain"),
                     f.get(f"ratio_{v}_vs_plain_quartiles"), unit="s")  # fmt: skip
            page.row(f"`{v}`: extra per observation, {num(int(events))} events",
                     f.get(f"ms_per_observation_{v}"), q=f.get(f"ms_per_observation_{v}_quartiles"),
                     unit="ms")  # fmt: skip
