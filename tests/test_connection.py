"""ftlayer.connection: every client ftlayer makes sends a large argument (a segment, a
flush chunk) as its own buffer, not copied into the command, on one server and on a cluster."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ftlayer import ConfigError, FTConfig
from ftlayer.connection import BufferPacker, connect, is_cluster
from ftlayer.spark.vector_tasks import segment_bytes


def test_a_memoryview_argument_is_sent_as_it_is_and_other_commands_by_hiredis() -> None:
    packer = BufferPacker()
    blob = memoryview(os.urandom(1 << 20))
    chunks = packer.pack("SET", "k", blob)
    assert any(c is blob for c in chunks), "the value was copied into the command"
    assert b"".join(bytes(c) for c in chunks).endswith(bytes(blob) + b"\r\n")
    small = packer.pack("SET", "k", b"v")
    assert small == [b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"]


def each_connection(client: Any) -> Iterator[Any]:
    """A connection of each pool of ``client`` (one server's, or a cluster's node pools),
    given back after the caller looked at it; at least one."""
    pools = [client.connection_pool] if not is_cluster(client) else [
        n.redis_connection.connection_pool for n in client.get_nodes() if n.redis_connection
    ]  # fmt: skip
    assert pools
    for pool in pools:
        conn = pool.get_connection()
        try:
            yield conn
        finally:
            pool.release(conn)


def test_every_connection_packs_views_without_copying_them(backend_url: str) -> None:
    """Catches: a client (one server, or a cluster's node pools) still packing with
    hiredis, which copies a segment into the command, and a view
    arriving in Redis other than it left."""
    client = connect(backend_url)
    blob = os.urandom(3 << 20)
    key = f"conn-test:{uuid.uuid4().hex}"
    client.set(key, memoryview(blob), px=60_000)
    assert client.get(key) == blob
    with client.pipeline(transaction=False) as pipe:
        pipe.set(key, memoryview(blob[::-1]), px=60_000)
        pipe.get(key)
        assert pipe.execute()[-1] == blob[::-1]
    for conn in each_connection(client):
        assert isinstance(conn._command_packer, BufferPacker)
    client.delete(key)


def test_every_connection_shares_one_driver_info(backend_url: str) -> None:
    """Every connection of a client ftlayer makes (one server, a cluster's node pools)
    carries the one ``DriverInfo`` made at import, naming the installed redis-py. Catches:
    redis-py making its own for each new connection, which looks its version up among the
    installed distributions -- a scan of ``sys.path``, about 150 ms the first time in a
    Spark Python worker, whose path holds Spark's core jar."""
    import redis

    from ftlayer import connection

    if connection._DRIVER_INFO is None:  # only a redis-py without DriverInfo (it looks
        import importlib.util  # its version up once, at import): nothing to share

        assert importlib.util.find_spec("redis.driver_info") is None
        return
    client = connect(backend_url)
    client.ping()
    for conn in each_connection(client):
        assert conn.driver_info is connection._DRIVER_INFO
        assert conn.driver_info.lib_version == redis.__version__


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_a_segment_is_stored_with_its_codec_and_reads_back(codec: str) -> None:
    rng = np.random.default_rng(7)
    ids = rng.permutation(200_000)
    batch = pa.RecordBatch.from_arrays([pa.array(ids), pa.array(ids % 64)], names=["id", "key"])
    parts = [batch.slice(i, 10_000) for i in range(0, len(ids), 10_000)]
    blob = segment_bytes(parts, codec)
    assert isinstance(blob, memoryview)
    assert pa.ipc.open_stream(blob).read_all().equals(pa.Table.from_batches(parts))
    raw = len(segment_bytes(parts, "none"))
    assert (len(blob) < raw * 0.8) == (codec != "none"), (codec, len(blob), raw)


def test_an_unknown_segment_codec_is_refused() -> None:
    with pytest.raises(ConfigError, match="segment_codec must be"):
        FTConfig(segment_codec="gzip")  # type: ignore[arg-type]
