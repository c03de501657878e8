"""Prometheus metrics of one namespace, following Prometheus's naming conventions.

The FT counters live in Redis, so they are read at scrape time (every sidecar of a
namespace reports the same figures); only the rotation figures and the lease belong to
this process. Every series carries a ``namespace`` label, so two pipelines scraped by one
Prometheus never collide. Counters end in ``_total``, gauges never do; no ``_created``
series are exported (``prometheus_client.disable_created_metrics``: they double the series
count and no query here uses them).

Exported (every name is also in ``METRIC_NAMES``, which the shipped Grafana dashboard is
checked against):

* counters: ``ftlayer_persisted_total``, ``ftlayer_completed_total``,
  ``ftlayer_failed_total{reason}``, ``ftlayer_replayed_total``,
  ``ftlayer_replays_claimed_total``, ``ftlayer_replays_vanished_total``,
  ``ftlayer_dead_lettered_total``, ``ftlayer_dead_lettered_again_total``, ``ftlayer_held_total``,
  ``ftlayer_redriven_total``, ``ftlayer_orphans_total``; this sidecar's
  ``ftlayer_rotations_total``, ``ftlayer_rotation_expired_total``;
* gauges: ``ftlayer_pending{source}``, ``ftlayer_queued_replays{source}``,
  ``ftlayer_dead_letters``, ``ftlayer_unsettled_segments``,
  ``ftlayer_oldest_pending_age_seconds``, ``ftlayer_redis_up``,
  ``ftlayer_lease_held{sidecar}``, ``ftlayer_info{version,shards,timeout_s,buckets}``;
* histograms: ``ftlayer_completion_latency_seconds``, ``ftlayer_rotation_seconds``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import prometheus_client
import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ftlayer import __version__
from ftlayer.layer import LATENCY_BOUNDS_MS, FTLayer
from ftlayer.settings import SAFE_POLICY, eviction_policy

__all__ = ["METRIC_NAMES", "METRIC_TYPES", "SidecarMetrics"]

log = logging.getLogger(__name__)

prometheus_client.disable_created_metrics()

_COUNTERS = (  # (FTStats field, metric name without _total, help)
    ("persisted", "persisted", "source records persisted (incl. those completed in-task)"),
    ("completed", "completed", "source records completed"),
    ("replayed", "replayed", "replays scheduled"),
    ("replays_claimed", "replays_claimed", "replays handed to a source task"),
    ("replays_vanished", "replays_vanished", "queued replays found gone when claimed"),
    ("dead_lettered", "dead_lettered", "records moved to the dead letters (each once)"),
    ("dead_lettered_again", "dead_lettered_again",
     "records dead-lettered again that joined their dead letter (a re-run batch)"),
    ("held", "held", "records a stage's open breaker held back (queued again, no attempt)"),
    ("redriven", "redriven", "dead letters re-driven to their replay queue"),
    ("orphans", "orphans", "acker entries of retired or unknown ids collected"),
)
_GAUGES = (  # (FTStats field, metric name, help)
    ("dead_letters", "dead_letters", "dead letters held now"),
    ("unsettled_segments", "unsettled_segments",
     "segments of vectorized batches not settled yet (running, or waiting to time out)"),
    ("oldest_pending_age_s", "oldest_pending_age_seconds",
     "upper bound on the age of the oldest record with a live timeout (0: none)"),
)  # fmt: skip

METRIC_TYPES: dict[str, str] = {
    **{f"ftlayer_{name}_total": "counter" for _, name, _ in _COUNTERS},
    **{f"ftlayer_{name}": "gauge" for _, name, _ in _GAUGES},
    "ftlayer_failed_total": "counter", "ftlayer_rotations_total": "counter",
    "ftlayer_rotation_expired_total": "counter", "ftlayer_pending": "gauge",
    "ftlayer_queued_replays": "gauge", "ftlayer_redis_up": "gauge",
    "ftlayer_redis_noeviction": "gauge", "ftlayer_info": "gauge",
    "ftlayer_lease_held": "gauge", "ftlayer_completion_latency_seconds": "histogram",
    "ftlayer_rotation_seconds": "histogram",
}  # fmt: skip
METRIC_NAMES = frozenset(METRIC_TYPES)
"""Every metric family a sidecar exports (histograms by their family name)."""


class _FTCollector(Collector):
    """The namespace's counters, read from Redis at each scrape."""

    def __init__(self, layer: FTLayer) -> None:
        self.layer = layer
        self.ns = layer.config.namespace

    def _family(self, kind: type, name: str, doc: str, labels: Iterable[str] = ()) -> Any:
        return kind(name, doc, labels=["namespace", *labels])

    def collect(self) -> Iterable[Metric]:
        ns, cfg = self.ns, self.layer.config
        info = self._family(GaugeMetricFamily, "ftlayer_info", "this namespace's settings",
                            ["version", "shards", "timeout_s", "buckets"])  # fmt: skip
        info.add_metric([ns, __version__, str(cfg.shards), f"{cfg.timeout_s:g}",
                         str(cfg.buckets)], 1)  # fmt: skip
        yield info
        up = self._family(GaugeMetricFamily, "ftlayer_redis_up", "1 if Redis answered this scrape")
        try:
            st = self.layer.stats()
        except redis.RedisError as e:
            log.warning("scrape could not read stats error=%s", e)
            up.add_metric([ns], 0)
            yield up
            return
        up.add_metric([ns], 1)
        yield up
        try:
            policy = eviction_policy(self.layer.client)
        except redis.RedisError:  # the counters were read: the scrape goes on without it
            policy = None
        if policy is not None:
            ok = self._family(GaugeMetricFamily, "ftlayer_redis_noeviction",
                              "1 if Redis' maxmemory-policy is noeviction (0: it may evict a "
                              "pending record)")  # fmt: skip
            ok.add_metric([ns], 1 if policy == SAFE_POLICY else 0)
            yield ok
        for field, name, doc in _COUNTERS:
            c = self._family(CounterMetricFamily, f"ftlayer_{name}", doc)
            c.add_metric([ns], getattr(st, field))
            yield c
        failed = self._family(CounterMetricFamily, "ftlayer_failed", "failures by reason",
                              ["reason"])  # fmt: skip
        failed.add_metric([ns, "explicit"], st.failed_explicit)
        failed.add_metric([ns, "timeout"], st.failed_timeout)
        yield failed
        pending = self._family(GaugeMetricFamily, "ftlayer_pending",
                               "records stored and not yet complete or dead-lettered",
                               ["source"])  # fmt: skip
        queued = self._family(GaugeMetricFamily, "ftlayer_queued_replays",
                              "pending records waiting in their replay queue",
                              ["source"])  # fmt: skip
        for source, n in sorted(st.pending_by_source.items()):
            pending.add_metric([ns, str(source)], n)
            queued.add_metric([ns, str(source)], st.queued_by_source.get(source, 0))
        yield pending
        yield queued
        for field, name, doc in _GAUGES:
            g = self._family(GaugeMetricFamily, f"ftlayer_{name}", doc)
            g.add_metric([ns], getattr(st, field) or 0)
            yield g
        buckets = [(str(b / 1000), st.latency_buckets[str(b)]) for b in LATENCY_BOUNDS_MS]
        buckets.append(("+Inf", st.latency_count))
        h = self._family(HistogramMetricFamily, "ftlayer_completion_latency_seconds",
                         "persist (or claim) to completion")  # fmt: skip
        h.add_metric([ns], buckets, st.latency_sum_ms / 1000)
        yield h


class SidecarMetrics:
    """The registry of one sidecar: Redis-backed figures plus its own."""

    def __init__(self, layer: FTLayer, sidecar_id: str) -> None:
        ns = layer.config.namespace
        self.registry = CollectorRegistry()
        self.registry.register(_FTCollector(layer))
        r = self.registry
        self.rotations = Counter("ftlayer_rotations", "rotations run by this sidecar",
                                 ["namespace"], registry=r).labels(ns)  # fmt: skip
        self.rotation_seconds = Histogram(
            "ftlayer_rotation_seconds", "duration of one rotation (expire_due)", ["namespace"],
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 60), registry=r,
        ).labels(ns)  # fmt: skip
        self.expired = Counter("ftlayer_rotation_expired",
                               "due timeout entries handled by this sidecar", ["namespace"],
                               registry=r).labels(ns)  # fmt: skip
        self.lease = Gauge("ftlayer_lease_held", "1 if this sidecar holds the rotation lease",
                           ["namespace", "sidecar"], registry=r).labels(ns, sidecar_id)  # fmt: skip

    def render(self) -> bytes:
        return generate_latest(self.registry)
