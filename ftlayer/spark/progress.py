"""ftlayer's counts where Spark users look: a ``StreamingQueryListener`` ftlayer installs.

Why a listener and not ``DataFrame.observe``: observed metrics reach
``query.lastProgress.observedMetrics`` only from the streaming DataFrame's own plan (the
input side, before ``foreachBatch``); a metric observed on the batch DataFrame inside
``foreachBatch`` -- where ftlayer's work happens -- never shows there (checked with
PySpark 4.3: ``df.observe(...)`` in foreachBatch leaves ``observedMetrics`` without it). So
ftlayer listens: ``ft.install_progress_listener(spark)`` registers a listener whose
``onQueryProgress`` joins Spark's progress of a micro-batch (batch id, input rows, rows/s,
durations) with the :class:`~ftlayer.spark.results.BatchResult` of the same batch id, keeps
the last ``keep`` of them (``ft.recent_progress``, ``ft.last_progress``) and logs one line
per batch (``ftlayer.spark.progress``, INFO).

Progress events arrive on Spark's listener bus after the batch's ``foreachBatch`` returned,
so the BatchResult is there when they do. Classic Spark only: under Spark Connect the
``foreachBatch`` function runs in a process of the server, and its results stay there.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.streaming import StreamingQueryListener

from ftlayer.spark.results import BatchResult

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["BatchProgress", "ProgressListener"]

log = logging.getLogger(__name__)


@dataclass
class BatchProgress:
    """One micro-batch as Spark and ftlayer saw it. ``ft`` is None when the batch ran no
    ftlayer pipeline of this FaultTolerance (another sink of the query)."""

    query_id: str
    run_id: str
    name: str | None
    batch_id: int
    timestamp: str
    num_input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    duration_ms: dict[str, int] = field(default_factory=dict)
    ft: BatchResult | None = None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if self.ft is not None:
            out["ft"]["stages"] = {k: {**asdict(v), "acked": v.acked}
                                   for k, v in self.ft.stages.items()}  # fmt: skip
        return out

    def json(self) -> str:
        return json.dumps(self.as_dict(), default=str)


class ProgressListener(StreamingQueryListener):
    """Joins Spark's progress events with a FaultTolerance's batch results."""

    def __init__(self, results: list[BatchResult], keep: int = 100) -> None:
        self.results = results
        self.recent: deque[BatchProgress] = deque(maxlen=keep)
        self._lock = threading.Lock()
        self._spark: SparkSession | None = None

    def _result(self, batch_id: int) -> BatchResult | None:
        for r in reversed(self.results):
            if r.batch_id == batch_id:
                return r
        return None

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 -- Spark's name
        pass

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        p = event.progress
        bp = BatchProgress(
            query_id=str(p.id), run_id=str(p.runId), name=p.name, batch_id=int(p.batchId),
            timestamp=str(p.timestamp), num_input_rows=int(p.numInputRows),
            input_rows_per_second=float(p.inputRowsPerSecond or 0.0),
            processed_rows_per_second=float(p.processedRowsPerSecond or 0.0),
            duration_ms={k: int(v) for k, v in (p.durationMs or {}).items()},
            ft=self._result(int(p.batchId)),
        )  # fmt: skip
        with self._lock:
            self.recent.append(bp)
        r = bp.ft
        if r is not None:
            log.info("progress query=%s batch_id=%d input_rows=%d fresh=%d replayed=%d "
                     "acked=%d failed=%d unconfirmed=%d rows_per_s=%.0f", bp.name or bp.query_id,
                     bp.batch_id, bp.num_input_rows, r.fresh, r.replayed, r.acked, r.failed,
                     r.unconfirmed, bp.processed_rows_per_second)  # fmt: skip

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        pass

    def install(self, spark: SparkSession) -> ProgressListener:
        spark.streams.addListener(self)
        self._spark = spark
        return self

    def uninstall(self) -> None:
        if self._spark is not None:
            self._spark.streams.removeListener(self)
            self._spark = None
