"""Tiny runs of every benchmark, so they keep working. No speed or memory figure is
asserted; only that the runs complete and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ftlayer.embedded import EmbeddedCluster

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path: Path, module: str, *args: str, saved_as: str | None = None,
           timeout: float = 300, kept: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """Run ``module`` with ``--json``; its result, checked against the file it saved
    (``saved_as``, default ``<module>.json``): the file holds the result, and besides it
    only the ``kept`` keys (figures of other runs the file aggregates)."""
    env = {**os.environ, "FTLAYER_BENCH_RESULTS": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", module, *args, "--json"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    saved = json.loads((tmp_path / (saved_as or f"{module.rsplit('.', 1)[1]}.json")).read_text())
    assert {k: saved[k] for k in result if k in saved} == result
    assert set(saved) - set(result) <= set(kept), set(saved) - set(result)
    return result


_DF = ("ratio_df_ft_on_vs_dataframe", "ratio_df_ft_on_failing_vs_dataframe",
       "ratio_df_parquet_vs_plain")
STALE = {"ratio_df_ft_on_vs_dataframe": 9.0, "dataframe_stages": {"7": dict.fromkeys(_DF, 9.0)},
         "wide_events": {"7": {"ratio_ft_on_vs_arrow": 9.0}}, "stale_figure": 9.0}
"""A planted pipeline_overhead.json: figures no run in the test measured."""


def test_flush_cost_smoke(tmp_path: Path) -> None:
    r = _bench(tmp_path, "benchmarks.flush_cost", "--xors", "300", "--repeat", "2")
    assert r["xors"] == 300 and r["redis_server_ms"] > 0 and r["ceiling_hset_pipeline_ms"] > 0


def test_claim_smoke(tmp_path: Path) -> None:
    r = _bench(tmp_path, "benchmarks.claim", "--records", "3000", "--limit", "500")
    assert r["records"] == 3000 and r["claim_calls"] == 7 and r["claim_records_per_s"] > 0
    assert r["ceiling_lpop_records_per_s"] > 0 and r["goal_claim_records_per_s"] == 250_000
    assert r["expiry_redis_usec_per_record"] > 0


def test_only_record_writes_the_figures_of_record(tmp_path: Path) -> None:
    """A plain run writes no results file, in benchmarks/results or its working directory;
    ``--results DIR`` writes to DIR only."""
    record = ROOT / "benchmarks" / "results"
    elsewhere, cwd = tmp_path / "elsewhere", tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "FTLAYER_BENCH_RESULTS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    before = {p.name: p.stat().st_mtime_ns for p in record.glob("claim*")}
    run = [sys.executable, "-m", "benchmarks.claim", "--records", "1000", "--json"]
    for extra in ([], ["--results", str(elsewhere)]):
        out = subprocess.run([*run, *extra], cwd=cwd, env=env, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
        assert json.loads(out.stdout.strip().splitlines()[-1])["records"] == 1000
    assert {p.name: p.stat().st_mtime_ns for p in record.glob("claim*")} == before
    assert list(cwd.iterdir()) == []
    assert [p.name for p in elsewhere.iterdir()] == ["claim.json"]


def test_rotation_smoke(tmp_path: Path) -> None:
    r = _bench(tmp_path, "benchmarks.rotation", "--records", "2000", "--timeout-s", "1",
               "--buckets", "3")  # fmt: skip
    assert r["records"] == 2000 and r["expiry_rotations"] >= 1 and r["sidecar_rss_mb_peak"] > 0


@pytest.mark.slow
def test_pipeline_overhead_smoke(tmp_path: Path) -> None:
    """A narrow run prints only what it measured: the figures other runs merged into
    pipeline_overhead.json (planted: STALE) stay in the file (KEPT), never in its output."""
    (tmp_path / "pipeline_overhead.json").write_text(json.dumps(STALE))
    kept = ("ratio_df_ft_on_vs_dataframe", "dataframe_stages", "wide_events")
    r = _bench(tmp_path, "benchmarks.pipeline_overhead", "--records", "2000", "--repeat", "1",
               "--warmup", "0", "--scale", "1000", kept=kept)  # fmt: skip
    assert not set(STALE) & set(r), set(STALE) & set(r)
    saved = json.loads((tmp_path / "pipeline_overhead.json").read_text())
    assert {k: saved[k] for k in kept} == {k: STALE[k] for k in kept}
    rates = r["records_per_s"]
    assert r["records"] == 2000 and r["warmup"] == 0  # warm-ups: tests/test_paired_rounds.py
    assert set(rates) == {"dataframe", "arrow", "pandas", "rdd", "ft_off", "ft_on",
                          "ft_on_failing", "ft_on_failing_late", "row_ft_on",
                          "row_task_ft_on", "arrow_idcol", "ft_on_keyed",
                          "ft_on_keyed_failing"}  # fmt: skip
    assert all(v > 0 for v in rates.values())
    assert r["ratio_row_ft_on_vs_rdd"] > 0
    for k in ("ratio_ft_on_vs_arrow", "ratio_ft_on_failing_vs_arrow", "ratio_ft_off_vs_arrow",
              "ratio_ft_on_failing_late_vs_arrow", "ratio_arrow_idcol_vs_arrow",
              "ratio_ft_on_keyed_vs_arrow", "ratio_ft_on_keyed_failing_vs_arrow"):  # fmt: skip
        assert r[k] > 0, k
    assert r["redis_calls_per_batch"] > 0 and 0 < r["redis_calls_per_record"] < 1
    assert set(r["scaling_records_per_s"]["1000"]) == {"arrow", "ft_on"}
    assert (tmp_path / "pipeline_overhead.png").exists()


@pytest.mark.slow
def test_pipeline_overhead_wide_smoke(tmp_path: Path) -> None:
    """Wide events from files kept by reference, the streaming rounds and the replay
    latency on a quiet stream (benchmarks._wide), tiny."""
    env = {**os.environ, "FTLAYER_BENCH_RESULTS": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "benchmarks.pipeline_overhead", "--records",
                          "3000", "--repeat", "1", "--warmup", "0", "--payload-bytes", "200",
                          "--stream-batches", "2", "--stream-rounds", "1", "--latency",
                          "--json"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert json.loads((tmp_path / "pipeline_overhead_wide_200.json").read_text()) == r
    assert set(r["records_per_s"]) == {"dataframe", "arrow", "ft_off", "ft_on", "ft_on_copy",
                                       "ft_on_failing", "ft_on_failing_late"}  # fmt: skip
    assert all(v > 0 for v in r["records_per_s"].values())
    for k in ("ft_on", "ft_on_copy", "ft_on_failing", "ft_on_failing_late", "ft_off"):
        assert r[f"ratio_{k}_vs_arrow"] > 0, k
    sent = r["redis_bytes_per_record"]
    assert 0 < sent["ft_on"] < sent["ft_on_copy"], sent  # references, not rows
    assert r["source_bytes"] > 3000 * 200 and r["redis_peak_bytes"]["ft_on"] >= 0
    assert r["ratio_stream_failing_late_vs_arrow"] > 0 and r["stream_batches"] == 2
    lat = r["replay_latency_s"]
    assert lat["replayed"] == 2000 // 20 + 2000 // 50 and 0 < lat["p50"] <= lat["p99"]


@pytest.mark.slow
def test_dataframe_overhead_smoke(tmp_path: Path) -> None:
    """DataFrame stages beside plain DataFrame code (benchmarks.dataframe_overhead), tiny;
    its figures merged into pipeline_overhead.json (planted: STALE) and not the reverse."""
    (tmp_path / "pipeline_overhead.json").write_text(json.dumps(STALE))
    r = _bench(tmp_path, "benchmarks.dataframe_overhead", "--records", "3000", "--repeat", "1",
               "--warmup", "0", "--payload-bytes", "100", saved_as="dataframe_overhead_100.json",
               timeout=600)  # fmt: skip
    assert set(r["records_per_s"]) == {"dataframe", "parquet", "df_ft_on", "df_ft_on_failing",
                                       "df_ft_on_failing_late", "df_parquet"}  # fmt: skip
    assert all(v > 0 for v in r["records_per_s"].values())
    for k in ("ratio_df_ft_on_vs_dataframe", "ratio_df_ft_on_failing_vs_dataframe",
              "ratio_df_ft_on_failing_late_vs_dataframe", "ratio_df_parquet_vs_plain"):  # fmt: skip
        assert r[k] > 0, k
    # failing before the shuffle reads its rows back from the files, once (a replay failing
    # there again is kept, and enters there); after it, they enter at their stage and no
    # file is read again
    assert r["failing_replays"]["read_back"] > r["failing_replays"]["entered"] >= 0
    assert r["failing_late_replays"]["entered"] > 0 == r["failing_late_replays"]["read_back"]
    assert r["redis_bytes_per_record"] > 0 and r["records"] == 3000
    assert not {"dataframe_stages", "wide_events", "stale_figure"} & set(r)
    merged = json.loads((tmp_path / "pipeline_overhead.json").read_text())  # where goals are read
    assert merged["dataframe_stages"]["100"]["ratio_df_parquet_vs_plain"] == r[
        "ratio_df_parquet_vs_plain"] == merged["ratio_df_parquet_vs_plain"]
    assert merged["dataframe_stages"]["7"] == STALE["dataframe_stages"]["7"]


@pytest.mark.slow
def test_sink_overhead_smoke(tmp_path: Path) -> None:
    """Idempotent sinks beside plain writes (benchmarks.sink_overhead), tiny: a real
    PostgreSQL and real Delta tables. Appends add every row; the re-run batches merge into
    tables holding their keys (1x and 10x the batch) and add none: the row counts the run
    checked after every run are exact, and no Delta merge run appended."""
    r = _bench(tmp_path, "benchmarks.sink_overhead", "--records", "2000", "--repeat", "1",
               "--warmup", "0", "--payload-bytes", "100", timeout=600)  # fmt: skip
    variants = {f"{s}_{c}" for s in ("delta", "pg") for c in ("append", "merge", "merge_10x")}
    assert set(r["records_per_s"]) == variants | {f"plain_{v}" for v in variants}
    assert all(v > 0 for v in r["records_per_s"].values())
    assert all(r[f"ratio_{v}_vs_plain"] > 0 for v in variants)
    n, rows = 2000, r["table_rows_at_end"]
    for v in variants:
        expected = n if v.endswith("append") else n * (10 if v.endswith("10x") else 1)
        assert rows[v] == rows[f"plain_{v}"] == expected, (v, rows)
    assert r["rows_checked_runs"] == 12
    ops = r["delta_commit_operations"]
    assert ops["delta_append"] == ops["plain_delta_append"] == ["WRITE"]
    assert not any("WRITE" in v for k, v in ops.items() if "merge" in k), ops


@pytest.mark.slow
def test_stream_overhead_smoke(tmp_path: Path) -> None:
    """The streaming yardstick (benchmarks.stream_overhead), tiny: both pipelines, plain and
    through ftlayer, at two cadences, 5 % failing after the shuffle; every run's output was
    checked (every event id once, in the table or the dead letters), the failing runs of
    DataFrame stages took replay micro-batches (those of Python stages none: their failed
    rows are replayed at once, in their task), the cost per query was measured and the
    per-batch / per-record costs were fitted."""
    r = _bench(tmp_path, "benchmarks.stream_overhead", "--cadences", "200x2,400x2",
               "--repeat", "1", "--warmup", "0", "--payload-bytes", "100",
               "--source-pairs", "1", timeout=900)  # fmt: skip
    assert set(r["cadences"]) == {"200x2", "400x2"}
    assert r["stage_input_arrow_bytes"] == 36  # id, key, total: 8 B each; "region-k": 8 + 4
    for cad in r["cadences"].values():
        for p in ("df", "arrow"):
            f = cad[p]
            assert f["plain_micro_batches"] == cad["batches"]
            assert f["ft_on_micro_batches"] >= cad["batches"]
            if p == "df":  # a DataFrame stage's failures ride replay micro-batches,
                assert f["ft_on_failing_micro_batches"] > cad["batches"]
                # the last input micro-batch's among them after the input ended
                assert f["ft_on_failing_tail_micro_batches"] >= 1
                assert f["ft_on_failing_tail_s"] > 0
            else:  # a Python stage's are replayed at once, in their task
                assert f["ft_on_failing_micro_batches"] == cad["batches"]
                assert f["ft_on_failing_tail_micro_batches"] == 0
            assert f["plain_tail_micro_batches"] == f["ft_on_tail_micro_batches"] == 0
            ran = ("ft_on", "ft_on_marked", "ft_on_failing") if p == "df" else \
                ("ft_on", "ft_on_failing")  # a DataFrame stage whose failed= marks no row
            for v in ran:
                assert f[f"ratio_stream_{p}_{v}_vs_plain"] > 0
                assert f[f"{v}_s_per_batch"] > 0
            assert "ratio_stream_arrow_ft_on_marked_vs_plain" not in f
            if p == "df":  # it marks no row: no replay, nothing after the input
                assert f["ft_on_marked_micro_batches"] == cad["batches"]
                assert f["ft_on_marked_tail_micro_batches"] == 0
            for v in ("plain", "ft_on", "ft_on_failing"):  # part of the cost per query
                assert isinstance(f[f"{v}_first_batch_excess_s"], float)
            assert f["ft_on_redis_bytes_per_record"] > 0  # at 200 events: mostly scripts
            # at this size, a few failures among scripts and polls: measured, not judged;
            # those of Python stages are retried in their task (too few reach Redis)
            assert f["ft_on_failing_failures"] >= 0
            if p == "df":
                assert isinstance(f["ft_on_failing_redis_bytes_per_failure"], float)
    assert set(r["fit"]) == {"df", "arrow"}
    for p, f in r["fit"].items():
        assert set(f) == {"ft_s_per_query", "ft_ms_per_batch", "ft_us_per_record"}
        # the replay stream's Python reader starts per query, outside the micro-batches
        # (the first micro-batch's excess, also in ft_s_per_query, is noise at 2 of them)
        outside = [c[p]["ft_on_outside_batches_s"] - c[p]["plain_outside_batches_s"]
                   for c in r["cadences"].values()]  # fmt: skip
        assert sum(outside) > 0, outside
    assert r["python_source_s_per_query"] > 0  # Spark starts a Python process per query
    assert r["goals"]["df:ft_ms_per_batch"] == "<= 30"


def test_observation_cost_smoke(tmp_path: Path) -> None:
    """The price of one observation per job (benchmarks.observation_cost), tiny: every
    variant measured against its plain runs, per cadence."""
    r = _bench(tmp_path, "benchmarks.observation_cost", "--cadences", "300", "--repeat", "1",
               "--warmup", "0", "--payload-bytes", "100")  # fmt: skip
    f = r["cadences"]["300"]
    assert r["observations_per_job"] == 2 and f["plain_s"] > 0
    for v in ("count", "stage", "stage_one_text"):
        assert isinstance(f[f"ms_per_observation_{v}"], float) and f[f"ratio_{v}_vs_plain"] > 0


@pytest.mark.slow
def test_stream_overhead_kafka_smoke(tmp_path: Path) -> None:
    """``--source kafka``, tiny: the DataFrame pipeline over a 4-partition topic on a
    throwaway broker, plain (ftlayer's Kafka source) and through ftlayer (KafkaSource),
    200 offsets a micro-batch; every run's output checked, the Redis bytes per record
    judged against 16 (a reference a record: no payload)."""
    r = _bench(tmp_path, "benchmarks.stream_overhead", "--source", "kafka", "--pipelines",
               "df", "--cadences", "200x2", "--repeat", "1", "--warmup", "0",
               "--payload-bytes", "100", "--source-pairs", "1", timeout=900,
               saved_as="stream_overhead_kafka.json")  # fmt: skip
    assert r["source"] == "kafka" and set(r["cadences"]) == {"200x2"}
    for name, cad in r["cadences"].items():
        f = cad["df"]
        assert f["plain_micro_batches"] == f["ft_on_micro_batches"] == cad["batches"]
        assert f["ratio_stream_df_ft_on_vs_plain"] > 0
        assert r["goals"][f"{name}:df:ft_on_redis_bytes_per_record"] == "<= 16"


def test_ack_throughput_smoke(tmp_path: Path) -> None:
    r = _bench(tmp_path, "benchmarks.ack_throughput", "--records", "600", "--batch", "200",
               "--sweep", "100,200", "--repeat", "1")  # fmt: skip
    assert r["records"] == 600 and r["events"] == 3600
    for key in ("xor_events_per_s", "client_events_per_cpu_s", "raw_set_ops_per_s",
                "naive_lua_events_per_s", "ratio_vs_naive", "ratio_vs_raw_set"):  # fmt: skip
        assert r[key] > 0, key
    assert r["redis_usec_per_event"] > 0 and r["evalsha_calls"] > 0
    assert sorted(p["batch"] for p in r["sweep"]) == [100, 200]
    assert set(r["goals"]) == {"redis_usec_per_event", "client_events_per_cpu_s",
                               "client_events_per_cpu_s_numpy", "ratio_vs_naive"}  # fmt: skip
    assert r["client_events_per_cpu_s_numpy"] > 0 and r["xor_events_per_s_numpy"] > 0
    # the server's own ceiling (.ci/run installs redis-benchmark with Debian's redis-server)
    ceiling = r["redis_benchmark_set_ops_per_s"]
    assert ceiling and ceiling > r["raw_set_ops_per_s"], r["redis_benchmark_set_note"]
    assert 0 < r["ratio_vs_redis_benchmark_set"] < r["ratio_vs_raw_set"]


def test_pending_memory_smoke(tmp_path: Path) -> None:
    r = _bench(tmp_path, "benchmarks.pending_memory", "--records", "3000", "--batch", "1000")
    assert r["records"] == 3000 and r["bytes_per_pending"] > r["payload_bytes"]
    assert r["breakdown_bytes_per_pending"]["stored records (one string per bucket)"] > 100
    assert r["mem_allocator"]


def test_layout_candidates_smoke(tmp_path: Path) -> None:
    """Catches: a candidate that stores nothing, or the layout in use losing to the old one."""
    r = _bench(tmp_path, "benchmarks.layout_candidates", "--records", "3000")
    c = {k: v["bytes_per_pending_beyond_payload"] for k, v in r["candidates"].items()}
    assert len(c) == 5 and all(v > 0 for v in c.values()), c
    now = next(v for k, v in c.items() if k.endswith("(now)"))
    assert now < c["per-record hashes (before)"] / 2, c


def test_ack_throughput_cluster_smoke(tmp_path: Path, redis_cluster: EmbeddedCluster) -> None:
    r = _bench(tmp_path, "benchmarks.ack_throughput", "--records", "600", "--batch", "200",
               "--sweep", "200", "--repeat", "1", "--redis-url", redis_cluster.url)  # fmt: skip
    assert r["cluster"] is True and r["masters"] == 3 and r["events"] == 3600
    assert r["xor_events_per_s"] > 0 and r["redis_usec_per_event"] > 0
    assert r["raw_set_ops_per_s"] > 0 and r["naive_lua_events_per_s"] > 0
    assert r["redis_benchmark_set_ops_per_s"] > 0, r["redis_benchmark_set_note"]
    nodes = {n["node"] for n in r["per_node"]}
    assert len(nodes) == 3 and sum(n["evalsha_calls"] for n in r["per_node"]) == r["evalsha_calls"]
    assert sum(n["records"] for n in r["per_node"]) == 600
    assert {s["node"] for s in r["per_shard"]} <= nodes and len(r["per_shard"]) == r["shards"]
    assert sum(s["records"] for s in r["per_shard"]) == 600
    c = _bench(tmp_path, "benchmarks.cluster_compare", "--records", "300", "--batch", "100",
               "--repeat", "1")  # fmt: skip
    assert c["single"]["masters"] == 1 and c["cluster"]["masters"] == 3
    assert c["ratio_cluster_vs_single"]["xor_events_per_s"] > 0


def test_call_overhead_smoke(tmp_path: Path) -> None:
    r = _bench(tmp_path, "benchmarks.call_overhead", "--calls", "500")
    assert r["calls"] == 500 and r["redis_usec_per_call_bare"] > 0
    assert r["redis_usec_per_call_prelude"] > r["redis_usec_per_call_bare"]
    assert r["redis_usec_per_set"] > 0
