"""Shared fixtures: a real redis-server per test session (the embedded one ftlayer ships),
and FTLayer objects on fresh namespaces of it."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from ftlayer import EmbeddedRedis, FTConfig, FTLayer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.stop()


@pytest.fixture
def redis_client(redis_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


LayerFactory = Callable[..., FTLayer]


@pytest.fixture
def make_layer(redis_client: redis.Redis) -> Iterator[LayerFactory]:
    """``make_layer(**FTConfig fields)``: an FTLayer on a namespace of its own."""
    made: list[FTLayer] = []

    def make(**overrides: object) -> FTLayer:
        overrides.setdefault("namespace", f"t{uuid.uuid4().hex[:12]}")
        layer = FTLayer(redis_client, FTConfig(**overrides))  # type: ignore[arg-type]
        made.append(layer)
        return layer

    yield make
    for layer in made:
        layer.clear()


@pytest.fixture
def layer(make_layer: LayerFactory) -> FTLayer:
    return make_layer()
