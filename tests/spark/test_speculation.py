"""The vectorized path under Spark speculation (``spark.speculation=true``): real Spark
standalone cluster (a master and two workers, each worker on a loopback address of its
own: Spark never launches a speculative copy on the host of the running attempt, so
``local[N]`` never speculates), real Redis, no mocks.

The job (speculation_job.py, its own process: this one holds a local[2] SparkContext) runs
once for the module. In each of its two batches the first attempt of a chosen task holds
until a speculative copy on the other host has won, then goes on to the end of its own
work, as a losing attempt does when Spark's kill comes too late: a source attempt that
ends after its batch settled (b0), one that ends before (b1), and a sink attempt that
writes its rows after its batch settled (b1). Rows fail in those tasks before the shuffle
and after it (each replayed at once, in the task that holds it). Each test below
checks one side of the outcome and names the product breaks it catches.
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
import redis

from ftlayer import EmbeddedRedis
from ftlayer.connection import connect
from ftlayer.spark.standalone import StandaloneCluster

pytestmark = [pytest.mark.spark, pytest.mark.slow]

N = 2000  # rows per batch (speculation_job.N): ids 0..2N-1 over b0 and b1
HOLDS = [("b0", "s1", 1), ("b1", "s1", 1), ("b1", "s2", 2)]  # (batch, stage, partition)
HOLD_CAP_S = 20  # a held attempt gives up after this long (then the tests fail)


@pytest.fixture(scope="module")
def spark_cluster() -> Iterator[StandaloneCluster]:
    """One standalone cluster for both runs (each its own application on it)."""
    with StandaloneCluster(workers=2, cores=1) as cluster:
        yield cluster


@pytest.fixture(scope="module", params=["single", "cluster"])
def run(
    request: pytest.FixtureRequest, redis_server: EmbeddedRedis, spark_cluster: StandaloneCluster
) -> Iterator[dict[str, Any]]:
    """The job's RESULT, with its records indexed (see speculation_job.py): its FT layer on
    one Redis, or on the 3-master Redis Cluster (the job's own records stay on the one)."""
    ns = f"spec{uuid.uuid4().hex[:8]}"
    job = Path(__file__).with_name("speculation_job.py")
    r = redis.Redis.from_url(redis_server.url)
    ft_url = (redis_server.url if request.param == "single"
              else request.getfixturevalue("redis_cluster").url)  # fmt: skip
    try:
        cluster = spark_cluster
        proc = subprocess.run(
            [sys.executable, str(job), cluster.url, redis_server.url, ns, str(HOLD_CAP_S),
             ft_url],
            capture_output=True, text=True, timeout=300, env=cluster.env(),
        )  # fmt: skip
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            pytest.fail(f"job failed ({proc.returncode}):\n{proc.stderr[-6000:]}\n"
                        + cluster.log_tails())  # fmt: skip
        out: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
        out["status"] = {t["tid"]: t for t in out["tasks"]}
        out["batch"] = {res["batch_id"]: res for res in out["results"]}
        yield out
    finally:
        for client in {r, connect(ft_url)}:
            for key in client.scan_iter(match=f"*{ns}*"):
                client.delete(key)
            client.close()


def events(out: dict[str, Any], ev: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in out["runs"] if e["ev"] == ev and all(e[k] == v for k, v in match.items())]


def won(out: dict[str, Any], tid: int) -> bool:
    """Spark's verdict on a task attempt: its output is the one that counted."""
    return bool(out["status"][tid]["status"] == "SUCCESS")


def test_speculative_copies_ran_and_won(run: dict[str, Any]) -> None:
    """Catches no product break by itself: it proves the run is what the other tests rely
    on (speculation on, copies on the other host, the slow originals losing and then
    ending their own work), so they cannot pass vacuously."""
    for phase, st, part in HOLDS:
        where = f"{phase} {st} partition {part}"
        held = events(run, "hold", phase=phase, st=st, part=part, att=0)
        seen = [e for e in run["runs"] if (e["phase"], e["st"], e["part"]) == (phase, st, part)]
        spark_tasks = [t for t in run["tasks"] if t["part"] == part]
        assert len(held) == 1, f"{where}: {json.dumps(seen)} {json.dumps(spark_tasks)}"
        orig = held[0]
        woke = events(run, "woke", tid=orig["tid"])
        assert woke and not woke[0]["capped"], f"{where}: held past its cap, {woke}"
        assert run["status"][orig["tid"]]["status"] == "KILLED", run["status"][orig["tid"]]
        stage = orig["stage"]  # Spark's stage id
        copies = [t for t in run["tasks"] if (t["stage"], t["part"]) == (stage, part)
                  and t["att"] >= 1]  # fmt: skip
        winner = [t for t in copies if t["speculative"] and t["status"] == "SUCCESS"]
        assert len(winner) == 1, (where, copies)
        assert winner[0]["host"] != orig["host"] == run["status"][orig["tid"]]["host"]
        ran = events(run, "start", tid=winner[0]["tid"], st=st)
        assert ran and ran[0]["att"] >= 1 and ran[0]["host"] == winner[0]["host"], ran
        # rows failed in the winning copy (before the shuffle, or after it)
        assert sum(e["n"] for e in events(run, "failed", tid=winner[0]["tid"], st=st)) > 0
    # the source attempt of b1 ended before b1 settled, the others after their batch
    b1_source = events(run, "woke", phase="b1", st="s1", part=1, att=0)[0]
    assert b1_source["t"] < run["settled"]["b1"]
    for phase, st, part in (("b0", "s1", 1), ("b1", "s2", 2)):
        late = events(run, "woke", phase=phase, st=st, part=part, att=0)[0]
        assert late["t"] > run["settled"][phase], (late, run["settled"])


def test_only_the_winning_attempt_of_each_task_counts(run: dict[str, Any]) -> None:
    """Catches: a losing attempt's summary counted with the winner's (fresh rows, written
    rows and failures counted twice; a fold that no longer sums to 0, so fold_ok=False and
    the whole batch replays), residues taken from the losing attempt instead of the winner,
    the winner's summary missing (its rows never settled), failures in a speculated task
    not replayed at once, or a losing attempt's immediate replays counted."""
    for res in run["results"]:
        assert res["fold_ok"], res
    for phase in ("b0", "b1"):
        res = run["batch"][phase]
        assert res["fresh"] == N, res
        for st, label in (("s1", "Stage1"), ("s2", "Stage2")):
            counted = [e for e in events(run, "failed", phase=phase, st=st) if won(run, e["tid"])]
            assert res["stage_failed"][label] == sum(e["n"] for e in counted), (phase, label)
        sunk = [e for e in events(run, "sink", phase=phase) if won(run, e["tid"])]
        assert res["written"] == sum(e["n"] for e in sunk), res
    # fresh rows only: each failed attempt replayed at once, at its stage (stage 2's past
    # the shuffle too), counted for the winning attempts only
    b0 = run["batch"]["b0"]
    s1, s2 = b0["stage_failed"]["Stage1"], b0["stage_failed"]["Stage2"]
    assert s1 > 0 and s2 > 0 and b0["immediate_replays"] == s1 + s2, b0
    assert b0["failed"] == 0, b0


def test_every_record_reaches_the_sink_and_nothing_stays_pending(run: dict[str, Any]) -> None:
    """Catches: records lost or completed early under speculation (an id that never
    reaches the sink), a losing attempt's residues replayed (a record written twice by
    winning attempts), a late attempt's segment indexed after its batch settled, or the
    segment of an attempt that lost before the settle not dropped (both time out and
    replay their rows: duplicates, pending, segments left), replays never completed
    (pending > 0), dead letters from speculation."""
    writes = [tuple(map(int, x.split(":"))) for x in run["sink"]]
    assert {i for i, _ in writes} == set(range(2 * N)), "lost records"
    by_winners = Counter(i for i, tid in writes if won(run, tid))
    assert set(by_winners) == set(range(2 * N))
    assert max(by_winners.values()) == 1, "a record written twice by attempts that counted"
    losers = Counter(run["status"][tid]["status"] for _, tid in writes if not won(run, tid))
    assert set(losers) == {"KILLED"} and losers["KILLED"] > 0, losers  # at-least-once
    assert run["drain"]["drained"] and run["drain"]["pending"] == 0, run["drain"]
    st = run["stats"]
    assert st["pending"] == st["queued_replays"] == st["unsettled_segments"] == 0, st
    assert st["dead_letters"] == 0 and st["completed"] == 2 * N, st
    assert st["failed_explicit"] == sum(r["immediate_replays"] + r["failed"]
                                        for r in run["results"])  # fmt: skip
    assert run["leftover"]["seg"] == [], run["leftover"]


def test_losing_attempts_leave_no_task_summaries(run: dict[str, Any]) -> None:
    """Catches: task summaries (``:sum:``) of attempts that did not count left in Redis
    after their batch settled (they are only deleted when they counted, and expire after
    SUMMARY_TTL_MS otherwise)."""
    left = "\n".join(json.dumps(s) for s in run["leftover_summaries"])
    assert run["leftover"]["sum"] == [], f"summaries of attempts that did not count:\n{left}"
