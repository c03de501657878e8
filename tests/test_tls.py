"""``rediss://`` end to end: ftlayer's client speaks TLS (with certificate verification)
to a TLS terminator in front of the real redis-server, as stunnel deployments do. The
bundled redis-server is built without TLS; the client side is what ftlayer owns."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftlayer import EmbeddedRedis, FTConfig, FTLayer
from tests.toolkit import cli


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture(scope="module")
def tls_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    tmp_path = tmp_path_factory.mktemp("tls")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    with EmbeddedRedis(extra_args=("--requirepass", "tls-secret")) as server:
        listener = socket.create_server(("127.0.0.1", 0))
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    raw, _ = listener.accept()
                    conn = ctx.wrap_socket(raw, server_side=True)
                except OSError:
                    continue
                upstream = socket.create_connection(("127.0.0.1", server.port))
                threading.Thread(target=_pipe, args=(conn, upstream), daemon=True).start()
                threading.Thread(target=_pipe, args=(upstream, conn), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        port = listener.getsockname()[1]
        url = (f"rediss://default:tls-secret@127.0.0.1:{port}/0"
               f"?ssl_cert_reqs=required&ssl_ca_certs={cert}")  # fmt: skip
        try:
            yield url, cert
        finally:
            stop.set()
            listener.close()


def test_layer_over_rediss(tls_url) -> None:
    url, _cert = tls_url
    with FTLayer.open(FTConfig(redis_url=url, namespace="tls")) as layer:
        assert layer.embedded is None
        assert layer.client.connection_pool.connection_class.__name__ == "SSLConnection"
        h = layer.handler()
        rid = h.persist_record({"secure": True}, source=0)
        h.flush()
        sink = layer.handler()
        sink.ack(rid)
        assert sink.flush().completed == 1
        assert layer.stats().completed == 1
        layer.clear()


def test_cli_over_rediss_never_prints_the_password(tls_url) -> None:
    url, _cert = tls_url
    FTLayer.open(FTConfig(namespace="tls-cli", redis_url=url)).close()  # the namespace exists
    out = cli("counters", "--json", "--redis-url", url, "--namespace", "tls-cli", timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["pending"] == 0
    assert "tls-secret" not in out.stdout + out.stderr


def test_unverified_certificate_is_refused(tls_url) -> None:
    url, _cert = tls_url
    bare = url.split("?")[0]  # no CA given: the self-signed certificate must not pass
    from ftlayer import RedisUnavailableError

    with pytest.raises(RedisUnavailableError, match="cannot reach Redis"):
        FTLayer.open(FTConfig(redis_url=bare))
