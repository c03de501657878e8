"""Wide events read from files, for ``pipeline_overhead --payload-bytes W``: the input files,
the first stage that parses each event's payload with pyarrow.compute, and the streaming
runs (a real file-source query with the replay stream, and replay latency on a quiet
stream).

An event is ``{"id": i, "key": i % 64, "payload": "<W-byte JSON document>"}``; the payload
holds ``amount`` and padding. Stage 1 extracts ``amount`` from it (``pc.extract_regex``)
into the narrow columns the rest of the pipeline uses: what a job reading real events does
first.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from ftlayer import FTConfig
from ftlayer.spark import FaultTolerance, FileSource, Outcome

SCHEMA = "id long, key long, payload string"
_AMOUNT = r'"amount": (?P<amount>[0-9]+)'


def event_lines(lo: int, hi: int, width: int) -> list[str]:
    """Events ``lo..hi-1`` as JSON lines: ``id``, ``key`` (id % 64) and a ``width``-byte
    ``payload`` (a JSON document holding ``amount``)."""
    pad = "x" * max(0, width - len('{"amount": 000, "pad": ""}'))
    return [json.dumps({"id": i, "key": i % 64,
                        "payload": f'{{"amount": {i % 500}, "pad": "{pad}"}}'})
            for i in range(lo, hi)]  # fmt: skip


def write_events(root: Path, n: int, width: int, files: int) -> int:
    """``n`` events in ``files`` JSON-lines files under ``root``; their total bytes."""
    root.mkdir(parents=True, exist_ok=True)
    total = 0
    for f in range(files):
        lines = event_lines(f * n // files, (f + 1) * n // files, width)
        path = root / f"part-{f:04d}.json"
        text = "\n".join(lines) + "\n"
        path.write_text(text)
        total += len(text)
    return total


def amount_of(payload: pa.Array) -> pa.Array:
    """The ``amount`` of each event's payload (int64), by regex: what a stage that reads
    wide events does first."""
    return pc.cast(pc.struct_field(pc.extract_regex(payload, _AMOUNT), [0]), pa.int64())


def parse_stage(b: pa.RecordBatch) -> pa.RecordBatch:
    """Stage 1 on wide events: the amount out of the payload, as ``total``."""
    amount = amount_of(b.column(2))
    return pa.RecordBatch.from_arrays([b.column(0), b.column(1), pc.multiply(amount, 1.2)],
                                      names=["id", "key", "total"])  # fmt: skip


def arrow_parse(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in it:
        yield parse_stage(b)


def read_events(spark: Any, root: Path) -> Any:
    return spark.read.schema(SCHEMA).json(str(root))


class RedisMemory:
    """Samples Redis' ``used_memory`` every 20 ms while in the block; ``peak`` is the
    largest sample above the one taken on entry."""

    def __init__(self, client: redis.Redis) -> None:
        self.client, self.peak, self._stop = client, 0, False

    def __enter__(self) -> RedisMemory:
        import threading

        self.base = int(self.client.info("memory")["used_memory"])
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop:
            used = int(self.client.info("memory")["used_memory"])
            self.peak = max(self.peak, used - self.base)
            time.sleep(0.02)

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()


def net_input_bytes(client: redis.Redis) -> int:
    """Bytes Redis has received from clients so far (its own counter)."""
    return int(client.info("stats")["total_net_input_bytes"])


# -- the streaming runs ----------------------------------------------------------------------
class Stamps:
    """Picklable: records, in Redis, when each id first failed and first reached the sink."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix

    @property
    def r(self) -> redis.Redis:
        cache: dict[Any, redis.Redis] = __import__("sys").__dict__.setdefault("_bench_r", {})
        key = (os.getpid(), self.url)
        if key not in cache:
            cache[key] = redis.Redis.from_url(self.url)
        return cache[key]

    def mark(self, what: str, ids: np.ndarray) -> None:
        if len(ids):
            now = repr(time.time())
            with self.r.pipeline(transaction=False) as p:
                for i in ids.tolist():
                    p.hsetnx(f"{self.prefix}:{what}", str(i), now)
                p.execute()

    def latencies(self) -> list[float]:
        failed = self.r.hgetall(f"{self.prefix}:failed")
        done = self.r.hgetall(f"{self.prefix}:done")
        return [float(done[k]) - float(v) for k, v in failed.items() if k in done]

    def clear(self) -> None:
        self.r.delete(f"{self.prefix}:failed", f"{self.prefix}:done", f"{self.prefix}:seen")


FAIL_SEED = 20_261_130
"""The seed of :func:`failing_attempts`' draws."""


def failing_attempts(rate: float) -> Any:
    """A DataFrame stage's ``failed=`` failing about ``rate`` of its attempts: Spark's
    ``rand`` with a fixed seed (a draw for each row in each batch). The seed is fixed
    because Spark writes it into the code it generates for the stage: an unseeded
    ``rand`` gives every pipeline built a new seed, and each run would compile its
    stage's code again (four classes a streaming run here, where the plain job's code
    comes from Spark's cache) -- a cost of the injection, not of ftlayer, that a stage's
    own ``failed=`` condition does not have."""
    from pyspark.sql import functions as F  # noqa: N812

    return F.rand(FAIL_SEED) < rate


class FailLate:
    """Stage 2, after the shuffle: ``rate`` of the attempts fail (a fresh draw each), or
    (``once_mod``) ids = 3 mod ``once_mod`` on their first attempt, stamped."""

    def __init__(self, fn: Callable[[pa.RecordBatch], pa.RecordBatch], rate: float,
                 stamps: Stamps | None = None, once_mod: int = 0) -> None:  # fmt: skip
        self.fn, self.rate, self.stamps, self.once_mod = fn, rate, stamps, once_mod
        self.__name__ = "fail_late"

    def __call__(self, b: pa.RecordBatch) -> Outcome:
        if not self.once_mod:
            failed = np.random.default_rng().random(b.num_rows) < self.rate
            return Outcome(self.fn(b), failed=failed, errors="injected failure")
        assert self.stamps is not None
        ids = b.column(0).to_numpy()
        cand = np.flatnonzero(ids % self.once_mod == 3)
        with self.stamps.r.pipeline(transaction=False) as p:
            for i in ids[cand].tolist():
                p.sadd(f"{self.stamps.prefix}:seen", i)
            first = cand[np.array(p.execute(), dtype=bool)] if len(cand) else cand
        self.stamps.mark("failed", ids[first])
        return Outcome(self.fn(b), failed=first, errors="injected failure")


class StampSink:
    def __init__(self, stamps: Stamps, consume: Callable[[pa.RecordBatch], Any]) -> None:
        self.stamps, self.consume = stamps, consume

    def __call__(self, b: pa.RecordBatch) -> None:
        self.consume(b)
        self.stamps.mark("done", b.column(0).to_numpy())


def _wait(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.05)


def stream_plain(spark: Any, root: Path, n: int, trigger: str,
                 run_arrow: Callable[[Any], int]) -> float:  # fmt: skip
    """Seconds for a file-source query of plain ``mapInArrow`` stages (``run_arrow``) to
    process the ``n`` events under ``root``, a file per micro-batch."""
    done = [0]
    ck = tempfile.mkdtemp(prefix="ftbench-ck-")

    def each(df: Any, batch_id: int) -> None:
        done[0] += run_arrow(df)

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(str(root))
    t0 = time.perf_counter()
    q = (stream.writeStream.foreachBatch(each).trigger(processingTime=trigger)
         .option("checkpointLocation", ck).start())  # fmt: skip
    try:
        _wait(lambda: done[0] >= n, 1800, "the plain query")
        dt = time.perf_counter() - t0
    finally:
        q.stop()
        shutil.rmtree(ck, ignore_errors=True)
    return dt


def stream_ft(spark: Any, url: str, root: Path, n: int, trigger: str, fail_rate: float,
              stages: tuple[Any, Any, Any], schemas: tuple[str, str],
              by_reference: bool = True) -> float:  # fmt: skip
    """Seconds for the same query through ftlayer (the files kept by reference, or copied
    with ``by_reference=False``; the replay stream; ``fail_rate`` of the attempts failing
    after the shuffle) until every event completed and nothing is pending."""
    first, second, sink = stages
    ft = FaultTolerance(FTConfig(namespace=f"ps-{uuid.uuid4().hex[:6]}", redis_url=url,
                                 max_replays=10, timeout_s=60), replay_limit=1_000_000)  # fmt: skip
    files = FileSource("json", str(root), SCHEMA, maxFilesPerTrigger=1)
    pipeline = (ft.pipeline(source=0, reads=files if by_reference else None, name="bench")
                .map_batches(first, schemas[0]).partition_by(["key"], 4)
                .map_batches(FailLate(second, fail_rate), schemas[1])
                .sink_batches(sink))  # fmt: skip
    ck = tempfile.mkdtemp(prefix="ftbench-ck-")
    layer = ft.layer
    assert layer is not None

    def finished() -> bool:
        st = layer.stats()
        return st.completed + st.dead_lettered >= n and st.pending == 0

    t0 = time.perf_counter()
    stream = (pipeline.stream(spark) if by_reference else
              pipeline.with_replays(files.stream(spark)))  # fmt: skip
    q = (stream.writeStream.foreachBatch(pipeline)
         .trigger(processingTime=trigger).option("checkpointLocation", ck).start())  # fmt: skip
    try:
        _wait(finished, 1800, "the ftlayer query")
        dt = time.perf_counter() - t0
    finally:
        q.stop()
        layer.clear()
        ft.close()
        shutil.rmtree(ck, ignore_errors=True)
    return dt


def replay_latency(spark: Any, url: str, n: int, width: int, stages: tuple[Any, Any, Any],
                   schemas: tuple[str, str], trigger_s: float = 1.0) -> dict[str, Any]:  # fmt: skip
    """Failure to completion, with no new input: one file of ``n`` events, then nothing;
    ids = 3 mod 20 fail after the shuffle on their first attempt (queued at once), ids =
    7 mod 50 are left unconfirmed by the sink (they time out: ``timeout_s=3``, B=3). No
    sidecar: the replay stream rotates the timeouts itself."""
    first, second, consume = stages
    root = Path(tempfile.mkdtemp(prefix="ftbench-quiet-"))
    stamps = Stamps(url, f"lat{uuid.uuid4().hex[:6]}")
    ft = FaultTolerance(FTConfig(namespace=f"pl-{uuid.uuid4().hex[:6]}", redis_url=url,
                                 timeout_s=3.0, buckets=3, max_replays=3))  # fmt: skip
    layer = ft.layer
    assert layer is not None

    class UnconfirmOnce:
        __name__ = "unconfirm_once"

        def __call__(self, b: pa.RecordBatch) -> Outcome:
            ids = b.column(0).to_numpy()
            cand = np.flatnonzero(ids % 50 == 7)
            with stamps.r.pipeline(transaction=False) as p:
                for i in ids[cand].tolist():
                    p.sadd(f"{stamps.prefix}:unc", i)
                fresh = cand[np.array(p.execute(), dtype=bool)] if len(cand) else cand
            stamps.mark("failed", ids[fresh])
            consume(b)
            done = np.setdiff1d(np.arange(len(ids)), fresh)
            stamps.mark("done", ids[done])
            return Outcome(None, unconfirmed=fresh)

    (root / "in").mkdir()
    files = FileSource("json", str(root / "in"), SCHEMA)
    pipeline = (ft.pipeline(source=0, reads=files, name="latency")
                .map_batches(first, schemas[0]).partition_by(["key"], 4)
                .map_batches(FailLate(second, 0, stamps, once_mod=20), schemas[1])
                .sink_batches(UnconfirmOnce()))  # fmt: skip
    ck = root / "ck"
    q = (pipeline.stream(spark).writeStream.foreachBatch(pipeline)
         .trigger(processingTime=f"{trigger_s:g} seconds")
         .option("checkpointLocation", str(ck)).start())  # fmt: skip
    try:
        write_events(root / "in", n, width, 1)
        _wait(lambda: layer.stats().completed >= n and layer.stats().pending == 0, 300,
              "the quiet stream's replays")  # fmt: skip
    finally:
        q.stop()
    lat = sorted(stamps.latencies())
    stamps.clear()
    layer.clear()
    ft.close()
    shutil.rmtree(root, ignore_errors=True)
    cfg = ft.config
    bound = cfg.timeout_s * cfg.buckets / (cfg.buckets - 1) + 2 * trigger_s
    q99 = statistics.quantiles(lat, n=100)[98] if len(lat) > 1 else lat[0]
    return {"records": n, "replayed": len(lat), "p50": round(statistics.median(lat), 3),
            "p99": round(q99, 3), "max": round(lat[-1], 3), "bound_s": bound,
            "timeout_s": cfg.timeout_s, "buckets": cfg.buckets, "trigger_s": trigger_s}  # fmt: skip
