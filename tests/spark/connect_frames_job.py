"""DataFrame stages under Spark Connect: one run of connect_job.py (``"frames url ns"``,
on its Connect server), or alone::

    python connect_frames_job.py <redis_url> <namespace>

Two JSON files (600 events) streamed with ``trigger(availableNow=True)``: stage 1 parses
``amount`` with ``try_cast`` (ids with ``amount = "n/a"`` fail every attempt: dead letters),
a keyed shuffle, stage 2 marks ids = 7 (mod 40) failed on their fresh attempt only
(``failed`` is true only on fresh rows, whose identity has a location), a Python stage
failing ids = 1 (mod 10) the first time it sees them (given batches of 20 rows: its
task replays them at once, gathered), and a ``df.write.parquet`` sink; then a DataFrame
kept as copies (one Python pass stores them) with rows failing every time, drained.
Prints one JSON object: the ids written, the dead letters' ids and errors, what is
pending, the replays that entered at their stage (stage 2's failures, kept as its
input) and those read back (stage 1's: the first segment keeps nothing), and the Python
stage's calls: how many were replays at once (every row of the call seen before).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from ftlayer import FTConfig
from ftlayer.connection import connect
from ftlayer.history import read_batches
from ftlayer.spark import FaultTolerance, FileSource, Outcome

N = 600
ROWS_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"


def main() -> None:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.remote("local[2,4]")
             .config("spark.sql.shuffle.partitions", "4").getOrCreate())  # fmt: skip
    out = run(spark, sys.argv[1], sys.argv[2])
    spark.stop()
    print("RESULT " + json.dumps(out))


def run(spark: Any, url: str, ns: str) -> dict[str, Any]:
    """The run on the Redis at ``url``, namespace ``ns``: its RESULT."""
    from pyspark.sql import functions as F  # noqa: N812

    out: dict[str, Any] = {"connect": type(spark).__module__}
    ft = FaultTolerance(FTConfig(namespace=ns, redis_url=url, timeout_s=2, max_replays=1))
    tmp = tempfile.mkdtemp()
    for k in range(2):
        with open(os.path.join(tmp, f"part-{k}.json"), "w") as f:
            for i in range(k, N, 2):
                amount = "n/a" if i % 50 == 3 else f"{i}.5"
                f.write(json.dumps({"id": i, "key": i % 13, "amount": amount}) + "\n")
    files = FileSource("json", tmp, "id long, key long, amount string", maxFilesPerTrigger=1)
    dest = tempfile.mkdtemp() + "/out"
    before = spark.conf.get(ROWS_KEY, None)
    spark.conf.set(ROWS_KEY, "20")  # a task's rows in several input batches
    pipeline = (
        ft.pipeline(reads=files, name="connect-frames")
        .transform(lambda df: df.withColumn("amt", F.expr("try_cast(amount AS double)")),
                   failed="amt IS NULL", errors=F.concat(F.lit("bad amount "), F.col("amount")))
        .partition_by(["key"], 4)
        # a fresh row carries its file's location; a replay's is null: fails once (kept
        # as this segment's input: its replay enters here)
        .transform(lambda df: df, failed="id % 40 = 7 AND __ft_loc IS NOT NULL",
                   errors="first attempt fails")
        .map_batches(fails_first_time(url, ns), "id long, key long, amount string, amt double")
        .sink_dataframe(lambda df, _: df.write.mode("append").parquet(dest))
    )  # fmt: skip
    query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
             .option("checkpointLocation", tempfile.mkdtemp())
             .trigger(availableNow=True).start())  # fmt: skip
    query.awaitTermination(300)
    if before is None:
        spark.conf.unset(ROWS_KEY)
    else:
        spark.conf.set(ROWS_KEY, before)
    out["stream_exception"] = str(query.exception()) if query.exception() else None
    written = spark.read.parquet(dest).select("id").collect()
    letters = pipeline.dead_letters(spark)
    st = ft.layer.stats()  # type: ignore[union-attr]
    # the batches ran in the Connect server's Python process: their summaries in Redis
    batches = read_batches(ft.layer.client, ft.layer.keyspace, 0)  # type: ignore[union-attr]
    out.update(entered=sum(b.get("entered", 0) for b in batches),
               read_back=sum(b.get("read_back", 0) for b in batches))
    out.update(written=[r["id"] for r in written], pending=st.pending,
               dead=letters.column("id").to_pylist(), errors=letters.column("error").to_pylist(),
               columns=sorted(spark.read.parquet(dest).columns))  # fmt: skip
    r = connect(url)
    calls = [int(c) for c in r.lrange(f"{ns}:py-calls", 0, -1)]
    out["python_calls"], out["python_replay_calls"] = len(calls), sum(calls)
    out["python_failed_once"] = sorted(int(i) for i in r.smembers(f"{ns}:py-failed"))
    r.close()
    # a source that cannot be read again (a DataFrame): copies stored by one Python pass,
    # ids = 4 (mod 30) fail every time (replayed from their copies once, then dead letters)
    dest2 = tempfile.mkdtemp() + "/copies"
    copies = (ft.pipeline(source=1, name="connect-copies")
              .transform(lambda df: df, failed="id % 30 = 4", errors="never fits")
              .sink_dataframe(lambda df, _: df.write.mode("append").parquet(dest2)))  # fmt: skip
    first = ft.run_batch(copies, spark.range(300).selectExpr("id", "id % 5 AS key"), "c")
    drained = ft.drain(timeout_s=60, pipeline=copies)
    out["copies"] = {
        "fresh": first.fresh, "failed": first.failed, "drained": drained.drained,
        "written": sorted(r["id"] for r in spark.read.parquet(dest2).collect()),
        "dead": sorted(copies.dead_letters(spark).column("id").to_pylist()),
        "segments": ft.layer.stats().unsettled_segments,  # type: ignore[union-attr]
    }
    ft.close()
    return out


def fails_first_time(url: str, ns: str) -> Any:
    """A Python stage (run in the Connect server's workers) failing ids = 1 (mod 10) the
    first time it sees them; each call noted in Redis: 1 when every row of it was seen
    before (a replay at once), else 0."""
    import numpy as np

    def stage(b: Any) -> Any:
        ids = b.column("id").to_pylist()
        if not ids:
            return b
        r = connect(url)
        try:
            pipe = r.pipeline(transaction=False)
            for i in ids:
                pipe.sadd(f"{ns}:py-seen", i)
            new = pipe.execute()
            r.rpush(f"{ns}:py-calls", int(not any(new)))
            failed = np.array([bool(n) and i % 10 == 1 for i, n in zip(ids, new, strict=True)])
            if failed.any():
                r.sadd(f"{ns}:py-failed", *[i for i, f in zip(ids, failed, strict=True) if f])
        finally:
            r.close()
        return Outcome(b, failed=failed, errors="python stage fails the first time")

    stage.__name__ = "fails_first_time"
    return stage


if __name__ == "__main__":
    main()
