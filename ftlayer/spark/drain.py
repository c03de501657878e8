"""The end of a run: ``FaultTolerance.drain`` waits until nothing of the namespace is
pending, running the queued replays through the last pipeline in extra batches (no fresh
rows: a drain's batches only run replays) and expiring timeouts as it waits.

Invariant: what is still pending at the deadline is reported (``DrainResult``), never
dropped: it stays in Redis for the next run.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ftlayer.spark.results import DrainResult

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer
    from ftlayer.spark.engine import BatchEngine
    from ftlayer.spark.results import BatchResult

__all__ = ["drain"]

log = logging.getLogger(__name__)


def drain(layer: FTLayer | None, engine: BatchEngine,
          run_batch: Callable[[Any, Any, str], BatchResult],
          last: Callable[[], tuple[Any, Any, Any] | None], timeout_s: float) -> DrainResult:
    """Drain ``layer``'s namespace, running replays through ``last()`` (pipeline, Spark
    session, the source's schema; None: no batch run yet), asked only when replays are
    queued, by ``run_batch`` (``FaultTolerance.run_batch``) with ``engine`` draining."""
    started = time.monotonic()
    if layer is None:
        return DrainResult(True, 0, 0, 0, 0.0)
    deadline = started + timeout_s
    batches = 0
    pause = min(0.2, layer.config.rotation_interval_s / 4)
    st = layer.stats()
    while st.pending + st.unsettled_segments:  # nothing pending: no timeout to expire
        layer.expire_due()
        st = layer.stats()
        if st.pending + st.unsettled_segments == 0 or time.monotonic() >= deadline:
            break
        run = last() if st.queued_replays else None
        if run is not None and not any(layer.persistence.claimable(run[0].source)):
            run = None  # only replays held for a later probe: no batch until one is due
        if run is not None:
            pipe, spark, schema = run
            empty = spark.createDataFrame([], schema)
            engine.draining = True
            try:
                result = run_batch(pipe, empty, f"drain-{uuid.uuid4().hex[:6]}")
            finally:
                engine.draining = False
            batches += 1
            if result.replayed or result.undecodable:
                continue
        log.info("draining pending=%d queued_replays=%d unsettled_segments=%d",
                 st.pending, st.queued_replays, st.unsettled_segments)  # fmt: skip
        time.sleep(pause)
    drained = st.pending == 0 and st.unsettled_segments == 0
    out = DrainResult(drained, st.pending, st.dead_lettered, batches,
                      round(time.monotonic() - started, 3), st)  # fmt: skip
    (log.info if drained else log.warning)(
        "drain %s pending=%d dead_lettered=%d batches=%d",
        "complete" if drained else "timed out", out.pending, out.dead_lettered, batches)
    return out

