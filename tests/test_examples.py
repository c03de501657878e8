"""The examples in examples/ run as a user runs them: real subprocesses, a real Redis, a
real ``ftlayer serve`` sidecar, and for the file-stream job a ``kill -9`` mid-stream and a
restart from its checkpoint -- every record ends in the sink or the dead letters."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ftlayer import EmbeddedRedis
from tests.serving import Serve

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _example(name: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)  # fmt: skip


def _failure(out: subprocess.CompletedProcess[str]) -> str:
    """What a failed example said: its stdout's end, the first lines of stderr naming an
    error (a JVM stack trace repeats its last frames for pages), and stderr's end."""
    errors = [ln for ln in out.stderr.splitlines() if "Error" in ln or "Exception" in ln]
    return "\n".join([f"exit {out.returncode}; stdout: {out.stdout[-1500:]}",
                      "first errors: " + "\n".join(errors[:15]),
                      f"stderr end: {out.stderr[-1500:]}"])  # fmt: skip


def _orders(folder: Path, first: int, n: int, files: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    per = n // files
    for f in range(files):
        rows = range(first + f * per, first + (f + 1) * per)
        lines = [json.dumps({"id": i, "customer": i % 37, "amount": i % 90}) for i in rows]
        (folder / f"orders-{first + f * per:08d}.json").write_text("\n".join(lines) + "\n")


def _written(folder: Path) -> list[int]:
    return [json.loads(line)["id"] for p in folder.glob("part-*.jsonl")
            for line in p.read_text().splitlines()]  # fmt: skip


def test_vectorized_example_loses_nothing(tmp_path: Path, redis_server: EmbeddedRedis) -> None:
    """Catches: an example that no longer runs against the API, and a pipeline that loses
    a record (the Parquet output plus the dead letters must hold every order once)."""
    out = _example("vectorized_map_batches.py", "--orders", "4000", "--redis-url",
                   redis_server.url, "--output", str(tmp_path / "out"))  # fmt: skip
    assert out.returncode == 0, _failure(out)
    assert "lost=0" in out.stdout and "dead_letters=1" in out.stdout, out.stdout
    ids = pq.read_table(tmp_path / "out").column("id").to_pylist()
    assert sorted(ids) == [i for i in range(4000) if i != 13]


def test_file_stream_example_survives_kill_9_and_a_restart(
    tmp_path: Path, redis_server: EmbeddedRedis
) -> None:
    """Catches: a job that cannot restart from its checkpoint, records of the batch the
    job was killed in lost (Spark re-runs it; ftlayer replays what was in flight), and
    files added while it was down never read."""
    inp, out, ckpt = tmp_path / "in", tmp_path / "out", tmp_path / "ckpt"
    _orders(inp, 0, 6000, 6)
    args = ["--input", str(inp), "--output", str(out), "--checkpoint", str(ckpt),
            "--redis-url", redis_server.url, "--namespace", f"fs-{uuid.uuid4().hex[:6]}",
            "--timeout-s", "3"]  # fmt: skip
    cmd = [sys.executable, str(EXAMPLES / "file_stream.py"), *args]
    job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while len(_written(out)) < 1000 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _written(out), "the job wrote nothing before the kill"
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=30)
    _orders(inp, 6000, 2000, 2)  # more orders arrive while the job is down
    again = _example("file_stream.py", *args, "--once")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "pending=0" in again.stdout, again.stdout
    got = _written(out)
    assert set(got) == set(range(8000)), f"lost: {sorted(set(range(8000)) - set(got))[:20]}"


def test_rate_example_with_a_sidecar_loses_nothing(
    tmp_path: Path, redis_server: EmbeddedRedis
) -> None:
    """Catches: unconfirmed writes never replayed (the sidecar must time them out), and an
    example that rotates itself instead of leaving the clock to the sidecar."""
    ns = f"rate-{uuid.uuid4().hex[:6]}"
    serve = Serve(redis_server.url, ns, tmp_path / "serve.log", timeout_s=2)
    try:
        out = _example("rate_with_sidecar.py", "--redis-url", redis_server.url,
                       "--namespace", ns, "--seconds", "8", "--rows-per-second", "500",
                       "--drop-rate", "0.05", "--timeout-s", "2")  # fmt: skip
    finally:
        serve.stop()
    assert out.returncode == 0, _failure(out)
    fields = dict(kv.split("=") for kv in out.stdout.split())
    assert int(fields["produced"]) > 1000 and fields["lost"] == "0", out.stdout
    assert int(fields["timed_out"]) > 0, "the sidecar timed out the unconfirmed writes"
