"""benchmarks._paired.PairedRounds, without Spark: what every paired benchmark's figures
rest on. Catches: warm-up rounds counted, a baseline always run first (the order must
alternate), a ratio inverted (the baseline's time over the variant's), a run's checks
timed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks._paired import PairedRounds

SLEEP = {"base": 0.02, "fast": 0.005, "slow": 0.08}
"""4x apart: a loaded machine oversleeps by milliseconds, never by that much."""
CHECK_S = 0.2


def test_warmup_rounds_run_uncounted_and_the_order_alternates() -> None:
    ran: list[tuple[int, str]] = []
    rnd = 0

    def prepare(name: str) -> Callable[[], Any]:
        def job() -> Callable[[], None]:
            ran.append((rnd, name))
            time.sleep(SLEEP[name])
            return lambda: time.sleep(CHECK_S)  # a check after the clock stops: not timed

        return job

    rounds = PairedRounds({"fast": "base", "slow": "base"}, warmup=1)
    for rnd in range(3):
        rounds.round(rnd, prepare)
    assert len(ran) == 3 * 4, "every round runs every pair, warm-up included"
    assert [n for r, n in ran if r == 1][:2] == ["fast", "base"]  # round 1: variant first
    assert [n for r, n in ran if r == 2][:2] == ["base", "fast"]  # round 2: baseline first
    assert len(rounds.ratios["fast"]) == len(rounds.ratios["slow"]) == 2  # warm-up dropped
    assert len(rounds.times["base"]) == 4 and all(t < CHECK_S * 0.75 for t in rounds.times["base"])
    assert min(rounds.ratios["fast"]) > 1 > max(rounds.ratios["slow"])  # base time / variant
    r = rounds.result("x", 10, 0, "none", 2, {"fast": "ratio_fast", "slow": "ratio_slow"},
                      {"fast": 1.0, "slow": 1.0})  # fmt: skip
    assert r["warmup"] == 1 and r["ratio_fast"] > 1 > r["ratio_slow"]
