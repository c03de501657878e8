"""The report phase of a batch (the last, after it settled): its dead letters handed to the
pipeline's ``on_dead_letter``, its elapsed time, its summary kept for the status page
(ftlayer.history) and its log lines.

Invariant: a report never fails a batch. The batch has settled by now (Spark may commit
its offsets); a Redis error here is logged, and what it would have shown is shown again
by the next batch (dead letters are delivered from a cursor: at least once).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis

from ftlayer.dlq_merge import merge_dead_letters
from ftlayer.history import record_batch
from ftlayer.spark.dead_letter_feed import DeadLetterFeed

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer
    from ftlayer.spark.pipeline import Pipeline
    from ftlayer.spark.results import BatchResult

__all__ = ["report"]

log = logging.getLogger(__name__)


def report(layer: FTLayer | None, pipeline: Pipeline | None, result: BatchResult,
           started: float) -> BatchResult:  # fmt: skip
    """Finish ``result`` (its elapsed time since ``started``, a ``time.monotonic()``) and
    report it: dead letters to ``on_dead_letter``, the status page's summary, the log.
    A batch that dead-lettered rows first joins any it dead-lettered again into their
    entries in other shards (ftlayer.dlq_merge): one dead letter per record from here on."""
    if layer is not None and any(c.dead_lettered for c in result.stages.values()):
        try:
            merge_dead_letters(layer.persistence)
        except redis.RedisError as e:  # the sidecar's next rotation joins them
            log.warning("dead letters not joined across shards yet error=%s", e)
    if pipeline is not None and pipeline.on_dead_letter and layer is not None:
        given = DeadLetterFeed(layer, pipeline.source, pipeline.on_dead_letter).deliver()
        if given:
            log.info("dead letters given to on_dead_letter batch_id=%s n=%d",
                     result.batch_id, given)  # fmt: skip
    result.elapsed_s = round(time.monotonic() - started, 3)
    if pipeline is not None and layer is not None:
        _keep_summary(layer, pipeline, result)
    log.info("batch done batch_id=%s fresh=%d replayed=%d failed=%d rejected=%d written=%d "
             "elapsed_s=%.3f", result.batch_id, result.fresh, result.replayed, result.failed,
             result.rejected, result.written, result.elapsed_s)  # fmt: skip
    for label, c in result.stages.items():
        if c.held:
            log.warning("stage breaker open batch_id=%s stage=%r held=%d: not called (most "
                        "of its rows failed before); they wait in the replay queue for its "
                        "next probe, no attempt charged", result.batch_id, label,
                        c.held)  # fmt: skip
    if result.rejected:
        log.error("rows rejected batch_id=%s rejected=%d first=%s", result.batch_id,
                  result.rejected, result.rejects[:3])  # fmt: skip
    return result


def _keep_summary(layer: FTLayer, pipeline: Pipeline, result: BatchResult) -> None:
    """The batch's summary for the status page (ftlayer.history)."""
    stages = {label: (c.rows_in, c.rows_out, c.failed, c.unconfirmed, c.seconds,
                      c.replayed, c.dead_lettered, c.held)
              for label, c in result.stages.items()}  # fmt: skip
    try:
        record_batch(layer.client, layer.keyspace,
                     pipeline=pipeline.name or f"source {pipeline.source}",
                     source=pipeline.source, batch_id=result.batch_id,
                     elapsed_s=result.elapsed_s, fresh=result.fresh,
                     replayed=result.replayed, failed=result.failed,
                     written=result.written, stages=stages, entered=result.entered,
                     read_back=result.read_back)  # fmt: skip
    except redis.RedisError as e:
        log.warning("batch summary not kept batch_id=%s error=%s", result.batch_id, e)
