"""The embedded Redis ran without persistence and said
nothing, so a restart lost all FT state. Now ``FTConfig(embedded_data_dir=...)`` gives it
an append-only file, and without one ``FTLayer.open`` warns once."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

import ftlayer.layer
from ftlayer import FTConfig, FTLayer


def test_an_embedded_redis_with_a_data_dir_survives_kill_9(tmp_path: Path) -> None:
    cfg = FTConfig(namespace="keep", embedded_data_dir=str(tmp_path / "redis"))
    first = FTLayer.open(cfg)
    assert first.embedded is not None
    h = first.handler()
    for i in range(50):
        h.persist_record({"i": i}, source=0)
    h.flush()
    time.sleep(1.5)  # appendfsync everysec: what is older than a second is on disk
    os.kill(first.embedded.pid, signal.SIGKILL)  # type: ignore[arg-type]
    first.close()
    again = FTLayer.open(cfg)
    try:
        st = again.stats()
        assert (st.pending, st.persisted) == (50, 50), st
    finally:
        again.close()


def test_without_a_data_dir_the_embedded_redis_warns_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ftlayer.layer, "_warned", [])
    with caplog.at_level(logging.WARNING, logger="ftlayer"):
        for _ in range(2):
            FTLayer.open(FTConfig(namespace=f"v{uuid.uuid4().hex[:6]}")).close()
    warnings = [r for r in caplog.records if "without persistence" in r.getMessage()]
    assert len(warnings) == 1
