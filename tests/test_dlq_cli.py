"""``ftlayer dlq`` as an operator uses it, on real dead letters in a real Redis: list with
filters and previews, show one whole, export JSON lines, re-drive by filter."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid

import pytest

from ftlayer import FTConfig, FTLayer
from ftlayer.cli.dlq import parse_since

FTLAYER = [sys.executable, "-m", "ftlayer.cli"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FTLAYER, *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def letters(redis_server):
    """Five dead letters: three failed explicitly (source 0, one each of errors A, B and
    a binary payload), two timed out (source 1)."""
    ns = f"dlq{uuid.uuid4().hex[:8]}"
    layer = FTLayer(redis_server.client(), FTConfig(namespace=ns, timeout_s=0.05, max_replays=0))
    h = layer.handler()
    a = h.persist_record({"order": 1, "sku": "A-1"}, source=0)
    b = h.persist_record({"order": 2, "sku": "B-2"}, source=0)
    c = h.persist_record({"order": 3, "blob": b"\x00\xff"}, source=0)
    h.persist_record({"order": 4}, source=1)
    h.persist_record({"order": 5}, source=1)
    h.flush()
    layer.fail([a], error="ValueError: price missing")
    layer.fail([b], error="KeyError: 'sku'")
    layer.fail([c], error="ValueError: blob")
    time.sleep(0.2)
    while layer.expire_due().processed:
        pass
    assert layer.stats().dead_letters == 5
    yield layer, ["--redis-url", redis_server.url, "--namespace", ns]
    layer.clear()


def test_list_filters_and_previews(letters) -> None:
    layer, common = letters

    def ids(*args: str) -> list[str]:
        out = _cli("dlq", "list", "--json", *common, *args)
        assert out.returncode == 0, out.stderr
        return [d["preview"] for d in json.loads(out.stdout)]

    assert len(ids()) == 5
    assert sorted(ids("--source", "1")) == ['{"order": 4}', '{"order": 5}']
    assert sorted(ids("--reason", "valueerror")) == [
        '{"order": 1, "sku": "A-1"}', '{"order": 3, "blob": {"bytes_hex": "00ff"}}']  # fmt: skip
    assert len(ids("--reason", "timeout")) == 2
    assert len(ids("--limit", "2")) == 2 and ids("--limit", "2") == ids()[-2:]
    assert len(ids("--since", "1h")) == 5
    assert ids("--since", "2999-01-01T00:00") == []
    table = _cli("dlq", "list", *common, "--source", "0")
    assert table.returncode == 0
    assert "KeyError: 'sku'" in table.stdout and '{"order": 2, "sku": "B-2"}' in table.stdout
    assert "(3 shown" in table.stdout
    bad = _cli("dlq", "list", *common, "--since", "yesterday-ish")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "neither a duration" in bad.stderr


def test_show_gives_the_whole_payload_and_every_attempt(letters) -> None:
    layer, common = letters
    listed = json.loads(_cli("dlq", "list", "--json", *common, "--reason", "KeyError").stdout)
    (one,) = listed
    out = _cli("dlq", "show", one["id"], "--json", *common)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["payload"] == {"order": 2, "sku": "B-2"} and d["source"] == 0
    assert [(h["reason"], h["error"]) for h in d["history"]] == [("explicit", "KeyError: 'sku'")]
    text = _cli("dlq", "show", one["id"], *common).stdout
    assert '"sku": "B-2"' in text and "explicit" in text and "KeyError: 'sku'" in text
    missing = _cli("dlq", "show", "00000000000000ff", *common)
    assert missing.returncode == 2 and "no dead letter" in missing.stderr


def test_export_writes_json_lines_and_redrive_by_filter(letters, tmp_path) -> None:
    layer, common = letters
    path = tmp_path / "dlq.jsonl"
    out = _cli("dlq", "export", str(path), *common)
    assert out.returncode == 0 and "exported: 5" in out.stderr
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["payload"]["order"] for r in rows) == [1, 2, 3, 4, 5]
    assert all(r["history"] and r["history"][-1]["time"] for r in rows)
    out = _cli("dlq", "replay", "--reason", "timeout", *common)
    assert out.returncode == 0 and "re-driven: 2" in out.stdout, out.stderr
    st = layer.stats()
    assert (st.dead_letters, st.queued_replays) == (3, 2)
    claimed = layer.claim_replays(1, 10)
    assert sorted(c.frame.decode()["order"] for c in claimed) == [4, 5]
    both = _cli("dlq", "replay", "--all", "--source", "0", *common)
    assert both.returncode == 2 and "ids, --all, or filters" in both.stderr


def test_since_takes_durations_and_iso_times() -> None:
    now = 1_000_000.0
    assert parse_since("90s", now) == (now - 90) * 1000
    assert parse_since("2h", now) == (now - 7200) * 1000
    assert parse_since("1970-01-02T00:00") == 86_400_000
    assert parse_since("1970-01-02T01:00+01:00") == 86_400_000
