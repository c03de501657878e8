"""The acker service, ``ftlayer serve``: what runs beside Redis, not inside Spark.

* ftlayer.service.sidecar -- the rotation loop: holds the namespace's lease, expires due
  timeouts, keeps no state of its own (everything is in Redis; kill it at any moment).
* ftlayer.service.metrics -- Prometheus metrics: the namespace's counters read from Redis
  at scrape time, plus this sidecar's rotation figures and lease.
* ftlayer.service.http -- the HTTP endpoint: ``/metrics`` (prometheus_client's own WSGI
  app and server), ``/healthz`` (liveness: the loop is alive), ``/readyz`` (Redis
  reachable, lease state). Read-only: nothing served changes state.
* ftlayer.service.process -- ``ftlayer serve`` as a child process (the demo, the cluster
  run and the tests start it so).
"""

from __future__ import annotations

from ftlayer.service.http import ServiceServer
from ftlayer.service.metrics import SidecarMetrics
from ftlayer.service.sidecar import Sidecar

__all__ = ["ServiceServer", "Sidecar", "SidecarMetrics"]
