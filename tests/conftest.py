"""Shared fixtures: a real redis-server per test session (the embedded one ftlayer ships),
FTLayer objects on fresh namespaces of it, and a session-scoped local[2] SparkSession whose
Python workers run this interpreter.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from pyspark.sql import SparkSession

from benchmarks._postgres import LocalPostgres
from ftlayer import EmbeddedRedis, FTConfig, FTLayer
from ftlayer.connection import connect
from ftlayer.embedded import EmbeddedCluster, find_redis_server
from ftlayer.errors import EmbeddedRedisError
from tests.faults import ScriptCalls
from tests.quick_jvm import configure as configure_quick_jvm

# every Spark JVM the tests start through spark-submit (this process's and their
# subprocesses') starts quick: C1-only flags and a class-data-sharing archive built once per
# machine (tests/quick_jvm.py)
configure_quick_jvm()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis().start()
    yield server
    server.stop()


RedisFactory = Callable[..., EmbeddedRedis]


@pytest.fixture
def make_redis() -> Iterator[RedisFactory]:
    """``make_redis(**EmbeddedRedis arguments)``: a started redis-server of the test's own
    (to kill, restart, give a replica, a password, a policy), stopped at the test's teardown
    whether it passed or not (its directory removed, unless given). The test may stop,
    kill and start it again in between."""
    made: list[EmbeddedRedis] = []

    def make(**kwargs: Any) -> EmbeddedRedis:
        server = EmbeddedRedis(**kwargs)
        made.append(server)  # before start(): a server that fails to start is cleaned too
        return server.start()

    yield make
    for server in reversed(made):  # replicas (made after their master) first
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """A real PostgreSQL server (Debian's ``postgresql`` package, which .ci/run installs)
    in a temporary directory, for the idempotent sink's tests."""
    with LocalPostgres() as server:
        yield server


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[EmbeddedCluster]:
    """A real 3-master Redis Cluster (cluster-mode redis-servers, slots assigned)."""
    cluster = EmbeddedCluster().start()
    yield cluster
    cluster.stop()


def _redis7_binary() -> str:
    try:
        return find_redis_server(min_version=(7, 0))
    except EmbeddedRedisError as e:
        pytest.fail(f"{e} -- the function-library tests need Redis 7: apt-get install redis-server")


@pytest.fixture(scope="session")
def redis7_server() -> Iterator[EmbeddedRedis]:
    """A real Redis 7 (Debian's ``redis-server`` package, which .ci/run installs): where
    ftlayer runs its scripts as a function library (ftlayer/scripts.py)."""
    server = EmbeddedRedis(binary=_redis7_binary()).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis7_cluster() -> Iterator[EmbeddedCluster]:
    """A real 3-master Redis Cluster of Redis 7 nodes: the library loaded on every master,
    FCALL routed by key, in pipelines too."""
    cluster = EmbeddedCluster(binary=_redis7_binary()).start()
    yield cluster
    cluster.stop()


@pytest.fixture(params=["single", "cluster"])
def backend_url(request: pytest.FixtureRequest, redis_server: EmbeddedRedis) -> str:
    """The URL of one Redis server, then of a 3-master Redis Cluster: a test that takes it
    runs on both (for FTLayer objects on every backend, take ``make_layer``)."""
    if request.param == "single":
        return redis_server.url
    return str(request.getfixturevalue("redis_cluster").url)


@pytest.fixture(params=["evalsha", "fcall"])
def script_calls(request: pytest.FixtureRequest) -> ScriptCalls:
    """Each lost-reply test runs twice: scripts by EVALSHA on the embedded Redis 6.2, and as
    a Redis 7 function library called by FCALL (the default on Redis 7)."""
    if request.param == "evalsha":
        return ScriptCalls(request.getfixturevalue("redis_server"), b"EVALSHA", "eval")
    return ScriptCalls(request.getfixturevalue("redis7_server"), b"FCALL", "functions")


# redis_client's backends: the fixture each one runs on, and whether the scripts run there
# as Redis 7 functions (make_layer then sets script_mode="functions": never EVALSHA unseen)
BACKENDS = {
    "single": ("redis_server", False),
    "cluster": ("redis_cluster", False),
    "functions": ("redis7_server", True),
    "cluster-functions": ("redis7_cluster", True),
}


@pytest.fixture(params=list(BACKENDS))
def redis_client(request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """Every core test that takes this runs on one server (the embedded Redis 6.2: EVALSHA),
    on a 3-master cluster of them, on a Redis 7 server, where the scripts run as functions,
    and on a 3-master cluster of Redis 7 servers (functions on every master)."""
    backend = request.getfixturevalue(BACKENDS[request.param][0])
    client = connect(backend.url) if isinstance(backend, EmbeddedCluster) else backend.client()
    yield client
    client.close()


@pytest.fixture
def redis_url(request: pytest.FixtureRequest, redis_client: redis.Redis) -> str:
    """The URL of the server (or cluster) redis_client talks to, for a CLI or a sidecar."""
    backend = BACKENDS[request.node.callspec.params["redis_client"]][0]
    return str(request.getfixturevalue(backend).url)


LayerFactory = Callable[..., FTLayer]


@pytest.fixture
def make_layer(request: pytest.FixtureRequest, redis_client: redis.Redis) -> Iterator[LayerFactory]:
    """``make_layer(**FTConfig fields)``: an FTLayer on a namespace of its own (on the Redis
    7 server with ``script_mode="functions"``: a library that fails to load fails the test,
    never falls back to EVALSHA unseen)."""
    made: list[FTLayer] = []
    on_functions = BACKENDS[request.node.callspec.params["redis_client"]][1]

    def make(**overrides: object) -> FTLayer:
        overrides.setdefault("namespace", f"t{uuid.uuid4().hex[:12]}")
        if on_functions:
            overrides.setdefault("script_mode", "functions")
        layer = FTLayer(redis_client, FTConfig(**overrides))  # type: ignore[arg-type]
        made.append(layer)
        return layer

    yield make
    for layer in made:
        layer.clear()


@pytest.fixture
def layer(make_layer: LayerFactory) -> FTLayer:
    return make_layer()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON",)}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("ftlayer-partitioners-tests")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.pyspark.python", sys.executable)
            .getOrCreate()
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield session
    session.stop()

