"""A batch that ``query.stop()`` interrupts, told to Spark in a few words.

When ``query.stop()`` lands while ``foreachBatch`` waits in a JVM call (a Spark job, a
write), py4j raises ``Py4JJavaError`` for the stream thread's ``InterruptedException``,
and its text carries the whole Java stack trace (about 10 KB). Spark tells its own stop
from a failure by matching that text against ``StreamExecution.PROXY_ERROR``, a pattern
with ``(.|\\r\\n|\\r|\\n)*`` that Java's matcher walks by recursing once per character: on
10 KB it overflows the stream thread's stack, and the thread dies on a
``StackOverflowError`` (about 75 KB of trace on stderr) instead of stopping quietly. Plain
PySpark ``foreachBatch`` does the same on Spark 4.

:func:`stop_text` finds that case; the pipeline then raises :class:`BatchInterruptedError`,
whose message ends with the same call and exception name in under a hundred characters,
so Spark's pattern matches it at once and the query stops as a stop.

The stop may also land as a cancelled job instead (``SparkException``
``[SPARK_JOB_CANCELLED] ... Query [...] was stopped``): Spark cancels the query's job
group, then interrupts its thread, and whichever the waiting call sees first is what py4j
raises. ``StreamExecution.isInterruptionException`` counts such a cancellation as its own
stop when the message names the thread's job group (the query's run id) and has no cause;
:func:`stop_text` applies the same rule and tells it as an interruption, the only names
Spark's pattern knows.

Invariant: nothing is settled for an interrupted batch. Its records stay pending, time
out and replay (never acked, never dropped).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pyspark import SparkContext

from ftlayer.errors import FTLayerError

log = logging.getLogger(__name__)

# the exceptions StreamExecution.isInterruptionException counts as its own stop
INTERRUPTIONS = frozenset({
    "java.lang.InterruptedException",
    "java.io.InterruptedIOException",
    "java.nio.channels.ClosedByInterruptException",
})


class BatchInterruptedError(FTLayerError):
    """``query.stop()`` interrupted this micro-batch; its records replay after the
    timeout. The message ends with the py4j call and the Java exception name, the text
    Spark recognises as its stop."""

    def __init__(self, batch_id: object, text: str) -> None:
        super().__init__(f"micro-batch {batch_id} stopped mid-way by the query's stop; its "
                         f"records stay pending and replay after the timeout: {text}")  # fmt: skip


@contextmanager
def stop_told(batch_id: object) -> Iterator[None]:
    """Around a micro-batch: an interruption by the query's stop raised as
    :class:`BatchInterruptedError` (and logged), any other error as it is."""
    try:
        yield
    except Exception as e:
        text = stop_text(e)
        if text is None:
            raise
        log.warning("micro-batch %s interrupted by the query's stop: its records stay "
                    "pending and replay after the timeout", batch_id)  # fmt: skip
        raise BatchInterruptedError(batch_id, text) from None


def stop_text(exc: BaseException, depth: int = 8) -> str | None:
    """``"py4j.protocol.Py4JJavaError: An error occurred while calling oN.m:
    java.lang.InterruptedException"`` when ``exc`` is a py4j error whose Java exception,
    or one of its first ``depth`` causes, is an interruption or a job cancelled with this
    thread's job group (a query's stop, by Spark's rule); else None (also when the JVM
    cannot be asked: the original error is then raised as it is)."""
    java = getattr(exc, "java_exception", None)
    call = getattr(exc, "errmsg", None)
    if java is None or not isinstance(call, str):
        return None
    head = f"py4j.protocol.Py4JJavaError: {call.strip().rstrip('.')}"
    try:
        for _ in range(depth):
            if java is None:
                return None
            name = str(java.getClass().getName())
            if name in INTERRUPTIONS:
                return f"{head}: {name}"
            if _cancelled_by_stop(java):
                return (f"{head}: its Spark job cancelled by the query's stop, which Spark "
                        f"counts as java.lang.InterruptedException")  # fmt: skip
            java = java.getCause()
    except Exception:  # noqa: BLE001 -- a JVM that cannot answer: keep the original error
        return None
    return None


def _cancelled_by_stop(java: Any) -> bool:
    """Spark's rule (``StreamExecution.isInterruptionException``, the ``SparkException``
    case): a ``SparkException`` with no cause whose message says ``cancelled`` and names
    the calling thread's job group, which a streaming query sets to its run id."""
    sc = SparkContext._active_spark_context
    if sc is None or java.getCause() is not None:
        return False
    jvm: Any = sc._jvm
    if not jvm.java.lang.Class.forName("org.apache.spark.SparkException").isInstance(java):
        return False
    group = sc.getLocalProperty("spark.jobGroup.id")
    text = str(java.getMessage() or "")
    return bool(group) and "cancelled" in text and str(group) in text
