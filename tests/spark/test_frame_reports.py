"""Python stages among DataFrame stages report what they left undone through a Spark
accumulator (ftlayer.spark.frame_reports), read as an observation would be: reports sent
by real tasks and merged by the real driver.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql import SparkSession

from ftlayer.spark.frame_reports import NO_LOC, Reported, TaskReport, reports_of


def _report(stage: int, part: int, attempt: int, rows: int,
            failed: list[tuple[int | None, int, str]]) -> TaskReport:  # fmt: skip
    errors = sorted({e for *_, e in failed})
    return TaskReport(stage, part, attempt, rows,
                      np.array([NO_LOC if lo is None else lo for lo, _, _ in failed], np.int64),
                      np.array([p for _, p, _ in failed], np.int64),
                      np.array([errors.index(e) for *_, e in failed], np.int32),
                      [(e, False, 1) for e in errors])  # fmt: skip


def test_reports_are_unioned_over_attempts_and_counted_once_per_partition(
        spark: SparkSession) -> None:  # fmt: skip
    """A re-run task's reports are merged beside the first attempt's (Spark merges the
    updates of a re-run shuffle-map task again): every row any attempt failed is failed,
    once per partition (children of one record, which share its identity, in two
    partitions are two rows); counts take each partition's last attempt (all its input
    batches) in the first Spark stage that ran it (not a sink's second action); a run
    reads only its own salt and drops what it read; a job that did not run reads as None.
    Breaks it catches: a later attempt's report replacing an earlier one (a failed row
    lost), a row counted twice, rows of one input batch only, another run's reports
    read."""
    acc = reports_of(spark, {}, 0)
    assert acc is not None
    ours, other = (7, "map_batches[1.0] f"), (8, "map_batches[1.0] f")
    acc.add({ours: [_report(3, 0, 10, 5, [(1, 11, "boom"), (1, 10, "boom")])]})
    # partition 0 again: it fails (1, 11) again (one row: counted once), another row, and
    # a child of a record whose other child partition 1 fails (two rows: counted twice)
    acc.add({ours: [_report(3, 0, 12, 6, [(1, 11, "boom"), (None, 12, "late"),
                                          (1, 13, "boom")])]})  # fmt: skip
    acc.add({ours: [_report(3, 1, 11, 3, [(1, 13, "boom")]),  # two input batches
                    _report(3, 1, 11, 4, [])]})  # fmt: skip
    acc.add({other: [_report(3, 0, 20, 9, [(2, 2, "other run")])]})
    acc.add({ours: [_report(4, 0, 30, 13, [(1, 14, "second job")])]})  # a second action
    reported = Reported(acc, *ours)
    assert reported.metrics(False) is None
    m: dict[str, Any] | None = reported.metrics(True)
    assert m is not None
    assert m["rows"] == 6 + 3 + 4
    assert sorted((lo or -1, pos) for lo, pos, _ in m["failed"]) == [
        (-1, 12), (1, 10), (1, 11), (1, 13), (1, 13), (1, 14)]
    assert m["nfailed"] == 6
    texts = {e["id"]: e["error"] for e in m["errors"]}
    assert {texts[e] for *_, e in m["failed"]} == {"boom", "late", "second job"}
    assert ours not in acc.value and other in acc.value
    assert Reported(acc, *ours).metrics(True) == {"rows": 0, "nfailed": 0, "failed": [],
                                                  "errors": []}  # fmt: skip


def test_a_python_stages_tasks_report_through_the_accumulator(spark: SparkSession) -> None:
    """Real tasks of a ``mapInArrow`` report on a real session: the driver holds every
    task's report once the action returned (Spark merges a task's update before it counts
    the task done). Breaks it catches: reports sent after the task ends, an accumulator
    the workers cannot reach."""
    from ftlayer.spark.frame_reports import report

    acc = reports_of(spark, {}, 0)

    def stage(batches: Any) -> Any:
        for b in batches:
            ids = b.column(0)
            odd = pa.array(np.flatnonzero(np.asarray(ids) % 2 == 1))
            report(acc, 5, "s", b.num_rows, ids.take(odd), ids.take(odd),
                   ["odd"] * len(odd), [False] * len(odd), [1] * len(odd))  # fmt: skip
            yield b

    spark.range(0, 1000, numPartitions=4).mapInArrow(stage, "id long").write.format(
        "noop").mode("overwrite").save()  # fmt: skip
    m = Reported(acc, 5, "s").metrics(True)
    assert m is not None and m["rows"] == 1000 and m["nfailed"] == 500
    assert sorted(p for _, p, _ in m["failed"]) == list(range(1, 1000, 2))


def test_a_sink_writing_from_its_own_thread_loses_no_failed_row(
        spark: SparkSession, make_ft: Any, probe: Any, tmp_path: Path) -> None:  # fmt: skip
    """A Python stage fails ids = 3 (mod 40) on their first attempt past a keyed shuffle;
    the sink writes its DataFrame from a plain ``threading.Thread`` (Spark's local
    properties, which carry the batch run's salt, do not reach that thread's jobs). Every
    record lands in the Parquet table, the failed ones after their replay, none twice.
    Breaks it catches: reports of a job without the run's fields left unread (their rows
    acked unseen: lost)."""
    import threading

    from ftlayer.spark import FileSource, Outcome
    from tests.spark.probe import first_seen
    from tests.spark.test_dataframe_stages import SCHEMA, write_json

    ft = make_ft(timeout_s=2.0, max_replays=3)
    n = 400
    write_json(tmp_path / "in" / "a.json", range(n))
    out = str(tmp_path / "out")

    def stage(b: pa.RecordBatch) -> Outcome:
        ids = b.column("id").to_numpy()
        return Outcome(b, failed=first_seen(probe, "f", ids, ids % 40 == 3),
                       errors="first attempt fails")  # fmt: skip

    def sink(df: Any, _: Any) -> None:
        errors: list[BaseException] = []

        def write() -> None:
            try:
                df.write.mode("append").parquet(out)
            except BaseException as e:  # noqa: BLE001 (raised in the batch's thread)
                errors.append(e)

        t = threading.Thread(target=write)
        t.start()
        t.join()
        if errors:
            raise errors[0]

    pipeline = (ft.pipeline(reads=FileSource("json", str(tmp_path / "in"), SCHEMA), name="thr",
                            immediate_replays=0)  # failed rows reach the driver
                .partition_by(["key"], 3).map_batches(stage, SCHEMA).sink_dataframe(sink))
    query = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
             .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck"))
             .start())  # fmt: skip
    assert query.awaitTermination(120), "the availableNow query did not end"
    assert query.exception() is None, query.exception()
    got = [r["id"] for r in spark.read.parquet(out).select("id").collect()]
    assert sorted(got) == list(range(n)), "lost records, or written twice"
    assert sum(r.failed for r in ft.results) == len(range(3, n, 40))
    assert ft.layer.stats().pending == 0
