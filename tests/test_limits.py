"""Every setting is checked against its encoding when it is built,
and Python and Lua share one source of truth for the limits (ftlayer.limits)."""

from __future__ import annotations

import pytest

from ftlayer import ConfigError, FTConfig, FTLayer
from ftlayer.ids import shard_of
from ftlayer.limits import FLUSH_TOKEN_TTL_MS, MAX_RECORD_BYTES, MAX_REPLAYS, MAX_SHARDS
from ftlayer.spark import FaultTolerance
from serialization import Frame
from serialization.stored import decode_stored, encode_stored


@pytest.mark.parametrize(
    ("field", "bad"),
    [("max_replays", MAX_REPLAYS + 1), ("max_replays", -1), ("shards", MAX_SHARDS + 1),
     ("max_record_bytes", MAX_RECORD_BYTES + 1)],
)  # fmt: skip
def test_a_setting_outside_its_encoding_is_refused_up_front(field: str, bad: int) -> None:
    with pytest.raises(ConfigError, match=f"{field} must be in"):
        FTConfig(**{field: bad})  # type: ignore[arg-type]


def test_the_largest_replay_budget_is_kept_whole(layer: FTLayer) -> None:
    """max_replays=65535 reaches Redis intact (a truncated budget would dead-letter the
    record at its first failure)."""
    top = FTLayer(layer.client, FTConfig(namespace=layer.config.namespace,
                                         max_replays=MAX_REPLAYS))  # fmt: skip
    h = top.handler()
    rid = h.persist_record({"x": 1}, source=0)
    h.flush()
    assert top.persistence.get(rid.source_id).max_replays == MAX_REPLAYS  # type: ignore[union-attr]
    assert top.fail([rid], error="once") == (1, 0, 0)  # replayed, not dead-lettered
    off = FaultTolerance(FTConfig(status="off"))
    with pytest.raises(ConfigError, match="immediate_replays must be in"):
        off.pipeline(immediate_replays=MAX_REPLAYS + 1)


def test_a_stored_record_keeps_the_largest_replay_budget() -> None:
    frame = Frame(1, 2, -3, 4, b"\x90", partition=5, max_replays=MAX_REPLAYS)
    raw = encode_stored(b"\x90", -3, 4, partition=5, max_replays=MAX_REPLAYS)
    assert decode_stored(raw, 1, 2) == frame


def test_lua_remembers_a_flush_token_as_long_as_python_says(layer: FTLayer) -> None:
    h = layer.handler()
    rid = h.persist_record("x", source=0)
    h.flush()
    shard = layer.keyspace[shard_of(rid.source_id, layer.config.shards)]
    tokens = list(layer.client.scan_iter(match=f"{shard.prefix}:flush:*"))
    assert len(tokens) == 1
    ttl = layer.client.pttl(tokens[0])
    assert FLUSH_TOKEN_TTL_MS - 10_000 < ttl <= FLUSH_TOKEN_TTL_MS
