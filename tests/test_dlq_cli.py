"""``ftlayer dlq`` as an operator uses it, on real dead letters in a real Redis: list with
filters and previews, show one whole, export JSON lines and Parquet (read back by Spark),
re-drive by filter, as a dry run, or paced (``--rate``, Ctrl-C), purge by filter or id."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import uuid

import msgpack
import pytest

from ftlayer import FTConfig, FTLayer
from ftlayer.cli.dlq import parse_since
from tests.toolkit import CLI, cli


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
        out = cli("dlq", "list", "--json", *common, *args)
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
    table = cli("dlq", "list", *common, "--source", "0")
    assert table.returncode == 0
    assert "KeyError: 'sku'" in table.stdout and '{"order": 2, "sku": "B-2"}' in table.stdout
    assert "(3 shown" in table.stdout
    bad = cli("dlq", "list", *common, "--since", "yesterday-ish")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "neither a duration" in bad.stderr


def test_show_gives_the_whole_payload_and_every_attempt(letters) -> None:
    layer, common = letters
    listed = json.loads(cli("dlq", "list", "--json", *common, "--reason", "KeyError").stdout)
    (one,) = listed
    out = cli("dlq", "show", one["id"], "--json", *common)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["payload"] == {"order": 2, "sku": "B-2"} and d["source"] == 0
    assert [(h["reason"], h["error"]) for h in d["history"]] == [("explicit", "KeyError: 'sku'")]
    text = cli("dlq", "show", one["id"], *common).stdout
    assert '"sku": "B-2"' in text and "explicit" in text and "KeyError: 'sku'" in text
    missing = cli("dlq", "show", "00000000000000ff", *common)
    assert missing.returncode == 1 and "no dead letter" in missing.stderr  # runtime, not usage


def test_export_writes_json_lines_and_redrive_by_filter(letters, tmp_path) -> None:
    layer, common = letters
    path = tmp_path / "dlq.jsonl"
    out = cli("dlq", "export", str(path), *common)
    assert out.returncode == 0 and "exported: 5" in out.stderr
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["payload"]["order"] for r in rows) == [1, 2, 3, 4, 5]
    assert all(r["history"] and r["history"][-1]["time"] for r in rows)
    out = cli("dlq", "replay", "--reason", "timeout", *common)
    assert out.returncode == 0 and "re-driven: 2" in out.stdout, out.stderr
    st = layer.stats()
    assert (st.dead_letters, st.queued_replays) == (3, 2)
    claimed = layer.claim_replays(1, 10)
    assert sorted(c.frame.decode()["order"] for c in claimed) == [4, 5]
    both = cli("dlq", "replay", "--all", "--source", "0", *common)
    assert both.returncode == 2 and "ids, --all, or filters" in both.stderr


def test_since_takes_durations_and_iso_times() -> None:
    now = 1_000_000.0
    assert parse_since("90s", now) == (now - 90) * 1000
    assert parse_since("2h", now) == (now - 7200) * 1000
    assert parse_since("1970-01-02T00:00") == 86_400_000
    assert parse_since("1970-01-02T01:00+01:00") == 86_400_000


def _table(text: str) -> list[tuple[str, str, int]]:
    """(source, reason, count) rows of a ``--dry-run``'s table."""
    rows = re.findall(r"^ +(\d+|\?) +(\w+) +(\d+)$", text, re.M)
    return [(source, reason, int(n)) for source, reason, n in rows]


def test_replay_dry_run_counts_per_source_and_reason_and_changes_nothing(letters) -> None:
    """Catches: a dry run that re-drives, counts that ignore the filter, a breakdown that
    is not per source and reason, ids that do not exist passed over in silence."""
    layer, common = letters
    out = cli("dlq", "replay", "--all", "--dry-run", *common)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("dry run: would re-drive 5 dead letters; nothing changed")
    assert _table(out.stdout) == [("0", "explicit", 3), ("1", "timeout", 2)], out.stdout
    out = cli("dlq", "replay", "--reason", "valueerror", "--dry-run", *common)
    assert "would re-drive 2 dead letters" in out.stdout
    assert _table(out.stdout) == [("0", "explicit", 2)], out.stdout
    listed = json.loads(cli("dlq", "list", "--json", *common, "--source", "1").stdout)
    out = cli("dlq", "replay", listed[0]["id"], "00000000000000ff", "--dry-run", *common)
    assert "would re-drive 1 dead letter;" in out.stdout
    assert _table(out.stdout) == [("1", "timeout", 1)]
    assert "not found: 00000000000000ff" in out.stdout
    out = cli("dlq", "replay", "--all", "--rate", "1000", "--dry-run", *common)
    assert "would re-drive 5" in out.stdout
    st = layer.stats()
    assert (st.dead_letters, st.queued_replays, st.redriven) == (5, 0, 0)


def test_replay_at_a_rate_is_paced_with_progress(letters) -> None:
    """``--rate 4`` re-drives 5 dead letters in chunks over about 1.25 s, never faster
    on average than 4 a second, with progress lines on stderr. Catches: a rate ignored
    (all at once), a pace measured without the chunk being sent, no progress."""
    layer, common = letters
    proc = subprocess.Popen([*CLI, "dlq", "replay", "--all", "--rate", "4", *common],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stderr is not None and proc.stdout is not None
    progress = []
    for line in proc.stderr:
        if m := re.match(r"re-driving: (\d+)/5 \(([\d.]+)/s\)$", line.strip()):
            progress.append((time.monotonic(), int(m.group(1)), float(m.group(2))))
    out = proc.stdout.read()
    assert proc.wait(timeout=60) == 0, out
    assert progress and progress[0][1] == 1 and progress[-1][1] == 5, progress
    assert progress[-1][0] - progress[0][0] >= 0.9, "5 at 4/s: the 2nd to 5th take 1 s"
    assert all(rate <= 4.0 for _, _, rate in progress), progress
    m = re.match(r"re-driven: 5 in ([\d.]+) s \(([\d.]+)/s\)$", out.strip())
    assert m and float(m.group(1)) >= 1.2 and float(m.group(2)) <= 4.0, out
    st = layer.stats()
    assert (st.dead_letters, st.queued_replays, st.redriven) == (0, 5, 5)


def test_replay_at_a_rate_stops_cleanly_on_ctrl_c(letters) -> None:
    """Ctrl-C during a paced re-drive: it stops between chunks and says how many went;
    that many are queued and the rest still dead letters. Catches: an interrupt that
    kills a chunk half-counted, or a count that is not what happened."""
    layer, common = letters
    proc = subprocess.Popen([*CLI, "dlq", "replay", "--all", "--rate", "2", *common],
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stderr is not None and proc.stdout is not None
    first = proc.stderr.readline()
    assert first.startswith("re-driving: 1/5"), first + proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    m = re.match(r"re-driven: (\d) of 5, stopped by Ctrl-C after [\d.]+ s; the other (\d) are "
                 r"still dead letters$", out.strip())  # fmt: skip
    assert m, out
    n = int(m.group(1))
    assert 1 <= n < 5 and int(m.group(2)) == 5 - n and "Traceback" not in err
    st = layer.stats()
    assert (st.dead_letters, st.queued_replays, st.redriven) == (5 - n, n, n)


def test_purge_by_filter_or_id_with_dry_run(letters) -> None:
    """Catches: a filtered purge that deletes everything, a dry run that deletes, a
    purge without --yes off a terminal, ids and filters mixed."""
    layer, common = letters
    out = cli("dlq", "purge", "--reason", "timeout", "--dry-run", *common)
    assert out.returncode == 0 and "would purge 2 dead letters" in out.stdout, out.stderr
    assert _table(out.stdout) == [("1", "timeout", 2)]
    out = cli("dlq", "purge", "--dry-run", *common)  # no filter: every one
    assert _table(out.stdout) == [("0", "explicit", 3), ("1", "timeout", 2)]
    refused = cli("dlq", "purge", "--reason", "timeout", *common)  # stdin not a terminal
    assert refused.returncode == 1 and "refusing to purge 2 dead letters without --yes" in (
        refused.stderr)  # fmt: skip
    assert layer.stats().dead_letters == 5
    out = cli("dlq", "purge", "--reason", "timeout", "--yes", *common)
    assert out.returncode == 0 and out.stdout.strip() == "purged: 2", out
    left = json.loads(cli("dlq", "list", "--json", *common).stdout)
    assert len(left) == 3 and {d["source"] for d in left} == {0}
    key_error = [d["id"] for d in left if d["error"].startswith("KeyError")]
    mixed = cli("dlq", "purge", *key_error, "--source", "0", "--yes", *common)
    assert mixed.returncode == 2 and "ids or filters" in mixed.stderr
    out = cli("dlq", "purge", *key_error, "--yes", *common)
    assert out.returncode == 0 and out.stdout.strip() == "purged: 1", out
    again = cli("dlq", "purge", *key_error, "--yes", *common)
    assert again.returncode == 1 and "no dead letters match" in again.stdout
    assert layer.stats().dead_letters == 2
    out = cli("dlq", "purge", "--yes", *common)
    assert out.returncode == 0 and out.stdout.strip() == "purged: 2"
    assert layer.stats().dead_letters == 0


def _jsonable(row: dict) -> dict:
    return {k: {"bytes_hex": bytes(v).hex()} if isinstance(v, bytes | bytearray) else v
            for k, v in row.items() if v is not None}  # fmt: skip


def test_export_parquet_is_what_dlq_list_says_read_by_spark(letters, tmp_path, spark) -> None:
    """Every dead letter, one row, read back by Spark: id, source, attempts, last reason
    and error, time, every failure, lineage, and the payload -- a record's columns where
    it is a map, its bytes (and JSON) where it is not. Catches: columns Spark cannot
    read, a payload struct that drops or retypes a column, a history cut to one."""
    layer, common = letters
    h = layer.handler()
    plain = h.persist_record("not a map", source=2)
    h.flush()
    layer.fail([plain], error="TypeError: not a map")
    (again,) = json.loads(cli("dlq", "list", "--json", *common, "--reason", "KeyError").stdout)
    assert layer.dlq_replay([int(again["id"], 16)]) == 1  # re-driven, failed again:
    (claimed,) = layer.claim_replays(0, 10)  # explicit, redrive, explicit
    layer.fail([claimed.record_id], error="KeyError: 'sku' still")
    path = tmp_path / "dlq.parquet"
    out = cli("dlq", "export", str(path), "--format", "parquet", *common)
    assert out.returncode == 0 and "exported: 6" in out.stderr, out.stderr
    listed = {d["id"]: d for d in json.loads(cli("dlq", "list", "--json", *common).stdout)}
    df = spark.read.parquet(str(path))
    columns = df.select("payload.*").columns  # as they first appear, oldest letter first
    assert sorted(columns) == ["blob", "order", "sku"] and columns[0] == "order", columns
    times = [r.dead_lettered for r in df.select("dead_lettered").collect()]
    assert times == sorted(times)
    assert dict(df.select("payload.*").dtypes) == {"order": "bigint", "sku": "string",
                                                   "blob": "binary"}  # fmt: skip
    rows = df.selectExpr(
        "*", "unix_millis(dead_lettered) AS dead_lettered_ms",
        "transform(history, h -> named_struct('reason', h.reason, 'time_ms', "
        "unix_millis(h.time), 'attempt', h.attempt, 'error', h.error)) AS failures",
    ).collect()  # fmt: skip
    assert sorted(r.id for r in rows) == sorted(listed)
    for r in rows:
        d = listed[r.id]
        for key in ("source", "attempts", "reason", "error", "dead_lettered_ms", "frame_error"):
            assert r[key] == d[key], (key, r[key], d[key])
        assert [f.asDict() for f in r.failures] == [
            {k: v for k, v in f.items() if k != "time"} for f in d["history"]]  # fmt: skip
        letter = layer.persistence.dead_letter(int(r.id, 16))
        assert r.lineage == letter.frame.lineage and bytes(r.payload_raw) == letter.frame.payload
        assert r.payload_error is None and r.payload_json == d["preview"]
        if r.id == f"{plain.source_id:016x}":
            assert r.payload is None and msgpack.unpackb(r.payload_raw) == "not a map"
        else:
            assert _jsonable(r.payload.asDict()) == json.loads(d["preview"]), r.payload
    assert {r.payload.order for r in rows if r.payload} == {1, 2, 3, 4, 5}
    assert sorted(len(r.failures) for r in rows) == [1, 1, 1, 1, 1, 3]
