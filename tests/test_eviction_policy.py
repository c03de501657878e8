"""A Redis that may evict keys loses pending records with no error: ftlayer refuses it
unless told otherwise, and then says so wherever an operator looks (real redis-servers,
a real sidecar and its HTTP endpoints)."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
import uuid

import pytest

from ftlayer import EmbeddedRedis, FTConfig, FTLayer
from ftlayer.errors import ConfigError
from ftlayer.service.http import ServiceServer
from ftlayer.service.sidecar import Sidecar
from tests.serving import Serve
from tests.toolkit import cli, until


@pytest.fixture
def evicting(make_redis) -> EmbeddedRedis:
    """A redis-server of its own, set to ``allkeys-lru`` as a cache would be."""
    server = make_redis()
    server.client().config_set("maxmemory-policy", "allkeys-lru")
    return server


def _config(**kw: object) -> FTConfig:
    return FTConfig(namespace=f"ev{uuid.uuid4().hex[:8]}", **kw)  # type: ignore[arg-type]


def test_an_evicting_redis_is_refused_in_one_line(evicting: EmbeddedRedis) -> None:
    with pytest.raises(ConfigError) as e:
        FTLayer(evicting.client(), _config())
    said = str(e.value)
    assert "maxmemory-policy allkeys-lru" in said and "noeviction" in said, said
    assert "allow_eviction=True" in said and "\n" not in said
    with pytest.raises(ConfigError):
        FTLayer.open(_config(redis_url=evicting.url))


def test_allowed_it_is_used_and_warned(evicting: EmbeddedRedis, caplog) -> None:
    caplog.set_level(logging.WARNING)
    from ftlayer import settings

    settings._warned.clear()
    layer = FTLayer(evicting.client(), _config(allow_eviction=True))
    assert layer.eviction_policy == "allkeys-lru"
    h = layer.handler()
    h.persist_record({"n": 1}, source=0)
    h.flush()
    assert layer.stats().pending == 1
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records)


def test_an_operator_look_only_warns(evicting: EmbeddedRedis) -> None:
    cfg = _config(allow_eviction=True)
    FTLayer(evicting.client(), cfg)  # the namespace exists
    look = FTLayer(evicting.client(), FTConfig(namespace=cfg.namespace), create=False)
    assert look.eviction_policy == "allkeys-lru"


def test_noeviction_passes_quietly(redis_server: EmbeddedRedis) -> None:
    assert FTLayer(redis_server.client(), _config()).eviction_policy == "noeviction"


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_the_sidecar_shows_it_until_it_is_fixed(evicting: EmbeddedRedis) -> None:
    layer = FTLayer(evicting.client(), _config(allow_eviction=True, timeout_s=1.0))
    sidecar = Sidecar(layer, lease_s=2.0)
    sidecar.POLICY_S = 0.2  # re-read the policy quickly
    server = ServiceServer(sidecar, port=0).start()
    sidecar.start()
    try:
        until(lambda: sidecar.ready()[0], "the sidecar to be ready", 10, 0.05)
        code, body = _get(server.url + "/readyz")
        assert code == 200 and "warning: redis maxmemory-policy is allkeys-lru" in body, body
        status = json.loads(_get(server.url + "/api/status")[1])
        assert any("allkeys-lru" in w for w in status["warnings"]), status
        page = _get(server.url + "/")[1]
        assert "warning: redis maxmemory-policy is allkeys-lru" in page
        metrics = _get(server.url + "/metrics")[1]
        assert f'ftlayer_redis_noeviction{{namespace="{layer.config.namespace}"}} 0.0' in metrics

        evicting.client().config_set("maxmemory-policy", "noeviction")  # the fix
        until(lambda: not sidecar.warnings(), "the sidecar's warning to clear", 10, 0.05)
        assert _get(server.url + "/readyz")[1].count("warning") == 0
        assert json.loads(_get(server.url + "/api/status")[1])["warnings"] == []
        metrics = _get(server.url + "/metrics")[1]
        assert f'ftlayer_redis_noeviction{{namespace="{layer.config.namespace}"}} 1.0' in metrics
    finally:
        sidecar.stop()
        server.stop()


def test_the_command_line_refuses_or_warns(evicting: EmbeddedRedis, tmp_path) -> None:
    ns = f"ev{uuid.uuid4().hex[:8]}"
    common = ["--redis-url", evicting.url, "--namespace", ns]
    refused = cli("serve", *common, "--metrics-port", "-1", timeout_s=60)
    assert refused.returncode == 1, refused
    assert "maxmemory-policy allkeys-lru" in refused.stderr and "Traceback" not in refused.stderr

    serve = Serve(evicting.url, ns, tmp_path / "serve.log", "--allow-eviction")
    try:
        until(lambda: serve.lease() is not None, "the sidecar's lease", 20)
        code, body = serve.get("/readyz")
        assert code == 200 and "warning: redis maxmemory-policy is allkeys-lru" in body, body
    finally:
        serve.stop()
    counters = cli("counters", *common, timeout_s=60)
    assert counters.returncode == 0, counters.stderr
    assert counters.stderr.startswith("warning: redis maxmemory-policy is allkeys-lru")
    js = cli("counters", "--json", *common, timeout_s=60)
    assert json.loads(js.stdout)["warnings"], js.stdout
