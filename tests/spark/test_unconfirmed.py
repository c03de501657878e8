"""Sinks that do not confirm some writes (async sinks): those records stay pending, time
out and are replayed -- never acked, never lost."""

from __future__ import annotations

from typing import Any

import pytest
from pyspark.sql import SparkSession

from ftlayer.spark import UNCONFIRMED, Unconfirmed


@pytest.mark.parametrize("scope", ["batch", "task"])
@pytest.mark.parametrize("per", ["record", "partition"])
def test_unconfirmed_writes_time_out_and_replay(
    spark: SparkSession, make_ft: Any, probe: Any, per: str, scope: str
) -> None:
    """Invariants 1 and 10: unconfirmed writes are never acked; the drain replays them."""
    # ack_scope="task" keeps no claimed replay alive while its batch runs: a drain batch
    # slower than timeout_s (a loaded CI machine) would time its replays out once more
    ft = make_ft(timeout_s=1.0 if scope == "batch" else 4.0, rotate=True)
    n = 600
    df = spark.range(n).selectExpr("id", "cast(id % 5 as int) as key")

    def write_one(r: dict[str, Any]) -> Any:
        if r["id"] % 9 == 0 and probe.first_time("unconfirmed", r["id"]):
            return UNCONFIRMED
        probe.write([r])
        return None

    def write_many(rs: list[dict[str, Any]]) -> Any:
        lost = [i for i, r in enumerate(rs)
                if r["id"] % 9 == 0 and probe.first_time("unconfirmed", r["id"])]  # fmt: skip
        probe.write([r for i, r in enumerate(rs) if i not in set(lost)])
        return Unconfirmed(lost)

    sink = write_one if per == "record" else write_many
    pipeline = ft.pipeline(source=0, ack_scope=scope).map(lambda r: r).sink(sink, per=per)  # type: ignore[arg-type]
    first = ft.run_batch(pipeline, df, 0)
    assert first.unconfirmed == len(range(0, n, 9)) and first.failed == 0
    assert ft.layer.stats().pending == first.unconfirmed, "left pending, not acked"
    report = ft.drain(timeout_s=60)
    assert report.drained and report.dead_lettered == 0
    st = ft.layer.stats()
    assert st.failed_timeout == first.unconfirmed and st.failed_explicit == 0
    assert sorted(set(probe.ids())) == list(range(n))
