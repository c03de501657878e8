"""Section renderers of the Spark pipeline benchmarks: each variant beside its paired
baseline (median of per-round ratios, quartiles), records/s of every variant, the figures
other runs merged into ``pipeline_overhead.json``, the wide-payload and streaming runs, the
DataFrame and sink runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from benchmarks.results_md.page import (
    Page,
    common_facts,
    is_num,
    natural,
    num,
    quartiles,
    ratio,
)

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
    "ratio_df_ft_on_failing_late_vs_dataframe": "dataframe_stages",
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
                   "df_ft_on_failing_late": "dataframe", "df_parquet": "parquet"}  # fmt: skip
SINK_CASES = ("append", "merge", "merge_10x")


def render_dataframe(page: Page) -> None:
    d = page.data
    common_facts(page)
    qs = d.get("ratio_quartiles") or {}
    pairs = {k: DATAFRAME_PAIRS.get(k, "dataframe") for k in sorted(qs)}
    paired_rows(page, pairs)
    page.row("Redis bytes per record sent by a `df_ft_on` batch", d.get("redis_bytes_per_record"))
    rates_table(page, "dataframe")


def render_sink(page: Page) -> None:
    """Each case of each sink beside its plain write (``plain_<variant>``), and the rows
    every table held at the end, which the run checked after each of its runs."""
    d = page.data
    common_facts(page)
    page.fact("runs whose table rows were checked", d.get("rows_checked_runs"))
    qs = d.get("ratio_quartiles") or {}
    order = [f"{s}_{c}" for s in ("delta", "pg") for c in SINK_CASES]
    paired_rows(page, {k: f"plain_{k}" for k in [*[o for o in order if o in qs],
                                                 *sorted(k for k in qs if k not in order)]})
    rows = d.get("table_rows_at_end") or {}
    ops = d.get("delta_commit_operations") or {}

    def commits(k: str) -> str:
        return ", ".join(ops.get(k, [])) or ("none" if "delta" in k else "–")

    page.table("Table rows at the end (checked exact after every run: appends add the batch, "
               "merges add nothing), and the operations of the Delta commits the runs made:",
               ["variant", "rows", "plain's rows", "Delta commits", "plain's Delta commits"],
               [[f"`{k}`", num(rows.get(k)), num(rows.get(f"plain_{k}")), commits(k),
                 commits(f"plain_{k}")] for k in order if k in rows])  # fmt: skip
    rates_table(page, "plain_delta_append")
