"""``kill -9`` of the driver of a streaming query in the middle of a batch, then a restart
on the same checkpoint.

The driver runs as its own process session (crash_driver_job.py): Python driver, its JVM
and PySpark's Python workers. The test kills every process of that session with SIGKILL
while batch 2's sink is inside its write (its rows written, nothing settled), then starts
the job again on the same checkpoint: Spark re-runs batch 2 under the same batch id, the
FT layer replaces the dead run's segments, replays what the dead run had claimed once it
times out, and at the end sink ∪ dead letters = source with nothing pending.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from deltalake import DeltaTable

from benchmarks._postgres import LocalPostgres
from ftlayer import EmbeddedRedis, FTConfig, FTLayer
from ftlayer.spark.kafka.broker import LocalKafka
from tests.faults import kill_session, session_pids
from tests.toolkit import until

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("crash_driver_job.py")
FILES, ROWS = 5, 400  # one file per batch; batch 2 is the one killed
ROOT = Path(__file__).resolve().parents[2]


def _start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(JOB), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its own session: kill_session reaches every child
        )


MODES = ["claim+postgres", "stream+delta", "reference+postgres", "frames+delta", "kafka+delta"]
"""Each mode with an idempotent sink: the same job and crash, checked against the Redis list
(what a sink without idempotency writes) and the table both."""


SIDE_BY_SIDE = 3
"""Scenarios run at once: each is two driver processes of its own (its own JVM, namespace,
checkpoint and table) that mostly wait -- for batch 2, for the kill, for a timeout -- so
they share the machine; the suite takes their time once, not eight times."""


@pytest.fixture(scope="module")
def runs(
    redis_server: EmbeddedRedis,
    postgres: LocalPostgres,
    kafka: LocalKafka,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Future[dict[str, Any]]]]:
    """Every mode's crash and restart, started side by side (SIDE_BY_SIDE at a time)."""
    pool = ThreadPoolExecutor(SIDE_BY_SIDE, thread_name_prefix="crash-driver")
    futures = {mode: pool.submit(_crash_and_restart, mode, redis_server, postgres, kafka,
                                 tmp_path_factory.mktemp("crash-driver"))
               for mode in MODES}  # fmt: skip
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(params=MODES)
def run(runs: dict[str, Future[dict[str, Any]]], request: pytest.FixtureRequest) -> dict[str, Any]:
    """One mode's outcome (its failure, if the scenario failed)."""
    return runs[request.param].result(timeout=900)


def _crash_and_restart(
    mode: str, redis_server: EmbeddedRedis, postgres: LocalPostgres, kafka: LocalKafka,
    tmp: Path,
) -> dict[str, Any]:  # fmt: skip
    """``claim``: batches claim their replays, drain() runs the last ones; ``stream``:
    replays ride the replay stream (batch 2 re-run reads the replays its offset claimed),
    and the job waits for nothing pending with its query running; ``reference``: the same
    with the files kept by reference (replays read back from them); ``frames``: that as
    DataFrame stages, killed inside the write of a ``sink_dataframe``; ``kafka``: the
    ``reference`` pipeline over a Kafka topic holding the same records. ``+delta`` /
    ``+postgres``: the sink also writes through ftlayer's idempotent sink into a Delta
    table / a PostgreSQL table, read back at the end."""
    replays, _, kind = mode.partition("+")
    target = "redis"
    if kind == "delta":
        target = f"delta:{tmp / 'delta'}"
    elif kind == "postgres":
        db = f"crash_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(postgres.url, autocommit=True) as c:
            c.execute(f"CREATE DATABASE {db}")
        target = f"postgres:{postgres.url.rsplit('/', 1)[0]}/{db}"
    ns = f"cd{uuid.uuid4().hex[:10]}"
    inputs = tmp / "in"
    inputs.mkdir()
    for f in range(FILES):
        rows = range(f * ROWS, (f + 1) * ROWS)
        text = "".join(json.dumps({"id": i, "key": i % 17}) + "\n" for i in rows)
        (inputs / f"part-{f:02d}.json").write_text(text)
    source = str(inputs)
    if replays == "kafka":  # the same records in a topic of 4 partitions
        kafka.create_topic(ns, 4)
        kafka.produce(ns, ((None, json.dumps({"id": i, "key": i % 17}).encode())
                           for i in range(FILES * ROWS)), partition_of=lambda i: i % 4)
        source = f"kafka://{kafka.bootstrap}/{ns}"
    args = [redis_server.url, ns, source, str(tmp / "checkpoint")]
    tail = [replays, target]
    r = redis_server.client()
    log = tmp / "job.log"
    first = _start([*args, "crash", *tail], log)

    def holding() -> bool:
        if r.exists(f"{ns}:holding"):
            return True
        assert first.poll() is None, f"the job ended before batch 2: {log.read_text()[-3000:]}"
        return False

    try:
        until(holding, "batch 2 to reach its sink", 240)
        time.sleep(0.5)  # the other sink tasks of batch 2 reach their hold too
        killed = kill_session(first.pid)
        first.wait(timeout=30)
        # the session's processes are gone, not just signalled
        until(lambda: not session_pids(first.pid),
              lambda: f"the killed driver's processes to exit: {session_pids(first.pid)}",
              10)  # fmt: skip
    finally:
        if first.poll() is None:
            kill_session(first.pid)
    sink_at_kill = len(r.lrange(f"{ns}:sink", 0, -1))
    second = _start([*args, "finish", *tail], log)
    try:
        second.wait(timeout=300)
    finally:
        if second.poll() is None:
            kill_session(second.pid)
    text = log.read_text()
    lines = [x for x in text.splitlines() if x.startswith("RESULT ")]
    assert second.returncode == 0 and lines, text[-4000:]
    layer = FTLayer(r, FTConfig(namespace=ns, timeout_s=3.0), create=False)
    result = json.loads(lines[-1][len("RESULT ") :])
    dead = result.pop("dead_ids")  # read back by the job (references hold no id)
    if replays not in ("reference", "frames", "kafka"):
        assert sorted(dead) == sorted(d.frame.decode()["id"]
                                      for d in layer.persistence.dead_letters() if d.frame)
    out = {
        **result,
        "killed": killed,
        "sink_at_kill": sink_at_kill,
        "sink": [int(x) for x in r.lrange(f"{ns}:sink", 0, -1)],
        "batches": [int(x) for x in r.lrange(f"{ns}:batches", 0, -1)],
        "dead": dead,
        "stats": layer.stats(),
        "replays": replays,
        "table": _table_ids(target),
    }
    layer.clear()
    for k in r.scan_iter(f"{ns}:*"):
        r.delete(k)
    return out


def _table_ids(target: str) -> list[int] | None:
    """The ids in the idempotent sink's table, one per row (None: no such sink)."""
    kind, _, where = target.partition(":")
    if kind == "delta":
        return DeltaTable(where).to_pyarrow_table().column("id").to_pylist()
    if kind == "postgres":
        with psycopg.connect(where) as c:
            return [row[0] for row in c.execute("SELECT id FROM events")]
    return None


def test_the_driver_died_mid_batch_and_spark_reran_that_batch(run: dict[str, Any]) -> None:
    assert run["killed"] >= 3, "the driver, its JVM and Python workers were killed"
    assert run["sink_at_kill"] > 0, "batch 2 had written rows when the driver died"
    assert Counter(run["batches"])[2] == 2, "the restart re-ran batch 2 under its own id"
    if run["replays"] == "claim":
        assert sorted(set(run["batches"])) == list(range(FILES))
    else:  # the replay stream may add batches of replays only
        assert set(range(FILES)) <= set(run["batches"])


def test_sink_and_dead_letters_hold_every_source_record(run: dict[str, Any]) -> None:
    source = set(range(FILES * ROWS))
    sink, dead = set(run["sink"]), set(run["dead"])
    assert sink | dead == source, f"lost: {sorted(source - sink - dead)[:20]}"
    assert dead == {i for i in source if i % 61 == 7}, "only the always-failing ids"
    assert not sink & dead


def test_rewritten_records_are_in_the_idempotent_sink_once(run: dict[str, Any]) -> None:
    """The sink wrote some records twice (the killed batch's rows, written again by its
    re-run: at least once). Into Delta / PostgreSQL through ftlayer's idempotent sinks
    (``+delta``, ``+postgres``) the table holds the source minus the dead letters, each
    record once. Catches: a re-run batch or a replay given new lineage ids (duplicates),
    a row skipped that was never written (loss)."""
    written = Counter(run["sink"])
    assert any(n > 1 for n in written.values()), "the sink never wrote a record twice"
    if run["table"] is None:
        return
    table = Counter(run["table"])
    want = set(range(FILES * ROWS)) - set(run["dead"])
    assert set(table) == want, f"lost: {sorted(want - set(table))[:20]}"
    dups = {i: n for i, n in table.items() if n > 1}
    assert not dups, f"duplicates in the table: {len(dups)}, e.g. {sorted(dups)[:10]}"


def test_replays_in_flight_across_the_crash_resumed_at_their_stage(run: dict[str, Any]) -> None:
    """By reference (``reference``, ``frames``) the rows failing in stage 2 are kept as
    its input and the restarted driver's replays enter there. Catches: stage rows lost or
    left unreadable by a crash (the sink test above), or never entered after a restart."""
    if run["replays"] in ("reference", "frames", "kafka"):
        assert run["entered"] > 0, run


def test_nothing_is_pending_after_the_drain(run: dict[str, Any]) -> None:
    assert run["drained"] and run["pending"] == 0 and run["unsettled_segments"] == 0
    st = run["stats"]
    assert st.pending == 0 and st.queued_replays == 0 and st.unsettled_segments == 0
    assert st.dead_letters == len(run["dead"])


def test_each_poison_record_is_one_dead_letter(run: dict[str, Any]) -> None:
    """The re-run batch 2 dead-letters again the poison records that the killed run had
    dead-lettered already: each keeps one entry (its history grown), so the dead letters,
    the held count and the count of records ever dead-lettered equal the poison records.
    Catches: dead letters keyed by the attempt's id instead of the record's lineage."""
    poison = {i for i in range(FILES * ROWS) if i % 61 == 7}
    assert sorted(run["dead"]) == sorted(poison), "one dead letter per poison record"
    st = run["stats"]
    assert st.dead_letters == len(poison) and st.dead_lettered == len(poison), st
