"""Prometheus metrics and health for the sidecar, served on 127.0.0.1 by default.

The FT counters live in Redis, so they are read at scrape time (any sidecar reports the
same figures); only the rotation figures and the lease belong to this process. The HTTP
endpoint serves ``/metrics`` and ``/healthz`` and nothing else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import redis
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from ftlayer.layer import LATENCY_BOUNDS_MS, FTLayer

__all__ = ["MetricsServer", "SidecarMetrics"]

log = logging.getLogger(__name__)


class _FTCollector(Collector):
    """The namespace's counters, read from Redis at each scrape."""

    def __init__(self, layer: FTLayer) -> None:
        self.layer = layer

    def collect(self) -> Iterable[Metric]:
        up = GaugeMetricFamily("ftlayer_redis_up", "1 if Redis answered this scrape")
        try:
            st = self.layer.stats()
        except redis.RedisError as e:
            log.warning("scrape could not read stats error=%s", e)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        for name, value, doc in (
            ("persisted", st.persisted, "source records persisted (incl. completed in-task)"),
            ("completed", st.completed, "source records completed"),
            ("replayed", st.replayed, "replays scheduled"),
            ("dead_lettered", st.dead_lettered, "records moved to the dead-letter hash"),
            ("orphans", st.orphans, "XOR entries of retired or unknown ids collected"),
        ):
            c = CounterMetricFamily(f"ftlayer_{name}", doc)
            c.add_metric([], value)
            yield c
        failed = CounterMetricFamily("ftlayer_failed", "failures by reason", labels=["reason"])
        failed.add_metric(["explicit"], st.failed_explicit)
        failed.add_metric(["timeout"], st.failed_timeout)
        yield failed
        pending = GaugeMetricFamily(
            "ftlayer_pending", "records pending per source", labels=["source"]
        )
        for source, n in sorted(st.pending_by_source.items()):
            pending.add_metric([str(source)], n)
        yield pending
        gauges: tuple[tuple[str, float, str], ...] = (
            ("pending_total", st.pending, "records stored and not complete or dead-lettered"),
            ("queued_replays", st.queued_replays, "replays waiting for a source task"),
            ("dead_letters", st.dead_letters, "dead letters held now"),
            ("oldest_pending_age_seconds", st.oldest_pending_age_s or 0.0,
             "upper bound on the age of the oldest record with a live timeout"),
        )  # fmt: skip
        for gname, gvalue, gdoc in gauges:
            g = GaugeMetricFamily(f"ftlayer_{gname}", gdoc)
            g.add_metric([], gvalue)
            yield g
        buckets = [(str(b / 1000), st.latency_buckets[str(b)]) for b in LATENCY_BOUNDS_MS] + [
            ("+Inf", st.latency_count)
        ]
        h = HistogramMetricFamily(
            "ftlayer_completion_latency_seconds", "persist (or claim) to completion"
        )
        h.add_metric([], buckets, st.latency_sum_ms / 1000)
        yield h


class SidecarMetrics:
    """The registry of one sidecar: Redis-backed counters plus its own figures."""

    def __init__(self, layer: FTLayer, sidecar_id: str) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_FTCollector(layer))
        self.rotations = Counter(
            "ftlayer_rotations", "rotations run by this sidecar", registry=self.registry
        )
        self.rotation_seconds = Histogram(
            "ftlayer_rotation_seconds", "duration of one rotation (expire_due)",
            buckets=(0.001, 0.005, 0.02, 0.1, 0.5, 2, 10, 60), registry=self.registry,
        )  # fmt: skip
        self.expired = Counter(
            "ftlayer_rotation_expired", "due timeout entries handled by this sidecar",
            registry=self.registry,
        )  # fmt: skip
        self.lease = Gauge(
            "ftlayer_lease_held", "1 if this sidecar holds the rotation lease",
            ["sidecar"], registry=self.registry,
        ).labels(sidecar_id)  # fmt: skip

    def render(self) -> bytes:
        return generate_latest(self.registry)


class MetricsServer:
    """``/metrics`` and ``/healthz`` over HTTP in a daemon thread."""

    def __init__(
        self, metrics: SidecarMetrics, healthy: Callable[[], tuple[bool, str]],
        host: str = "127.0.0.1", port: int = 9464,
    ) -> None:  # fmt: skip
        metrics_ref, healthy_ref = metrics, healthy

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 -- http.server's name
                if self.path.split("?")[0] == "/metrics":
                    self._send(200, metrics_ref.render(), "text/plain; version=0.0.4")
                elif self.path.split("?")[0] == "/healthz":
                    ok, why = healthy_ref()
                    self._send(200 if ok else 503, why.encode(), "text/plain")
                else:
                    self._send(404, b"not found\n", "text/plain")

            def _send(self, code: int, body: bytes, ctype: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                log.debug("http " + format, *args)

        self.httpd = ThreadingHTTPServer((host, port), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="ftlayer-metrics", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
