"""A namespace's settings are stored by its first open and checked by every
later one (pipeline, sidecar, ``stats``, ``dlq``). Suspected and confirmed: ``ftlayer serve
--shards 4`` against a namespace written with 8 shards expired nothing, and ``ftlayer
stats`` with the wrong ``--shards`` or ``--namespace`` printed zeros."""

from __future__ import annotations

import uuid

import pytest

from ftlayer import ConfigError, EmbeddedRedis, FTConfig, FTLayer
from ftlayer.settings import read_settings
from tests.toolkit import cli


def test_the_first_open_stores_the_settings_and_a_mismatch_is_refused(
    redis_server: EmbeddedRedis,
) -> None:
    ns = f"set{uuid.uuid4().hex[:8]}"
    client = redis_server.client()
    first = FTLayer(client, FTConfig(namespace=ns, shards=4, timeout_s=12, buckets=4))
    stored = read_settings(client, ns)
    assert stored is not None and (stored.shards, stored.timeout_s, stored.buckets) == (4, 12, 4)
    FTLayer(client, FTConfig(namespace=ns, shards=4, timeout_s=12, buckets=4, max_replays=9))
    for field, value in (("shards", 8), ("timeout_s", 30.0), ("buckets", 3)):
        kw = {"shards": 4, "timeout_s": 12.0, "buckets": 4, field: value}
        with pytest.raises(ConfigError, match=rf"created with {field}=\S+, this process uses "
                                              rf"{field}={value!r}"):  # fmt: skip
            FTLayer(client, FTConfig(namespace=ns, **kw))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="does not exist"):
        FTLayer(client, FTConfig(namespace=f"{ns}x"), create=False)
    first.clear()
    assert read_settings(client, ns) is None


def test_the_cli_reads_the_namespaces_settings_and_refuses_wrong_ones(
    redis_server: EmbeddedRedis,
) -> None:
    ns = f"set{uuid.uuid4().hex[:8]}"
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, shards=4, timeout_s=60))
    h = layer.handler()
    for i in range(5):
        h.persist_record({"i": i}, source=0)
    h.flush()
    url = ["--redis-url", redis_server.url]
    try:
        out = cli("counters", *url, "--namespace", ns, "--json")  # no --shards: the stored 4
        assert out.returncode == 0, out.stderr
        assert '"pending": 5' in out.stdout
        wrong = cli("counters", *url, "--namespace", ns, "--shards", "8")
        assert wrong.returncode == 1 and "created with shards=4" in wrong.stderr, wrong
        missing = cli("counters", *url, "--namespace", f"{ns}nope")
        assert missing.returncode == 1 and "does not exist" in missing.stderr, missing
        dlq = cli("dlq", "list", *url, "--namespace", f"{ns}nope")
        assert dlq.returncode == 1 and "does not exist" in dlq.stderr, dlq
        serve = cli("serve", *url, "--namespace", ns, "--shards", "8", "--metrics-port", "-1")
        assert serve.returncode == 1 and "created with shards=4" in serve.stderr, serve
    finally:
        layer.clear()
