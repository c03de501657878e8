"""An outage is not a verdict: a streaming query whose stage after the shuffle calls a
downstream that is down for 20 seconds (real Spark, real Redis, JSON files kept by
reference, the replay stream, every setting at its default but ``timeout_s=3``).

10 files of 1,000 records arrive one per second; while the downstream is down (a key in
Redis with a 20-second expiry: the outage ends by itself) the stage fails every row it is
given. Every record must end in the sink exactly once, none in the dead letters, and none
may be sent to the down service more than 3 times while it is down.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from pyspark import cloudpickle
from pyspark.sql import SparkSession

from ftlayer.spark import FileSource, Outcome
from tests.spark.probe import Probe
from tests.toolkit import until

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = [pytest.mark.spark, pytest.mark.slow]

FILES, PER_FILE, OUTAGE_S = 10, 1000, 20
SCHEMA = "id long, key long, payload string"


def _write(path: Path, first: int) -> None:
    tmp = path.parent / f".{path.name}.tmp"
    rows = [{"id": i, "key": i % 31, "payload": f"event {i}"}
            for i in range(first, first + PER_FILE)]  # fmt: skip
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.rename(path)


def test_a_twenty_second_outage_loses_nothing_and_is_not_hammered(
    spark: SparkSession, make_ft: Any, probe: Probe, tmp_path: Path
) -> None:
    """Catches: an outage dead-lettering records (their budget spent in it), a down
    downstream hammered by immediate retries or by replays every micro-batch, records
    lost or written twice through the holds, the breaker never closing once it is back."""
    ft = make_ft(timeout_s=3.0)
    down, inbox = f"{probe.prefix}:down", tmp_path / "in"
    inbox.mkdir()

    def call_downstream(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        is_down = bool(probe.r.exists(down))
        with probe.r.pipeline(transaction=False) as p:
            for i in ids.tolist():
                p.hincrby(f"{probe.prefix}:{'down_calls' if is_down else 'calls'}", str(i), 1)
            p.execute()
        failed = np.ones(len(ids), bool) if is_down else np.zeros(len(ids), bool)
        return Outcome(b, failed=failed, errors="downstream unavailable")

    def sink(b: pa.RecordBatch) -> None:
        probe.r.rpush(f"{probe.prefix}:sink", *b.column("id").to_pylist())

    files = FileSource("json", str(inbox), SCHEMA, maxFilesPerTrigger=1)
    pipeline = (ft.pipeline(reads=files, name="outage")
                .map_batches(lambda b: b, SCHEMA).partition_by(["key"], 4)
                .map_batches(call_downstream, SCHEMA).sink_batches(sink))  # fmt: skip
    probe.r.set(down, 1, ex=OUTAGE_S)

    def arrive() -> None:
        for k in range(FILES):
            _write(inbox / f"events-{k:02d}.json", k * PER_FILE)
            time.sleep(1.0)

    writer = threading.Thread(target=arrive, daemon=True)
    writer.start()
    query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
             .trigger(processingTime="1 second")
             .option("checkpointLocation", str(tmp_path / "ck")).start())  # fmt: skip
    n = FILES * PER_FILE
    try:
        assert ft.layer is not None
        layer = ft.layer
        until(lambda: probe.r.llen(f"{probe.prefix}:sink") + layer.stats().dead_letters >= n,
              "every record in the sink or the dead letters", 150, 0.5)  # fmt: skip
        assert layer.stats().dead_letters == 0, "the outage dead-lettered records"
        until(lambda: layer.stats().pending == 0, "nothing pending", 60, 0.5)
        assert query.exception() is None, query.exception()
    finally:
        query.stop()
        writer.join(timeout=15)
    got = Counter(probe.ids())
    assert set(got) == set(range(n)) and max(got.values()) == 1, "lost or duplicated"
    st = ft.layer.stats()
    assert st.dead_letters == 0 and st.dead_lettered == 0, st
    down_calls = {int(k): int(v) for k, v in probe.r.hgetall(f"{probe.prefix}:down_calls").items()}
    assert down_calls, "the outage was not seen"
    assert max(down_calls.values()) <= 3, Counter(down_calls.values())
    assert st.held > 0, st  # the breaker held what reached the stage while it was open
    # held and tripped rows were kept as the stage's input: no file was read back
    assert sum(r.read_back for r in ft.results) == 0, [r.read_back for r in ft.results]
    assert sum(r.entered for r in ft.results) > 0
