"""A vectorized pipeline under Spark Connect, run as its own process by test_connect.py
(``SparkSession.builder.remote("local[2,4]")`` starts a Connect server in this process's JVM,
which the test process already gives to its classic session).

    python connect_job.py <redis_url> <namespace>

Every failure kind at once: explicit failures (the replay queue), a row that makes a batch
function raise (bisection), unconfirmed sink writes (timeouts), a task after the shuffle
killed with ``os._exit`` (Spark's retry), row stages with immediate replays. Prints one JSON
object: what the sink received, the counts, the drain, the error of an ``ack_scope="task"``
pipeline.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ftlayer import ConfigError, FailRecord, FTConfig
from ftlayer.connection import connect
from ftlayer.spark import FaultTolerance, FileSource, Outcome

N_DIRECT, N_STREAM, N_ROWS = 3000, 2000, 300


class FailOnce:
    """Fails ids divisible by 40 on their first attempt (remembered in Redis)."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        r = connect(self.url)
        cand = np.flatnonzero(ids % 40 == 0)
        with r.pipeline(transaction=False) as p:
            for i in cand:
                p.sadd(self.key, int(ids[i]))
            first = p.execute()
        failed = [int(i) for i, new in zip(cand, first, strict=True) if new]
        out = pa.RecordBatch.from_arrays(
            [b.column("id"), pc.bit_wise_and(b.column("id"), 7)], names=["id", "key"]
        )
        return Outcome(out, failed=failed, errors="first attempt fails")


class RaiseOnce:
    """After the shuffle: the first task to get here dies (``os._exit``: Spark retries
    it). Raises while its batch holds an id = 17 (mod 250) that has not
    raised yet; the call that holds it alone (bisection isolated it) marks it, so its
    replay passes."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def __call__(self, b: pa.RecordBatch) -> pa.RecordBatch:
        r = connect(self.url)
        if r.set(f"{self.key}:crashed", 1, nx=True):
            os._exit(1)  # the first post-shuffle task dies before it did anything
        ids = [i for i in b.column("id").to_pylist() if i % 250 == 17]
        fresh = [i for i in ids if not r.sismember(self.key, i)]
        if fresh:
            if b.num_rows == 1:
                r.sadd(self.key, fresh[0])
            raise ValueError(f"poison row {fresh[0]}")
        return b


class Sink:
    """Ids = 51 (mod 100) are not confirmed on their first write (they time out, replay)."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        r = connect(self.url)
        ids = b.column("id").to_pylist()
        unconfirmed = [j for j, i in enumerate(ids) if i % 100 == 51
                       and r.sadd(f"{self.key}:unc", i)]  # fmt: skip
        skip = set(unconfirmed)
        written = [i for j, i in enumerate(ids) if j not in skip]
        if written:
            r.rpush(self.key, *written)
        return Outcome(unconfirmed=unconfirmed)


class RowFailOnce:
    """A row stage failing ids divisible by 7 on their first attempt."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def __call__(self, r: dict[str, Any]) -> dict[str, Any]:
        if r["id"] % 7 == 0 and connect(self.url).sadd(self.key, r["id"]):
            raise FailRecord("first attempt fails")
        return {"id": r["id"], "key": r["id"] % 5}


class RowSink:
    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def __call__(self, r: dict[str, Any]) -> None:
        connect(self.url).rpush(self.key, r["id"])


def main() -> None:
    """Argv: one argument a run, ``"url ns [keyed]"``, ``"kafka url ns bootstrap topic"``
    (connect_kafka_job.py) or ``"frames url ns"`` (connect_frames_job.py) -- in turn on
    one Connect server (started once: its JVM start is most of a run's time), one RESULT
    line each."""
    import connect_frames_job  # this script's directory is on sys.path
    import connect_kafka_job
    from pyspark import cloudpickle
    from pyspark.sql import SparkSession

    # their classes go to the server's Python processes by value, as this script's do
    # (no such modules there)
    cloudpickle.register_pickle_by_value(connect_kafka_job)
    cloudpickle.register_pickle_by_value(connect_frames_job)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # local[2,4]: Spark retries a failed task up to 4 times (local[2] fails the job)
    spark = (SparkSession.builder.remote("local[2,4]")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())  # fmt: skip
    for spec in sys.argv[1:]:
        words = spec.split()
        if words[0] == "kafka":
            out = connect_kafka_job.run(spark, *words[1:5])
        elif words[0] == "frames":
            out = connect_frames_job.run(spark, *words[1:3])
        else:
            out = run(spark, words[0], words[1], words[2:] == ["keyed"])
        print("RESULT " + json.dumps(out), flush=True)
    spark.stop()


def run(spark: Any, url: str, ns: str, keyed: bool) -> dict[str, Any]:
    """One run: on the Redis at ``url``; ``keyed``: ``record_key="id"``, no __ft_src."""
    record_key = "id" if keyed else None
    out: dict[str, Any] = {"connect": type(spark).__module__}
    ft = FaultTolerance(FTConfig(namespace=ns, redis_url=url, timeout_s=2, max_replays=3))
    tmp = tempfile.mkdtemp()
    # the streamed files are kept by reference (the direct batch's rows, copied, share the
    # source: their replays are copies, the stream's are read back from the files)
    files = FileSource("json", tmp, "id long", maxFilesPerTrigger=1)
    # immediate_replays=0: failures take the replay queue (claimed replays under Connect)
    pipeline = (ft.pipeline(source=0, immediate_replays=0, record_key=record_key, reads=files)
                .map_batches(FailOnce(url, f"{ns}:seen"), "id long, key long")
                .partition_by(["key"], 4)
                .map_batches(RaiseOnce(url, f"{ns}:raised"), "id long, key long")
                .sink_batches(Sink(url, f"{ns}:sink")))  # fmt: skip
    direct = ft.run_batch(pipeline, spark.range(N_DIRECT).select("id"), "direct")
    out["direct"] = {"fresh": direct.fresh, "failed": direct.failed, "fold_ok": direct.fold_ok,
                     "unconfirmed": direct.unconfirmed, "errors": direct.errors}  # fmt: skip
    # row stages run on the same machinery (no df.rdd): a failing map, a shuffle, a sink
    rows = (
        ft.pipeline(source=1)
        .map(RowFailOnce(url, f"{ns}:rowseen"))
        .partition_by(["key"], 3, types=["bigint"])
        .sink(RowSink(url, f"{ns}:rowsink"))
    )
    res = ft.run_batch(rows, spark.range(N_ROWS).select("id"), "rows")  # fmt: skip
    out["rows"] = {
        "fresh": res.fresh,
        "immediate_replays": res.immediate_replays,
        "failed": res.failed,
        "sink": sorted(int(x) for x in connect(url).lrange(f"{ns}:rowsink", 0, -1)),
    }
    try:
        task = ft.pipeline(source=2, ack_scope="task").map(lambda r: r).sink(lambda r: None)
        ft.run_batch(task, spark.range(3).select("id"), 0)
    except ConfigError as e:
        out["row_error"] = str(e)
    rows = [{"id": i} for i in range(N_DIRECT, N_DIRECT + N_STREAM)]
    for k in range(4):  # four files: four micro-batches
        with open(os.path.join(tmp, f"part-{k}.json"), "w") as f:
            f.write("\n".join(json.dumps(r) for r in rows[k::4]) + "\n")
    # the files' stream with the replay stream: queued replays ride micro-batches of their
    # own, and availableNow ends the query only when nothing of source 0 is pending
    query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
             .option("checkpointLocation", tempfile.mkdtemp())
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(300)
    out["stream_exception"] = str(query.exception()) if query.exception() else None
    out["pending_after_stream"] = ft.layer.stats().pending  # type: ignore[union-attr]
    report = ft.drain(timeout_s=120, pipeline=pipeline)
    out["drain_batches"] = report.batches
    st = ft.layer.stats()  # type: ignore[union-attr]
    sink = [int(x) for x in connect(url).lrange(f"{ns}:sink", 0, -1)]
    out.update(drained=report.drained, pending=st.pending, dead_letters=st.dead_letters,
               failed_explicit=st.failed_explicit, failed_timeout=st.failed_timeout,
               sink=sink, crashed=bool(connect(url).get(f"{ns}:raised:crashed")))  # fmt: skip
    ft.close()
    return out


if __name__ == "__main__":
    main()
