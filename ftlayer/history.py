"""What operators read back over time: the pipelines' batch summaries and the sidecar's
samples of the namespace's counters, each a capped list in Redis (``Keyspace.batches``,
``Keyspace.samples``), newest first.

* A driver pushes one summary per batch it finished (:func:`record_batch`): its counts and
  each stage's rows in and out, failures (and how many of them replayed or were
  dead-lettered) and time. The status page's stage table is built
  from the summaries of the last hour (:func:`stage_table`).
* The sidecar holding the rotation lease pushes a sample of the cumulative counters every
  SAMPLE_S (:func:`record_sample`); the charts are the differences between neighbours
  (:func:`series`).

Invariants: both lists are bounded (LTRIM in the same transaction as the push), so their
memory is O(BATCHES + SAMPLES) whatever the uptime; they are reports, never state: losing
them (a Redis restart, ``FTLayer.clear``) loses no record and changes no decision.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack

from ftlayer.keys import Keyspace

__all__ = ["BATCHES", "SAMPLES", "SAMPLE_S", "SOURCE_STAGE", "histogram_quantile",
           "read_batches", "read_samples", "record_batch", "record_sample", "series",
           "stage_table"]  # fmt: skip

SOURCE_STAGE = "source"
"""The stage label of rows failed before any stage ran (a record key that is not a
non-negative integer, a replay whose source row is gone): first in the stage table."""
BATCHES = 2000
"""Batch summaries kept (the newest)."""
SAMPLE_S = 10.0
"""Seconds between the leader sidecar's samples."""
SAMPLES = 400
"""Samples kept: a little over an hour at SAMPLE_S."""


def _push(client: Any, key: str, entry: dict[str, Any], keep: int) -> None:
    with client.pipeline(transaction=True) as pipe:
        pipe.lpush(key, msgpack.packb(entry))
        pipe.ltrim(key, 0, keep - 1)
        pipe.execute()


def _read(client: Any, key: str, since: float) -> list[dict[str, Any]]:
    """Entries stamped at or after ``since`` (unix seconds), oldest first."""
    out = []
    for raw in client.lrange(key, 0, -1):
        entry = msgpack.unpackb(raw)
        if entry["t"] < since:
            break
        out.append(entry)
    return out[::-1]


def record_batch(client: Any, keyspace: Keyspace, *, pipeline: str, source: int,
                 batch_id: Any, elapsed_s: float, fresh: int, replayed: int, failed: int,
                 written: int, stages: Mapping[str, Sequence[float]], entered: int = 0,
                 read_back: int = 0) -> None:  # fmt: skip
    """Push one batch's summary. ``stages``: label -> (rows in, rows out, failed,
    unconfirmed, seconds, replayed, dead-lettered, held: not called, its breaker open), in
    the pipeline's order; ``entered`` / ``read_back``: of its replays, those that entered
    at the stage they failed in / were read back from their source."""
    _push(client, keyspace.batches, {
        "t": time.time(), "pipeline": pipeline, "source": source, "batch": str(batch_id),
        "elapsed_s": elapsed_s, "fresh": fresh, "replayed": replayed, "failed": failed,
        "written": written, "stages": [[label, *map(float, v)] for label, v in stages.items()],
        "entered": entered, "read_back": read_back,
    }, BATCHES)  # fmt: skip


def read_batches(client: Any, keyspace: Keyspace, since: float) -> list[dict[str, Any]]:
    return _read(client, keyspace.batches, since)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stage_table(batches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (pipeline, stage), in the pipelines' stage order: batches, rows in and
    out, failed, of them replayed and dead-lettered, unconfirmed (they time out and
    replay), held (rows the stage's open breaker did not call: queued for its probe, no
    attempt charged), and the p50/p99 over batches of the stage's time in a batch (ms, summed over
    tasks). A summary written before the replayed / dead-lettered split counts 0 there."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    times: dict[tuple[str, str], list[float]] = {}
    for b in batches:
        for label, *values in b["stages"]:
            key = (b["pipeline"], label)
            r = rows.setdefault(key, {"pipeline": b["pipeline"], "stage": label, "batches": 0,
                                      **dict.fromkeys(_SUMMED, 0)})  # fmt: skip
            r["batches"] += 1
            named = dict(zip(_STAGE_FIELDS, values, strict=False))
            for name in _SUMMED:
                r[name] += int(named.get(name, 0))
            times.setdefault(key, []).append(named["seconds"] * 1000)
    for key, r in rows.items():
        for q in (0.5, 0.99):
            v = _quantile(times[key], q)
            r[f"p{int(q * 100)}_ms"] = None if v is None else round(v, 1)
    return sorted(rows.values(), key=lambda r: (r["pipeline"], _position(r["stage"])))


_STAGE_FIELDS = ("rows_in", "rows_out", "failed", "unconfirmed", "seconds", "replayed",
                 "dead_lettered", "held")  # fmt: skip
"""The order of a stage's values in a batch summary (record_batch)."""
_SUMMED = ("rows_in", "rows_out", "failed", "replayed", "dead_lettered", "unconfirmed", "held")


def _position(label: str) -> tuple[int, ...]:
    """A stage label's place in its pipeline (``map_batches[0.1] fn``: segment 0, op 1)."""
    if label == SOURCE_STAGE:
        return (-1,)
    found = re.search(r"\[([\d.]+)", label)
    return tuple(int(p) for p in found.group(1).split(".") if p) if found else (1 << 30,)


def record_sample(client: Any, keyspace: Keyspace, *, completed: int, failed: int,
                  pending: int, latency: Sequence[int]) -> None:  # fmt: skip
    """Push one sample: cumulative completed and failed records, pending now, and the
    cumulative completion-latency histogram (counts per bucket of LATENCY_BOUNDS_MS, then
    the total)."""
    _push(client, keyspace.samples, {"t": time.time(), "completed": completed,
                                     "failed": failed, "pending": pending,
                                     "latency": list(latency)}, SAMPLES)  # fmt: skip


def read_samples(client: Any, keyspace: Keyspace, since: float) -> list[dict[str, Any]]:
    return _read(client, keyspace.samples, since)


def series(samples: list[dict[str, Any]], bounds_ms: Sequence[int]) -> dict[str, Any]:
    """The charts' points, one per pair of neighbouring samples (at the later one's time):
    completed/s and failed/s (a counter that went down -- Redis lost its stats -- gives
    no point), pending, and the p99 completion latency of the records completed between
    them (ms, :func:`histogram_quantile`; None when none completed)."""
    out: dict[str, list[Any]] = {"t": [], "completed_per_s": [], "failed_per_s": [],
                                 "pending": [], "p99_ms": []}  # fmt: skip
    for a, b in zip(samples, samples[1:], strict=False):
        dt = b["t"] - a["t"]
        if dt <= 0 or b["completed"] < a["completed"] or b["failed"] < a["failed"]:
            continue
        out["t"].append(b["t"])
        out["completed_per_s"].append((b["completed"] - a["completed"]) / dt)
        out["failed_per_s"].append((b["failed"] - a["failed"]) / dt)
        out["pending"].append(b["pending"])
        delta = [y - x for x, y in zip(a["latency"], b["latency"], strict=True)]
        p99 = histogram_quantile(delta[:-1], delta[-1], bounds_ms, 0.99)
        out["p99_ms"].append(None if p99 is None else round(p99, 1))
    return out


def histogram_quantile(cumulative: Sequence[int], total: int, bounds_ms: Sequence[int],
                       q: float) -> float | None:  # fmt: skip
    """The q-quantile (0..1) in ms of a histogram of ``cumulative`` counts per bound
    (``le``) and ``total``, interpolated within its bucket (Prometheus's
    ``histogram_quantile``); None when empty. Past the last bound: the last bound."""
    if total <= 0:
        return None
    rank, lower, below = q * total, 0.0, 0
    for bound, upto in zip(bounds_ms, cumulative, strict=False):
        if upto >= rank and upto > below:
            return lower + (bound - lower) * (rank - below) / (upto - below)
        lower, below = float(bound), upto
    return float(bounds_ms[-1]) if bounds_ms else None
