"""The driver of a streaming query, run as its own process by test_crash_driver.py, which
kills it with ``kill -9`` (its whole session: Python driver, JVM, Python workers) in the
middle of a batch and then starts it again on the same checkpoint.

    python crash_driver_job.py <redis_url> <namespace> <input dir> <checkpoint dir> <mode> \
        <replays> [<sink>]

The query reads JSON files of ``id, key`` rows one file per batch. Pipeline: stage 1 ->
partition_by(key, 4) -> stage 2 -> sink. Stage 2 fails ids = 7 (mod 61) in every attempt
(they exhaust their two replays and end in the dead letters) and ids = 3 (mod 13) the first
time any attempt sees them (they replay from the queue; those the killed batch had claimed
fail a second time, by timeout, and replay again). The sink pushes ids to
``<ns>:sink``. Each batch id the query starts is pushed to ``<ns>:batches``.

Mode ``crash``: in batch 2 the sink writes its rows, sets ``<ns>:holding`` and sleeps:
the test kills the session then. Mode ``finish``: run until every file is processed, then
drain and print ``RESULT <json>`` (drain result and stats, and the replays that entered
at their stage).

Replays ``claim``: each batch claims queued replays itself and ``drain()`` runs the last
ones after the query stopped. ``stream``: replays ride the replay stream
(``pipeline.with_replays``), batch 2 re-run after the kill reads the replays its offset
claimed, and mode ``finish`` waits with the query running until nothing is pending (no
drain). ``reference``: the same, with the files kept by reference (``FileSource``) and nothing
retried at once: a row failing in stage 2 is kept as its input and its replay enters there
(a timed-out one is read back from its file). ``frames``: the same as DataFrame stages ending in a
``sink_dataframe`` whose write (``foreachPartition``) is the one killed. ``kafka``: the
``reference`` pipeline over a Kafka topic (``<input>`` is ``kafka://<bootstrap>/<topic>``,
JSON values, 400 offsets a batch) kept by reference (``KafkaSource``), its first stage
parsing the values.

Sink ``delta:<path>`` / ``postgres:<url>``: the sink also writes its rows, with their
lineage ids, through ftlayer's idempotent sink (``DeltaSink`` / ``PostgresSink`` on table
``events``) before it holds; ``<ns>:sink`` still lists every row written, duplicates too.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from ftlayer import FTConfig
from ftlayer.connection import connect
from ftlayer.sinks import DeltaSink, PostgresSink
from ftlayer.spark import FaultTolerance, FileSource, KafkaSource, Outcome

HOLD_BATCH = 2


class Stage2:
    def __init__(self, url: str, ns: str) -> None:
        self.url, self.ns = url, ns

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        always = np.flatnonzero(ids % 61 == 7)
        cand = np.flatnonzero(ids % 13 == 3)
        r = connect(self.url)
        with r.pipeline(transaction=False) as p:
            for i in cand:
                p.sadd(f"{self.ns}:failed_once", int(ids[i]))
            first = p.execute()
        once = [int(i) for i, new in zip(cand, first, strict=True) if new]
        return Outcome(b, failed=sorted({*always.tolist(), *once}), errors="stage 2 fails")


def idempotent(target: str) -> Any:
    """The idempotent sink named by ``delta:<path>`` / ``postgres:<url>`` (None: none)."""
    kind, _, where = target.partition(":")
    if kind == "delta":
        return DeltaSink(where)
    if kind == "postgres":
        return PostgresSink(where, "events", create=True)
    return None


class Sink:
    def __init__(self, url: str, ns: str, hold: bool, target: str = "redis") -> None:
        self.url, self.ns, self.hold, self.target = url, ns, hold, target

    def __call__(self, b: pa.RecordBatch, ctx: Any = None) -> None:
        r = connect(self.url)
        ids = b.column("id").to_pylist()
        table = idempotent(self.target)
        if table is not None and b.num_rows:
            table(b.select(["id", "key", "lineage_id"]), ctx)
        if ids:
            r.rpush(f"{self.ns}:sink", *ids)
        if self.hold and int(r.get(f"{self.ns}:batch") or -1) == HOLD_BATCH:
            r.set(f"{self.ns}:holding", 1)
            time.sleep(600)  # killed here, mid-batch: its rows written, nothing settled


class ArrowSink:
    """``sink_dataframe``'s writer for ``frames``: a ``mapInArrow`` pushing ids, holding
    in batch 2 like :class:`Sink`, inside a ``df.write`` (killed inside the write's job)."""

    def __init__(self, url: str, ns: str, hold: bool, target: str = "redis") -> None:
        self.sink = Sink(url, ns, hold, target)

    def __call__(self, batches: Any) -> Any:
        for b in batches:
            self.sink(b)
            yield pa.RecordBatch.from_pydict({"n": [b.num_rows]})

    def write(self, df: Any, _: Any) -> None:
        out = df.mapInArrow(self, "n long")
        out.write.format("noop").mode("overwrite").save()


def frames_pipeline(ft: FaultTolerance, files: FileSource, url: str, ns: str,
                    hold: bool, target: str) -> Any:  # fmt: skip
    """The same pipeline as DataFrame stages: ids = 3 (mod 13) fail fresh (their replays,
    whose identity has no location, pass), ids = 7 (mod 61) every time."""
    failed = "id % 61 = 7 OR (id % 13 = 3 AND __ft_loc IS NOT NULL)"
    return (
        ft.pipeline(source=0, reads=files)
        .transform(lambda df: df)
        .partition_by(["key"], 4)
        .transform(lambda df: df, failed=failed, errors="stage 2 fails")
        .sink_dataframe(ArrowSink(url, ns, hold, target).write,
                        lineage="lineage_id" if target != "redis" else None)
    )  # fmt: skip


def parse_values(b: pa.RecordBatch) -> pa.RecordBatch:
    """Kafka rows -> ``id, key`` (their JSON values)."""
    rows = [json.loads(v) for v in b.column("value").to_pylist()]
    return pa.RecordBatch.from_pylist(rows, schema=pa.schema([("id", pa.int64()),
                                                              ("key", pa.int64())]))


def dead_ids(letters: pa.Table) -> list[int]:
    """The dead letters' ids: their column, or (Kafka) in their JSON values."""
    if "id" in letters.column_names:
        return letters.column("id").to_pylist()
    return [json.loads(v)["id"] for v in letters.column("value").to_pylist()]


def main(url: str, ns: str, input_dir: str, checkpoint: str, mode: str, replays: str,
         target: str = "redis") -> None:  # fmt: skip
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("ftlayer-crash-driver")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    ft = FaultTolerance(
        FTConfig(namespace=ns, redis_url=url, timeout_s=3.0, max_replays=2), rotate=True
    )
    files = FileSource("json", input_dir, "id long, key long", maxFilesPerTrigger=1)
    reads: Any = files if replays == "reference" else None
    first: Any = lambda b: b  # noqa: E731
    if replays == "kafka":
        bootstrap, topic = input_dir[len("kafka://"):].split("/")
        reads = KafkaSource(bootstrap, [topic], startingOffsets="earliest",
                            maxOffsetsPerTrigger=400)  # fmt: skip
        first = parse_values
    pipeline = (
        # by reference nothing is retried at once: failures wait as stage rows
        ft.pipeline(source=0, reads=reads,
                    immediate_replays=0 if reads is not None else None)
        .map_batches(first, "id long, key long")
        .partition_by(["key"], 4)
        .map_batches(Stage2(url, ns), "id long, key long")
        .sink_batches(Sink(url, ns, hold=mode == "crash", target=target),
                      lineage="lineage_id" if target != "redis" else None)
    )
    if replays == "frames":
        pipeline = frames_pipeline(ft, files, url, ns, hold=mode == "crash", target=target)
    r = connect(url)

    def each_batch(df: Any, batch_id: int) -> None:
        r.set(f"{ns}:batch", batch_id)
        r.rpush(f"{ns}:batches", batch_id)
        pipeline(df, batch_id)

    if replays == "stream":
        stream = pipeline.with_replays(files.stream(spark))
    elif replays in ("reference", "frames", "kafka"):  # kept by reference, replay stream
        stream = pipeline.stream(spark)
    else:
        stream = files.stream(spark)
    query = (
        stream.writeStream.foreachBatch(each_batch).option("checkpointLocation", checkpoint).start()
    )
    query.processAllAvailable()  # mode crash: killed inside this
    if replays != "claim":  # the query runs the replays: wait, then stop
        assert ft.layer is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            st = ft.layer.stats()
            if st.pending + st.unsettled_segments == 0:
                break
            time.sleep(0.5)
        query.stop()
        drained = ft.drain(timeout_s=0)  # reports only: nothing to run
    else:
        drained = ft.drain(timeout_s=90, query=query)
    st = ft.layer.stats() if ft.layer else None
    print("RESULT " + json.dumps({
        "drained": drained.drained,
        "pending": drained.pending,
        "drain_batches": drained.batches,
        "dead_lettered": st.dead_letters if st else -1,
        "unsettled_segments": st.unsettled_segments if st else -1,
        "entered": sum(r.entered for r in ft.results),
        # dead letters' ids read back (by reference: the files hold them)
        "dead_ids": dead_ids(pipeline.dead_letters(spark)),
    }), flush=True)  # fmt: skip
    ft.close()
    spark.stop()


if __name__ == "__main__":
    main(*sys.argv[1:8])
