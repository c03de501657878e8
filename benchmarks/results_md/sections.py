"""Which renderer builds a results file's section: the table of file-name patterns, and
``render_generic`` for every other file."""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.results_md.page import FACTS, Page, common_facts
from benchmarks.results_md.redis_sections import (
    render_ack,
    render_call_overhead,
    render_claim,
    render_cluster_compare,
    render_flush_cost,
    render_layout,
    render_pending_memory,
    render_rotation,
)
from benchmarks.results_md.rehearsal_sections import render_e2e, render_e2e_runs
from benchmarks.results_md.spark_sections import (
    render_dataframe,
    render_pipeline,
    render_sink,
    render_wide,
)
from benchmarks.results_md.stream_sections import render_observation_cost, render_stream


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
    (r"observation_cost(_.+)?", render_observation_cost, ""),
    (r"pending_memory(_.+)?", render_pending_memory, ""),
    (r"pipeline_overhead_(wide|stream)_\d+", render_wide,
     "This file: the `--payload-bytes W` run: events with a W-byte JSON payload read from "
     "JSON files each run, kept by reference (`ft_on`) or copied (`ft_on_copy`); a streaming "
     "query over K files with 5 % failing after the shuffle; replay latency on a quiet stream."),
    (r"pipeline_overhead(_.+)?", render_pipeline, ""),
    (r"rotation(_.+)?", render_rotation, ""),
    (r"sink_overhead(_.+)?", render_sink, ""),
    (r"stream_overhead(_.+)?", render_stream, ""),
)  # fmt: skip
"""Per-file renderers, by the file's stem (first match); the rest get ``render_generic``."""
