"""A source belongs to the pipeline that first ran it (ftlayer.sources), and
``ftlayer sources`` shows and hands over owners: on a real Redis."""

from __future__ import annotations

import json
import uuid

import pytest

from ftlayer import FTConfig, FTLayer
from ftlayer.errors import ConfigError
from ftlayer.sources import claim_source, forget_source, sources
from tests.toolkit import cli


def test_the_first_owner_keeps_a_source_until_it_is_handed_over(redis_server) -> None:
    """Catches: a second identity accepted (replays exchanged), the owner overwritten by
    a refused one, a source handed over while records of it are pending."""
    ns = f"src{uuid.uuid4().hex[:8]}"
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns))
    try:
        client = layer.client
        claim_source(client, ns, 0, "a @ struct<id:bigint>")
        claim_source(client, ns, 0, "a @ struct<id:bigint>")  # the same pipeline again
        with pytest.raises(ConfigError, match=r"belongs to pipeline \[a @ struct<id:bigint>\]; "
                                              r"this is \[b @ struct<n:bigint>\]"):
            claim_source(client, ns, 0, "b @ struct<n:bigint>")
        claim_source(client, ns, 1, "b @ struct<n:bigint>")  # another source is free
        assert sources(client, ns) == {0: "a @ struct<id:bigint>", 1: "b @ struct<n:bigint>"}

        h = layer.handler()
        rid = h.persist_record({"id": 1}, source=0)
        h.flush()
        common = ["--redis-url", redis_server.url, "--namespace", ns]
        out = cli("sources", "--forget", "0", *common)
        assert out.returncode != 0 and "1 pending records" in out.stderr, out.stderr
        with pytest.raises(ConfigError, match="drain its pipeline first"):
            forget_source(client, ns, 0, pending=1)
        layer.fail([rid], error="x", max_replays=0)  # dead-lettered: nothing pending
        out = cli("sources", "--forget", "0", "--json", *common)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == {"forgot": True,
                                          "sources": {"1": "b @ struct<n:bigint>"}}
        claim_source(client, ns, 0, "b @ struct<n:bigint>")  # the new owner
        text = cli("sources", *common).stdout
        assert "source 0     b @ struct<n:bigint>" in text, text
    finally:
        layer.clear()
