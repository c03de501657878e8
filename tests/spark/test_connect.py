"""The vectorized path under Spark Connect (``.remote("local[2,4]")``): DataFrame APIs
only, no ``df.rdd``; the ``foreachBatch`` function runs in a Python process of the server,
where the pickled FaultTolerance rebuilds itself from its config. Run in a subprocess (see
connect_job.py): explicit failures, bisection, unconfirmed writes, a killed task and row
stages, on one Redis and on the 3-master cluster. Breaks it catches: a driver step that
needs the JVM or ``df.rdd`` (``StructType.fromDDL``, ``spark.sparkContext``), a
FaultTolerance that cannot be pickled, replays that never complete under Connect.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftlayer.connection import connect

# the Connect server binds Spark's fixed port 15002: one test at a time, in one worker
# (with ``--dist loadgroup``)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("spark-connect")]


BACKENDS = ("single", "cluster", "keyed")


@pytest.fixture(scope="module")
def connect_runs(request: pytest.FixtureRequest,
                 kafka: Any) -> Iterator[dict[str, tuple[str, str, Any]]]:  # fmt: skip
    """connect_job.py's run on each backend, the Kafka run (connect_kafka_job.py) and the
    DataFrame stages' run (connect_frames_job.py), all on one Connect server (its start is
    most of a run's time): run -> (Redis URL, namespace, RESULT)."""
    specs, args = {}, []
    for backend in BACKENDS:
        fixture = "redis_cluster" if backend == "cluster" else "redis_server"
        url = request.getfixturevalue(fixture).url
        specs[backend] = (url, f"connect{uuid.uuid4().hex[:8]}")
        args.append(f"{url} {specs[backend][1]}{' keyed' if backend == 'keyed' else ''}")
    topic = f"cev-{uuid.uuid4().hex[:8]}"
    kafka.create_topic(topic, 4)
    kafka.produce(topic, ((None, json.dumps({"id": i, "key": i % 13}).encode())
                          for i in range(800)), partition_of=lambda i: i % 4)  # fmt: skip
    url = request.getfixturevalue("redis_server").url
    specs["kafka"] = (url, f"connectkafka{uuid.uuid4().hex[:8]}")
    args.append(f"kafka {url} {specs['kafka'][1]} {kafka.bootstrap} {topic}")
    specs["frames"] = (url, f"connectdf{uuid.uuid4().hex[:8]}")
    args.append(f"frames {url} {specs['frames'][1]}")
    job = Path(__file__).with_name("connect_job.py")
    proc = subprocess.run([sys.executable, str(job), *args], capture_output=True, text=True,
                          timeout=900)  # fmt: skip
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    assert proc.returncode == 0 and len(lines) == len(specs), proc.stderr[-4000:]
    results = [json.loads(x[len("RESULT ") :]) for x in lines]
    yield {b: (*specs[b], out) for b, out in zip(specs, results, strict=True)}
    for url, ns in specs.values():
        r = connect(url)
        for key in r.scan_iter(match=f"*{ns}*"):
            r.delete(key)
        r.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_failure_kind_under_spark_connect(
    backend: str, connect_runs: dict[str, tuple[str, str, Any]]
) -> None:
    """On one Redis and on the 3-master cluster (keys of one script call in one slot, the
    settle and claim calls per shard), and (keyed) with ``record_key="id"``: failures past
    the shuffle found by their key."""
    url, ns, out = connect_runs[backend]
    r = connect(url)
    try:
        assert out["connect"].startswith("pyspark.sql.connect"), out["connect"]
        direct = out["direct"]  # 75 explicit failures, 12 rows isolated by bisection
        assert (direct["fresh"], direct["failed"], direct["fold_ok"]) == (3000, 87, True)
        assert direct["unconfirmed"] == 30 and out["crashed"]
        assert any("ValueError: poison row" in e for e in direct["errors"]), direct["errors"]
        rows = out["rows"]  # row stages under Connect; ack_scope="task" is a clear error
        assert rows["sink"] == list(range(300)), rows
        assert (rows["fresh"], rows["immediate_replays"], rows["failed"]) == (300, 43, 0)
        assert "Spark Connect" in out["row_error"]
        assert out["stream_exception"] is None
        # the replay stream ran every replay (the direct batch's too) before the
        # availableNow query ended: drain() had nothing left to run
        assert out["pending_after_stream"] == 0 and out["drain_batches"] == 0, out
        sink = Counter(out["sink"])
        # every record of the direct batch and of the four streamed micro-batches (which
        # ran in the server's Python process) arrived exactly once, replays included
        assert set(sink) == set(range(5000)), sorted(set(range(5000)) - set(sink))[:10]
        assert max(sink.values()) == 1
        # explicit + bisected + row stages' immediate replays; unconfirmed ones time out
        assert out["failed_explicit"] == 5000 // 40 + 5000 // 250 + 43
        assert out["failed_timeout"] == 5000 // 100
        assert out["drained"] and out["pending"] == 0 and out["dead_letters"] == 0
        assert not list(r.scan_iter(match=f"ft:{{{ns}:*:seg:*"))
    finally:
        r.close()


def test_dataframe_stages_under_spark_connect(
    connect_runs: dict[str, tuple[str, str, Any]]
) -> None:
    """DataFrame stages and a ``df.write.parquet`` sink under Spark Connect (the batch
    function runs in the server's Python process: Connect DataFrames and Observations):
    rows failing once land after their replay, rows failing every time are dead letters
    with their error, each written row once, ftlayer's columns not in the output; a
    Python stage among them replays its failed rows at once, gathered in its task.
    Catches: observations read the classic way (blocking for ever, or empty), identity
    checks that need the JVM, replays that never run under Connect, a Python stage's
    failed rows answered without their identity or replayed per input batch."""
    out = connect_runs["frames"][2]
    assert out["connect"].startswith("pyspark.sql.connect"), out["connect"]
    assert out["stream_exception"] is None, out["stream_exception"]
    bad = {i for i in range(600) if i % 50 == 3}
    written = Counter(out["written"])
    assert set(written) == set(range(600)) - bad and max(written.values()) == 1, out
    assert sorted(out["dead"]) == sorted(bad) and out["pending"] == 0
    assert all("bad amount n/a" in e for e in out["errors"]), out["errors"]
    assert out["columns"] == ["amount", "amt", "id", "key"]
    # stage 2's failures were kept as its input (to_json in the observation, from_json
    # when they entered); stage 1's replayed from their files
    fail_once = {i for i in range(600) if i % 40 == 7} - bad
    assert out["entered"] == len(fail_once) and out["read_back"] >= len(bad), out
    # the Python stage's failures (answered as rows under Connect) were replayed at once
    # in their task, gathered: at most one replay call a task (2 micro-batches of fresh
    # rows x 4 partitions), where a replay per input batch of 20 rows made 14
    assert out["python_failed_once"] == [i for i in range(600) if i % 10 == 1], out
    assert 1 <= out["python_replay_calls"] <= 8, out
    copies, never = out["copies"], [i for i in range(300) if i % 30 == 4]
    assert (copies["fresh"], copies["failed"], copies["drained"]) == (300, 10, True), copies
    assert copies["written"] == [i for i in range(300) if i % 30 != 4], copies
    assert copies["dead"] == never and copies["segments"] == 0


def test_kafka_kept_by_reference_under_spark_connect(
    connect_runs: dict[str, tuple[str, str, Any]]
) -> None:
    """A KafkaSource pipeline under Spark Connect: ftlayer's Kafka source registered
    through the Connect session, rows failing once in a Python stage replayed by reading
    their offsets back (in the server's Python process), each record written once, nothing
    pending. Catches: a data source registered the classic way only, references read back
    through the JVM, replays that never run under Connect."""
    out = connect_runs["kafka"][2]
    assert out["connect"].startswith("pyspark.sql.connect"), out["connect"]
    assert out["stream_exception"] is None, out["stream_exception"]
    written = Counter(out["written"])
    assert set(written) == set(range(800)) and max(written.values()) == 1, out
    assert out["read_back"] == 40 and out["pending"] == 0, out
