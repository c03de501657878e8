"""ftlayer's counts where Spark users look: a real streaming query (file source, three
micro-batches), the listener ftlayer installs, and what it reports per batch against the
batch results and Spark's own progress."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer.spark import Outcome
from tests.spark.probe import Probe
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark


def test_the_listener_joins_spark_progress_with_batch_results(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Catches: progress events not joined with their batch (wrong batch id), counts that
    disagree with Spark's numInputRows, a batch's acked not fresh + replayed - failed -
    unconfirmed, per-stage counts that do not add up, and a listener left installed after
    close()."""
    inp = tmp_path / "in"
    inp.mkdir()
    for f in range(3):
        rows = [{"id": i, "key": i % 7} for i in range(f * 400, (f + 1) * 400)]
        (inp / f"f{f}.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    def stage(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        return Outcome(b, failed=ids % 100 == 7, errors="not today")

    def sink(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        return Outcome(unconfirmed=np.flatnonzero(ids % 100 == 9))

    ft = make_ft(max_replays=3, timeout_s=30.0)
    ft.install_progress_listener(spark)
    pipeline = (ft.pipeline(source=0, immediate_replays=0).map_batches(stage, "id long, key long")
                .partition_by(["key"], 3).sink_batches(sink))  # fmt: skip
    stream = spark.readStream.schema("id long, key long").option("maxFilesPerTrigger", 1)
    query = (stream.json(str(inp)).writeStream.foreachBatch(pipeline)
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).queryName("orders").start())  # fmt: skip
    query.awaitTermination()
    # events arrive on Spark's listener bus, later
    until(lambda: len([p for p in ft.recent_progress if p.ft]) >= 3,
          lambda: f"3 batches' progress (seen: {[p.batch_id for p in ft.recent_progress]})",
          20)  # fmt: skip
    seen = [p for p in ft.recent_progress if p.ft is not None]
    assert [p.batch_id for p in seen] == [0, 1, 2]
    spark_rows = {p["batchId"]: p["numInputRows"] for p in query.recentProgress}
    for p in seen:
        r = p.ft
        assert r is not None and r.batch_id == p.batch_id and p.name == "orders"
        assert p.num_input_rows == spark_rows[p.batch_id] == r.fresh == 400
        # each batch: 4 fresh failures and 4 unconfirmed writes; it claims every earlier
        # failure as a replay (they fail again: the stage always fails them)
        assert r.replayed == 4 * p.batch_id, r
        assert r.failed == 4 + r.replayed and r.unconfirmed == 4, r
        assert r.acked == r.fresh + r.replayed - r.failed - r.unconfirmed == 392
        (m,) = [c for k, c in r.stages.items() if k.startswith("map_batches")]
        (w,) = [c for k, c in r.stages.items() if k.startswith("sink")]
        assert m.rows_in == m.rows_out + m.failed == 400 + r.replayed and m.acked == 396
        assert w.rows_in == 396 and w.unconfirmed == 4 and w.acked == 392
        assert json.loads(p.json())["ft"]["stages"]
    assert ft.last_progress is seen[-1]
    listeners = len(spark.streams._jsqm.listListeners())
    ft.close()
    assert len(spark.streams._jsqm.listListeners()) == listeners - 1
