"""The embedded redis-server: found, started, stopped -- and never left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ftlayer import EmbeddedRedis, FTConfig, FTLayer
from ftlayer.connection import redact_url
from ftlayer.embedded import find_redis_server
from tests.toolkit import until


def test_starts_answers_and_stops_cleanly() -> None:
    server = EmbeddedRedis().start()
    pid, d = server.pid, server.data_dir
    assert server.client().ping()
    assert server.url.startswith("redis://127.0.0.1:")
    server.stop()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    assert not d.exists(), "its temporary directory is removed"


def test_dies_with_a_killed_parent(tmp_path) -> None:
    code = (
        "from ftlayer import EmbeddedRedis; import sys, time;"
        "r = EmbeddedRedis().start(); print(r.pid, flush=True); time.sleep(60)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(parent.stdout.readline())
    assert psutil.pid_exists(pid)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    until(lambda: not psutil.pid_exists(pid), "redis-server to die with its parent", 10, 0.05)


def test_layer_open_without_url_uses_embedded_and_close_stops_it() -> None:
    layer = FTLayer.open(FTConfig(namespace="emb"))
    assert layer.embedded is not None
    pid = layer.embedded.pid
    h = layer.handler()
    h.persist_record("x", source=0)
    h.flush()
    assert layer.stats().pending == 1
    layer.close()
    time.sleep(0.1)
    assert not psutil.pid_exists(pid)


def test_layer_open_with_url_and_password(make_redis) -> None:
    server = make_redis(extra_args=("--requirepass", "s3cret"))
    url = f"redis://default:s3cret@127.0.0.1:{server.port}/0"
    with FTLayer.open(FTConfig(redis_url=url, namespace="pw")) as layer:
        assert layer.embedded is None and layer.stats().pending == 0
    assert "s3cret" not in redact_url(url) and "***" in redact_url(url)
    assert "s3cret" not in FTConfig(redis_url=url).summary()


def test_binary_is_checked_to_run() -> None:
    path = find_redis_server()
    out = subprocess.run([path, "--version"], capture_output=True, check=True)
    assert b"Redis server" in out.stdout


def test_bad_url_is_refused() -> None:
    from ftlayer import ConfigError

    with pytest.raises(ConfigError, match="unsupported Redis URL"):
        FTLayer.open(FTConfig(redis_url="http://user:pw@example"))


def test_a_server_started_from_a_short_lived_thread_keeps_running() -> None:
    import threading

    server = EmbeddedRedis()
    t = threading.Thread(target=server.start)
    t.start()
    t.join()
    time.sleep(0.5)  # the starting thread is gone; PDEATHSIG must not have fired
    try:
        assert server.running and server.client().ping()
    finally:
        server.stop()
