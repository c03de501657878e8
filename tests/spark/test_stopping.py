"""A query stopped while its micro-batch waits in a Spark job stops as a stop.

Spark tells its own stop from a failure by matching the Python error's text against
``StreamExecution.PROXY_ERROR``; on py4j's full text (the Java stack trace, ~10 KB) Java's
matcher overflows the stream thread's stack. Spark's own check is the oracle here.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from typing import Any

import pyarrow as pa
import pytest
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from ftlayer.spark.stopping import BatchInterruptedError, stop_text
from tests.spark.conftest import FTFactory

STREAM_EXECUTION = "org.apache.spark.sql.execution.streaming.runtime.StreamExecution"


def _interrupted_call(spark: SparkSession) -> Py4JJavaError:
    """A real Spark job interrupted while the driver waits for it (the pinned py4j thread
    interrupted first), as a query's stop interrupts the job foreachBatch waits in."""
    jvm: Any = spark.sparkContext._jvm
    jvm.java.lang.Thread.currentThread().interrupt()
    with pytest.raises(Py4JJavaError) as got:
        spark.range(1000).repartition(3)._jdf.count()
    return got.value


def _spark_takes_for_its_stop(spark: SparkSession, exc: BaseException) -> bool:
    """Spark's own verdict on the text a Python foreachBatch error reaches the JVM as:
    py4j's "Return Message:" followed by the formatted traceback."""
    text = "".join(traceback.format_exception(exc))
    jvm: Any = spark.sparkContext._jvm
    proxy = jvm.py4j.Py4JException(
        "An exception was raised by the Python Proxy. Return Message: " + text)
    check = getattr(jvm, STREAM_EXECUTION).isInterruptionException
    return bool(check(proxy, spark.sparkContext._jsc.sc()))


def test_spark_takes_the_short_text_for_its_stop_and_overflows_on_py4js(
    spark: SparkSession,
) -> None:
    """Catches: the interrupted batch re-raised with py4j's whole text (Spark's pattern
    overflows the stack on it), or a short text Spark does not count as its stop."""
    raw = _interrupted_call(spark)
    assert len(str(raw)) > 2000  # the Java stack trace rides along
    text = stop_text(raw)
    assert text is not None and text.endswith(": java.lang.InterruptedException")
    assert text.startswith("py4j.protocol.Py4JJavaError: An error occurred while calling o")
    try:
        raise BatchInterruptedError(7, text) from None
    except BatchInterruptedError as e:
        short = e
    assert _spark_takes_for_its_stop(spark, short)
    with pytest.raises(Py4JJavaError, match="StackOverflowError"):
        _spark_takes_for_its_stop(spark, raw)


def _cancelled_call(spark: SparkSession, group: str) -> Py4JJavaError:
    """A real Spark job cancelled with its job group while the driver waits for it, as a
    query's stop cancels the group (its run id) the micro-batch's jobs run in."""
    sc = spark.sparkContext
    sc.setJobGroup(group, "a stand-in for a query's run")
    cancel = threading.Timer(2.0, sc.cancelJobGroup, [group])
    cancel.start()
    try:
        with pytest.raises(Py4JJavaError) as got:
            spark.range(2, numPartitions=2).mapInArrow(
                lambda it: (time.sleep(60), *it)[1:], "id long")._jdf.count()
    finally:
        cancel.join()
    return got.value


def test_a_job_cancelled_with_the_threads_job_group_is_a_stop_as_spark_says(
    spark: SparkSession,
) -> None:
    """Catches: the stop that lands as a cancelled job (``SPARK_JOB_CANCELLED``, Spark's
    own stop by its rule) raised with py4j's whole text, or any cancellation taken for it."""
    sc = spark.sparkContext
    spark_says = getattr(sc._jvm, STREAM_EXECUTION).isInterruptionException
    try:
        raw = _cancelled_call(spark, "ftlayer-test-run")
        assert "SPARK_JOB_CANCELLED" in str(raw)
        assert spark_says(raw.java_exception, sc._jsc.sc())
        text = stop_text(raw)
        assert text is not None and "cancelled by the query's stop" in text
        try:
            raise BatchInterruptedError(7, text) from None
        except BatchInterruptedError as e:
            short = e
        assert _spark_takes_for_its_stop(spark, short)
        sc.setJobGroup("another-run", "a thread in another job group")
        assert not spark_says(raw.java_exception, sc._jsc.sc())
        assert stop_text(raw) is None
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]


def test_other_errors_are_not_taken_for_a_stop(spark: SparkSession) -> None:
    """Catches: any py4j error (or any error at all) rewritten as an interrupted batch."""
    jvm: Any = spark.sparkContext._jvm
    with pytest.raises(Py4JJavaError) as got:
        jvm.java.lang.Class.forName("no.such.Class")
    assert "ClassNotFoundException" in str(got.value)
    assert stop_text(got.value) is None
    assert stop_text(ValueError("py4j.protocol.Py4JJavaError: java.lang.InterruptedException")) \
        is None


def test_a_query_stopped_mid_batch_says_so_and_keeps_its_records(
    spark: SparkSession, make_ft: FTFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches: the pipeline raising py4j's own error when the query's stop interrupts its
    job, or settling (acking) the records of the batch it interrupted."""
    ft = make_ft(timeout_s=30)

    def slow(b: pa.RecordBatch) -> pa.RecordBatch:
        time.sleep(3)
        return b

    pipeline = (ft.pipeline(source=0).map_batches(slow, "timestamp timestamp, value long")
                .sink_batches(lambda b: None))  # fmt: skip
    stream = spark.readStream.format("rate").option("rowsPerSecond", 50).load()
    query = stream.writeStream.foreachBatch(pipeline).trigger(processingTime="1 second").start()
    try:
        deadline = time.monotonic() + 60
        while not (any(r.fresh for r in ft.results) and query.status["isTriggerActive"]):
            assert time.monotonic() < deadline, query.status
            time.sleep(0.1)
        time.sleep(1.0)  # inside the next batch's 3-second stage
    finally:
        with caplog.at_level(logging.WARNING, logger="ftlayer.spark.stopping"):
            query.stop()
    assert query.exception() is None
    said = [r.getMessage() for r in caplog.records if "interrupted by the query's stop" in
            r.getMessage()]  # fmt: skip
    assert len(said) == 1, caplog.text
    assert ft.layer is not None
    st = ft.layer.stats()
    # only the batches that finished acked anything: the interrupted one's records are
    # either pending (left to time out) or were never taken in (Spark re-reads them)
    produced = sum(r.fresh for r in ft.results)
    assert produced > 0 and st.completed == produced
    assert st.persisted - st.completed == st.pending
