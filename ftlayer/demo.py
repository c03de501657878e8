"""``ftlayer demo``: a generated workload through the FT layer, with failures injected.

Micro-batches of source records run through two tasks per partition, as across a
shuffle: the source task persists each record and maps it (a chained stage emitting one
child); the task after the shuffle writes the child to the sink and acks it. Injected:
explicit failures (``FailRecord``) and drops (never acked: they must time out). Replays
enter later micro-batches. At the end the demo drains (waits, with a deadline, until
nothing is pending) and reports what the sink received; ``lost`` is counted from the
sink's contents, not from FT counters.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord
from ftlayer.handler import AbstractFTHandler
from ftlayer.ids import RecordId
from ftlayer.layer import FTLayer

__all__ = ["DemoReport", "run_demo"]

PARTITIONS = 4


@dataclass
class DemoReport:
    source_records: int
    completed: int
    replayed: int
    failed_explicit: int
    timed_out: int
    dead_lettered: int
    lost: int
    pending: int
    sink_rows: int
    duplicates: int
    elapsed_s: float


def _map_stage(h: AbstractFTHandler, rid: RecordId, record: dict[str, Any]) -> tuple:
    """The chained stage of the source task: one child per record."""
    with h.processing(rid):
        child = h.emit()
    return child, {"id": record["id"], "value": record["id"] * 2}


def run_demo(
    records: int = 20_000,
    fail_rate: float = 0.02,
    drop_rate: float = 0.01,
    timeout_s: float = 2.0,
    redis_url: str | None = None,
    batch_size: int = 2_000,
    drain_timeout_s: float = 60.0,
    seed: int = 7,
    progress: Any = None,
) -> DemoReport:
    rng = random.Random(seed)
    config = FTConfig(
        namespace=f"demo-{uuid.uuid4().hex[:8]}", timeout_s=timeout_s, redis_url=redis_url
    )
    sink: Counter[int] = Counter()
    started = time.monotonic()
    with FTLayer.open(config) as layer:
        rotator = layer.start_rotator()
        try:
            next_id = 0
            deadline = None
            while True:
                fresh = min(batch_size, records - next_id)
                replays = layer.claim_replays(source=0, limit=batch_size)
                _micro_batch(layer, rng, fail_rate, drop_rate, sink, next_id, fresh, replays)
                next_id += fresh
                st = layer.stats()
                if progress:
                    progress(next_id, records, st)
                if next_id >= records:
                    if st.pending == 0:
                        break
                    deadline = deadline or time.monotonic() + drain_timeout_s
                    if time.monotonic() > deadline:
                        break  # reported below as pending, never dropped
                    if not replays:
                        time.sleep(min(0.2, config.rotation_interval_s / 4))
            dead = {d.frame.decode()["id"] for d in layer.persistence.dead_letters()}
            st = layer.stats()
        finally:
            rotator.stop()
            layer.clear()
    delivered = set(sink)
    return DemoReport(
        source_records=records,
        completed=st.completed,
        replayed=st.replayed,
        failed_explicit=st.failed_explicit,
        timed_out=st.failed_timeout,
        dead_lettered=st.dead_lettered,
        lost=sum(1 for i in range(records) if i not in delivered and i not in dead),
        pending=st.pending,
        sink_rows=sum(sink.values()),
        duplicates=sum(n - 1 for n in sink.values()),
        elapsed_s=round(time.monotonic() - started, 2),
    )


def _micro_batch(layer, rng, fail_rate, drop_rate, sink, first, fresh, replays) -> None:
    # source tasks: persist fresh records, re-emit claimed replays, run the map stage
    shuffled: list[list[tuple[RecordId, dict[str, Any]]]] = [[] for _ in range(PARTITIONS)]
    sources = [layer.handler(partition=p) for p in range(PARTITIONS)]
    for i in range(first, first + fresh):
        p = i % PARTITIONS
        record = {"id": i}
        rid = sources[p].persist_record(record, hash_code=i, source=0)
        child, out = _map_stage(sources[p], rid, record)
        shuffled[out["id"] % PARTITIONS].append((child, out))
    for claimed in replays:
        p = claimed.original_partition % PARTITIONS
        record = claimed.frame.decode()
        child, out = _map_stage(sources[p], claimed.record_id, record)
        shuffled[out["id"] % PARTITIONS].append((child, out))
    for h in sources:
        h.flush()  # a task's flush ends it: the shuffle's input is now safe
    # tasks after the shuffle: the sink
    for p in range(PARTITIONS):
        h = layer.handler(partition=p)
        for rid, out in shuffled[p]:
            roll = rng.random()
            if roll < drop_rate:
                continue  # lost in flight: never acked, must time out and replay
            with h.processing(rid):
                if roll < drop_rate + fail_rate:
                    raise FailRecord(f"injected failure of record {out['id']}")
                sink[out["id"]] += 1  # the write; the ack follows when it returns
        h.flush()


def report_table(report: DemoReport) -> str:
    rows = asdict(report)
    width = max(len(k) for k in rows)
    return "\n".join(f"  {k:<{width}}  {v:>10}" for k, v in rows.items())
