"""One dead letter per record: a record dead-lettered again (a batch run again over the
same records, as Spark re-runs a micro-batch after a driver crash) joins its dead letter.
Real Spark (local[2]), real Redis.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import sys
from typing import Any

import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer.deadletters import dead_letter_dict
from ftlayer.spark import Outcome

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark

N = 200
POISON = {5, 17, 120, 150, 199}
"""Ids 5 and 17 sit in partition 0 of both runs (their second dead letter comes in the
same shard as the first); 120, 150 and 199 move to other partitions, so other shards."""


def _refuse_poison(b: pa.RecordBatch) -> Outcome:
    ids = b.column("id").to_pylist()
    return Outcome(b, failed=[i in POISON for i in ids], errors="poison")


def test_a_record_dead_lettered_again_keeps_one_dead_letter(
    spark: SparkSession, make_ft: Any
) -> None:
    """The same records (``record_key``: lineage id = the key) run twice, in 2 and then 7
    partitions; the poison ones are dead-lettered by both runs, in the same shard and in
    another. Each keeps one dead letter holding both failures (an ``again`` mark between),
    the counters count each once, and ``dlq_replay`` re-drives each once. Catches: dead
    letters keyed by the attempt's id (one per run), the shard's index missing a record
    of its own call or of an earlier one, the cross-shard join not run before listing or
    dropping an entry without joining it."""
    ft = make_ft(timeout_s=2.0, max_replays=0, shards=8)
    pipeline = (ft.pipeline(source=0, record_key="id")
                .map_batches(_refuse_poison, "id long, key long")
                .sink_batches(lambda b: None))  # fmt: skip
    for parts in (2, 7):
        pipeline(spark.range(0, N, 1, parts).selectExpr("id", "id % 13 AS key"), parts)
        assert ft.drain(timeout_s=60).pending == 0
    layer = ft.layer
    assert layer is not None
    letters = layer.persistence.dead_letters()
    assert sorted(d.frame.decode()["id"] for d in letters if d.frame) == sorted(POISON)
    for d in letters:
        reasons = [h["reason"] for h in dead_letter_dict(d)["history"]]
        assert reasons == ["explicit", "again", "explicit"], reasons
        assert d.attempts == 2, d
    st = layer.stats()
    assert (st.dead_letters, st.dead_lettered) == (len(POISON), len(POISON)), st
    assert layer.dlq_replay(None) == len(POISON), "each re-driven once"
    assert layer.stats().dead_letters == 0
