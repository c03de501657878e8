"""The sidecar's status page as an operator sees it: a real `ftlayer serve` process, a real
Redis, records pushed through the FT layer, and the page opened in a real headless
Chromium (Debian's ``chromium`` with ``chromedriver``, through selenium) whose numbers
move while records flow."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftlayer import EmbeddedRedis, FTConfig, FTLayer, FTStats
from ftlayer.service.status import latency_percentile
from tests.serving import Serve
from tests.toolkit import chromium, cli, until, wide_host

EVIL = "<script>alert('x')</script>"
TOKEN = "s3cret-" + uuid.uuid4().hex[:8]


@pytest.fixture
def served(redis_server: EmbeddedRedis, tmp_path: Path) -> Iterator[tuple[FTLayer, Serve]]:
    """A namespace with completed, replayed and dead-lettered records, and its sidecar."""
    ns = f"status-{uuid.uuid4().hex[:8]}"
    # timeout long enough that nothing expires while a test reads the figures
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, timeout_s=60, max_replays=0))
    serve = Serve(redis_server.url, ns, tmp_path / "serve.log", timeout_s=60)
    try:
        complete(layer, 30, source=0)
        h = layer.handler()
        bad = [h.persist_record({"order": i, "note": EVIL}, source=1) for i in range(3)]
        h.flush()
        layer.fail(bad, error="price service said no")  # budget 0: dead letters at once
        h = layer.handler()
        for i in range(5):  # pending: persisted, never acked
            h.persist_record({"order": 100 + i}, source=2)
        h.flush()
        yield layer, serve
    finally:
        serve.stop()
        layer.clear()


def complete(layer: FTLayer, n: int, source: int) -> None:
    """Persist ``n`` records (a source task), then ack them (its sink, another task):
    completed in Redis, with their latency."""
    h = layer.handler()
    rids = [h.persist_record({"order": i}, source=source) for i in range(n)]
    h.flush()
    sink = layer.handler()
    for rid in rids:
        sink.ack(rid)
    sink.flush()


def status(serve: Serve) -> dict:
    code, body = serve.get("/api/status")
    assert code == 200, body
    return json.loads(body)


def test_api_status_reports_what_redis_holds(served: tuple[FTLayer, Serve]) -> None:
    """Catches: figures not the namespace's (another namespace, stale), sources missing,
    dead letters not newest-first or without their decoded payload, the lease holder
    unknown, and rates that are invented before two samples exist."""
    layer, serve = served

    def led() -> dict | None:
        s = status(serve)
        return s if s["lease_holder"] is not None else None

    s = until(led, "a lease holder in /api/status", 10, 0.2)
    st = layer.stats()
    assert s["namespace"] == layer.config.namespace and s["redis_up"] is True
    for key in ("persisted", "completed", "dead_lettered", "dead_letters", "pending",
                "replayed", "failed_explicit"):  # fmt: skip
        assert s["totals"][key] == getattr(st, key), key
    assert s["totals"]["pending"] == 5 and s["totals"]["dead_letters"] == 3
    assert {x["source"]: x["pending"] for x in s["sources"] if x["pending"]} == {2: 5}
    assert s["lease_holder"] == s["sidecar"]["id"] and s["sidecar"]["leader"] is True
    newest = s["dead_letters_newest"]
    assert len(newest) == 3 and all(d["source"] == 1 for d in newest)
    assert [d["time"] for d in newest] == sorted((d["time"] for d in newest), reverse=True)
    assert all(EVIL.replace("'", '\\"') in d["preview"] or "script" in d["preview"]
               for d in newest)  # fmt: skip
    assert {d["error"] for d in newest} == {"price service said no"}
    assert s["latency_ms"]["count"] == st.latency_count == 30
    # rates: from the second sample on, and they see records that complete in between
    complete(layer, 40, source=0)
    time.sleep(0.6)
    rates = status(serve)["rates_per_s"]
    assert rates is not None and rates["completed"] > 0


def test_the_page_escapes_payloads_and_works_without_js(served: tuple[FTLayer, Serve]) -> None:
    """Catches: a payload rendered as markup (a dead letter with <script> would run in
    the operator's browser) and numbers only filled in by JS."""
    layer, serve = served
    code, page = serve.get("/")
    assert code == 200
    assert "<script>alert" not in page and "&lt;script&gt;alert" in page
    assert f'data-k="totals.pending">{layer.stats().pending}<' in page
    assert "price service said no" in page


def test_latency_percentiles_interpolate_within_buckets() -> None:
    """Catches: percentiles off by a bucket, or not interpolated (Prometheus's rule)."""
    st = FTStats(latency_count=20, latency_buckets={"5": 10, "10": 20, "25": 20})
    assert latency_percentile(st, 0.5) == 5.0
    assert latency_percentile(st, 0.9) == 9.0
    assert latency_percentile(FTStats(), 0.5) is None


def test_ftlayer_status_prints_the_url_and_a_summary(served: tuple[FTLayer, Serve]) -> None:
    """Catches: a status command that cannot find the sidecar, a summary without the
    pending count, a traceback instead of one line when nothing answers."""
    _, serve = served
    out = cli("status", "--url", serve.base, timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert f"status page: {serve.base}/" in out.stdout and "pending 5" in out.stdout
    js = cli("status", "--url", serve.base, "--json", timeout_s=60)
    assert json.loads(js.stdout)["totals"]["pending"] == 5
    gone = cli("status", "--url", "http://127.0.0.1:9", timeout_s=60)
    assert gone.returncode == 1 and "Traceback" not in gone.stderr
    assert "no ftlayer sidecar answers" in gone.stderr


def test_in_chromium_the_numbers_move_while_records_flow(
    served: tuple[FTLayer, Serve], redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """On a sidecar bound beyond loopback, logged in by the token link. Catches: a page
    that does not load in a real browser, a login whose cookie the browser does not keep
    (the page's polling then gets 401), a script error, numbers that never update without
    a reload (the polling broken), and the screenshot missing."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    layer, _ = served
    serve = Serve(redis_server.url, layer.config.namespace, tmp_path / "wide.log",
                  "--metrics-host", wide_host(), "--status-token", TOKEN, timeout_s=60)  # fmt: skip
    base = serve.base.replace("//0.0.0.0:", "//127.0.0.1:")
    browser = chromium()
    try:
        browser.get(base + "/")
        assert "needs the status token" in browser.page_source  # refused without it
        browser.get(f"{base}/?token={TOKEN}")
        assert browser.current_url == base + "/"  # the token left the address
        browser.get_log("browser")  # the refusal above was logged: what follows must not be
        cell = browser.find_element(By.CSS_SELECTOR, '[data-k="totals.completed"]')
        before = cell.text
        assert before == "30"
        for _ in range(5):  # records flow for a few seconds
            complete(layer, 200, source=0)
            time.sleep(0.5)
        want = f"{30 + 5 * 200:,}"
        WebDriverWait(browser, 10).until(lambda b: cell.text == want)
        rate = browser.find_element(By.CSS_SELECTOR, '[data-k="rates_per_s.completed"]')
        WebDriverWait(browser, 10).until(lambda b: rate.text not in ("", "–", "0"))
        logs = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert logs == [], logs
        # the committed screenshot comes from tests/spark/test_status_history.py (a real
        # pipeline's stage table and charts)
    finally:
        browser.quit()
        serve.stop()


def _raw(serve: Serve, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict, str]:
    """(status, headers, body) of one GET, redirects not followed."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(serve.base)
    conn = http.client.HTTPConnection(where.hostname, where.port, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        reply = conn.getresponse()
        return reply.status, dict(reply.getheaders()), reply.read().decode()
    finally:
        conn.close()


def test_a_wide_bind_without_a_token_serves_metrics_not_records(
    served: tuple[FTLayer, Serve], redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """Catches: payload previews on a port opened for Prometheus (the page answered anyone
    who reached a pod bound to 0.0.0.0), and probes or scrapes refused with the page."""
    layer, _ = served
    host = wide_host()
    wide = Serve(redis_server.url, layer.config.namespace, tmp_path / "wide.log",
                 "--metrics-host", host, timeout_s=60)  # fmt: skip
    try:
        assert host not in ("127.0.0.1", "localhost") and wide.base.startswith(f"http://{host}:")
        for path in ("/metrics", "/healthz", "/readyz"):
            assert wide.get(path)[0] == 200, path
        for path in ("/", "/api/status", "/index.html"):
            code, body = wide.get(path)
            assert code == 401 and "--status-token" in body, (path, code, body)
            assert "order" not in body and "alert" not in body
    finally:
        wide.stop()


def test_the_status_token_opens_the_page_by_header_or_by_link(
    served: tuple[FTLayer, Serve], redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """Catches: a token not asked for, a wrong one let in, a link whose cookie does not
    open the page (or keeps the token in the address), previews shown beyond loopback by
    default, and `ftlayer status` unable to pass the token."""
    layer, _ = served
    wide = Serve(redis_server.url, layer.config.namespace, tmp_path / "wide.log",
                 "--metrics-host", wide_host(), "--status-token", TOKEN, timeout_s=60)  # fmt: skip
    try:
        assert wide.get("/api/status")[0] == 401
        assert wide.get("/api/status", headers={"Authorization": "Bearer nope"})[0] == 401
        code, body = wide.get("/api/status", headers={"Authorization": f"Bearer {TOKEN}"})
        assert code == 200
        data = json.loads(body)
        assert data["totals"]["dead_letters"] == 3 and data["payload_previews"] is False
        assert [d["preview"] for d in data["dead_letters_newest"]] == [None] * 3
        assert _raw(wide, "/?token=nope")[0] == 401
        code, headers, _ = _raw(wide, f"/?token={TOKEN}")
        assert code == 303 and headers["Location"] == "./"
        cookie = headers["Set-Cookie"].split(";")[0]
        assert TOKEN not in cookie and "HttpOnly" in headers["Set-Cookie"]
        code, _, page = _raw(wide, "/", {"Cookie": cookie})
        assert code == 200 and "Newest dead letters" in page and "previews are off" in page
        assert "alert(" not in page and "&quot;order&quot;" not in page  # no preview
        assert _raw(wide, "/", {"Cookie": "ftlayer_status=" + "0" * 64})[0] == 401
        out = cli("status", "--url", wide.base, "--status-token", TOKEN, timeout_s=60)
        assert out.returncode == 0 and "pending 5" in out.stdout, out.stderr
        refused = cli("status", "--url", wide.base, timeout_s=60)
        assert refused.returncode == 1 and "asks for its status token" in refused.stderr
    finally:
        wide.stop()


def test_previews_can_be_turned_off_on_loopback_and_on_beyond_it(
    served: tuple[FTLayer, Serve], redis_server: EmbeddedRedis, tmp_path: Path
) -> None:
    """Catches: --no-payload-preview ignored, and --payload-preview not honoured beyond
    loopback (an operator who chose to show them behind the token)."""
    layer, loud = served
    assert all(d["preview"] for d in status(loud)["dead_letters_newest"])  # loopback: on
    ns = layer.config.namespace
    quiet = Serve(redis_server.url, ns, tmp_path / "quiet.log", "--no-payload-preview",
                  timeout_s=60)  # fmt: skip
    shown = Serve(redis_server.url, ns, tmp_path / "shown.log", "--metrics-host", wide_host(),
                  "--status-token", TOKEN, "--payload-preview", timeout_s=60)  # fmt: skip
    try:
        assert [d["preview"] for d in status(quiet)["dead_letters_newest"]] == [None] * 3
        code, body = shown.get("/api/status", headers={"Authorization": f"Bearer {TOKEN}"})
        assert code == 200 and all(d["preview"] for d in json.loads(body)["dead_letters_newest"])
    finally:
        quiet.stop()
        shown.stop()
