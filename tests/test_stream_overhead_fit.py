"""The streaming yardstick's split of ftlayer's extra time (benchmarks.stream_overhead):
what is paid once per query -- outside the micro-batches, or inside the first one -- is
measured, and only the rest is fitted per micro-batch and per record. Arithmetic on
figures shaped as a run records them; no Spark here (the smoke run has the real one)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.stream_overhead import (
    Cadence,
    Progress,
    fit_per_batch,
    goals,
    spark_figures,
    variants,
)

CADENCES = [Cadence(5000, 20), Cadence(50000, 8)]


def figures(outside: float, first: float, per_batch_s: float, per_record_s: float,
            plain_outside: float = 0.2, plain_first: float = 0.3) -> tuple[Any, Any]:  # fmt: skip
    """What a run records of a query whose ftlayer cost is ``outside`` seconds before and
    after its micro-batches, ``first`` seconds inside its first one, then
    ``per_batch_s`` a micro-batch and ``per_record_s`` a record."""
    per: dict[str, Any] = {}
    diffs: dict[str, list[float]] = {}
    for c in CADENCES:
        per[c.name] = {"df": {
            "plain_outside_batches_s": plain_outside, "plain_first_batch_excess_s": plain_first,
            "ft_on_outside_batches_s": plain_outside + outside,
            "ft_on_first_batch_excess_s": plain_first + first}}  # fmt: skip
        extra = outside + first + c.batches * per_batch_s + c.events * per_record_s
        diffs[f"df:{c.name}:ft_on"] = [extra - 0.01, extra, extra + 0.01]
    return per, SimpleNamespace(diffs=diffs)


@pytest.mark.parametrize(("outside", "first"), [(0.15, 0.0), (0.15, 0.5), (0.0, 0.4)])
def test_a_cost_paid_once_per_query_is_not_read_as_one_per_batch(outside: float,
                                                                 first: float) -> None:  # fmt: skip
    """Catches: the first micro-batch's one-time excess (the replay reader's first offset
    took 0.3-0.5 s) left to the two-cadence fit, where 0.5 s once per query reads as about
    23 ms a micro-batch and 0.9 us a record."""
    per, rounds = figures(outside, first, per_batch_s=0.012, per_record_s=0.4e-6)
    got = fit_per_batch(per, rounds, CADENCES, "df")
    assert got["ft_s_per_query"] == pytest.approx(outside + first, abs=1e-3)
    assert got["ft_ms_per_batch"] == pytest.approx(12.0, abs=0.1)
    assert got["ft_us_per_record"] == pytest.approx(0.4, abs=0.001)


def query(*batches: tuple[int, int]) -> Any:
    """A finished query as its progress shows it: (rows read, milliseconds) a micro-batch."""
    return SimpleNamespace(recentProgress=[
        SimpleNamespace(numInputRows=rows, durationMs={"triggerExecution": ms})
        for rows, ms in batches])  # fmt: skip


def test_the_tail_is_the_micro_batches_after_the_input_ended() -> None:
    """Catches: a replay-only micro-batch between two of the input counted in the tail, or
    the tail's micro-batches missing from it (the figure that says how much of a failing
    DataFrame query's extra time its finite input's end costs)."""
    q = Progress.of(query((5000, 400), (0, 250), (5000, 410), (5000, 390), (0, 280),
                          (0, 210)))  # fmt: skip
    n, seconds = q.tail_batches, q.tail_s
    assert (n, seconds) == (2, pytest.approx(0.49))
    assert Progress.of(query((5000, 400), (5000, 380)))[3:] == (0, 0.0)
    runs = [q, Progress(5, 1.6, 0.0, 1, 0.2),
            Progress(7, 2.2, 0.0, 3, 0.7)]  # fmt: skip
    got = spark_figures("ft_on_failing", runs, [2.1, 1.8, 2.4])
    assert got["ft_on_failing_tail_micro_batches"] == 2
    assert got["ft_on_failing_tail_s"] == pytest.approx(0.49)


def test_a_stage_that_can_fail_rows_is_held_to_the_goals_of_one_that_cannot() -> None:
    """``ft_on_marked`` (a DataFrame stage with ``failed=`` that marks no row: what a
    pipeline people write has) has ``ft_on``'s goals at each cadence, for ``df`` only (a
    Python stage's checks are in its ``ft_on`` already). Catches: the variant reported
    without a goal, or with the failing runs' lower one."""
    g = goals([Cadence.parse("5000x20"), Cadence.parse("50000x8")], ["df", "arrow"])
    for c in ("5000x20", "50000x8"):
        assert g[f"{c}:ratio_stream_df_ft_on_marked_vs_plain"] == \
            g[f"{c}:ratio_stream_df_ft_on_vs_plain"]
        assert f"{c}:ratio_stream_arrow_ft_on_marked_vs_plain" not in g
    assert g["50000x8:ratio_stream_df_ft_on_marked_vs_plain"] == ">= 0.9"
    assert variants("df") == ("ft_on", "ft_on_marked", "ft_on_failing")
    assert variants("arrow") == ("ft_on", "ft_on_failing")
