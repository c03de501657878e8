"""The sidecar's HTTP endpoint: a small WSGI app on prometheus_client's own server.

* ``/metrics``: prometheus_client's WSGI app over the sidecar's registry (text format,
  OpenMetrics on request, gzip when asked);
* ``/healthz``: liveness -- 200 while the sidecar's loop is alive, whatever Redis does (a
  Redis outage must not make Kubernetes restart every sidecar);
* ``/readyz``: readiness -- 200 while the loop reached Redis within its last few ticks,
  with the lease state (``leader`` / ``standby``) in the body, else 503;
* ``/``: the status page, ``/api/status``: its data as JSON (ftlayer.service.status) --
  records' data: beyond loopback only with the status token (ftlayer.service.access).

Nothing served changes state (a ``?token=`` link sets a cookie); any other path is a 404.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from ftlayer.service.access import Access
from ftlayer.service.sidecar import Sidecar
from ftlayer.service.status import StatusModel, render_page, status_json

__all__ = ["ServiceServer"]

log = logging.getLogger(__name__)

_Start = Callable[[str, list[tuple[str, str]]], Any]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- wsgiref's name
        log.debug("http " + format, *args)


def _text(start: _Start, ok: bool, body: str | bytes, kind: str = "text/plain") -> Iterable[bytes]:
    data = body.encode() if isinstance(body, str) else body
    headers = [("Content-Type", f"{kind}; charset=utf-8"), ("Content-Length", str(len(data))),
               ("Cache-Control", "no-store")]  # fmt: skip
    start("200 OK" if ok else "503 Service Unavailable", headers)
    return [data]


class ServiceServer:
    """``/``, ``/api/status``, ``/metrics``, ``/healthz`` and ``/readyz`` of one sidecar, in
    a daemon thread; ``access``: who may read the status page (default: the rules of
    ``host`` with no token)."""

    def __init__(self, sidecar: Sidecar, host: str = "127.0.0.1", port: int = 9464,
                 access: Access | None = None) -> None:  # fmt: skip
        self.sidecar = sidecar
        self.access = Access.of(host) if access is None else access
        self._metrics = make_wsgi_app(sidecar.metrics.registry)
        self.status = StatusModel(sidecar, previews=self.access.previews)
        self.httpd = make_server(host, port, self.app, ThreadingWSGIServer, handler_class=_Quiet)
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, name="ftlayer-http", daemon=True
        )

    def app(self, environ: dict[str, Any], start: _Start) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET")])
            return [b"read-only\n"]
        if path == "/metrics":
            return self._metrics(environ, start)
        if path == "/healthz":
            return _text(start, *self.sidecar.alive())
        if path == "/readyz":
            return _text(start, *self.sidecar.ready())
        refused = self.access.answer(environ)
        if refused is not None:
            status, headers, body = refused
            start(status, headers)
            return [body]
        if path == "/api/status":
            return _text(start, True, status_json(self.status.snapshot()), "application/json")
        if path in ("/", "/index.html"):
            return _text(start, True, render_page(self.status.snapshot()), "text/html")
        start("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    def start(self) -> ServiceServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)
