"""``ftlayer demo``: the main job -- a real Structured Streaming query with failures.

It starts an embedded Redis (unless given a URL) and an ``ftlayer serve`` sidecar process,
writes generated orders as JSON files, and streams them (one file per micro-batch, kept by
reference: a ``FileSource``, with ftlayer's replay stream; ``source="kafka"``: into a
topic of a Kafka-protocol broker of its own, read through a ``KafkaSource``) on
``local[2]`` through an FT-wrapped ``foreachBatch`` pipeline of vectorized stages: a map
stage, a keyed shuffle (``partition_by``: Spark's own), a placement check, and a sink that
appends to a Redis list. Injected: explicit failures (``Outcome(failed=...)``), drops (the
sink never confirms: the records time out and are replayed by the sidecar) and crashes (a
task dies in its first attempt and Spark retries it). The ``availableNow`` query runs until
nothing is pending, replays included; then it reports; ``lost``
is counted from the sink's contents -- source records whose effect never arrived and that
are not dead-lettered.

``sink="delta"`` / ``"postgres"``: the sink also writes every batch -- its unconfirmed rows
too (their write landed, its confirmation was lost) -- through ftlayer's idempotent sink
(``DeltaSink`` into a table in the demo's directory, or ``PostgresSink`` into table
``ftlayer_demo`` of ``sink_url``), and ``lost`` and ``duplicates`` are counted from that
table: records are written again (``rewrites``), the table holds each once.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.connection import connect
from ftlayer.embedded import EmbeddedRedis
from ftlayer.errors import ConfigError
from ftlayer.service.process import ServeProcess
from partitioners import HashPartitioner

__all__ = ["DemoProgress", "DemoReport", "run_demo", "verdict"]

PARTITIONS = 4
KEYS = 64
ORDER = "id long, key long, total double"


@dataclass
class DemoReport:
    source_records: int
    completed: int
    replayed: int
    failed_explicit: int
    timed_out: int
    dead_lettered: int
    lost: int
    pending: int
    sink_rows: int
    dead_in_sink: int
    """Dead-lettered records whose row the sink holds all the same: a write that landed
    unconfirmed, then every replay failed. Not lost, not a duplicate; re-driving its dead
    letter into an idempotent table writes nothing new."""
    duplicates: int
    """Rows in the sink beyond one per record (the table's, with a table sink)."""
    rewrites: int
    """Writes of a record beyond its first: what the sink was sent again."""
    misplaced: int
    crashed_tasks: int
    micro_batches: int
    elapsed_s: float
    sink: str = "redis"
    """Where the rows went: ``redis`` (a list), ``delta`` or ``postgres`` (a table)."""
    source: str = "files"
    """Where the orders came from: ``files`` (JSON) or ``kafka`` (a topic)."""


class TaskCrash(BaseException):  # noqa: N818 -- a simulated crash, not an error to handle
    """Escapes the pipeline's error handling: the task dies as if its worker crashed."""


# -- executor side (module-level: pickled by reference) ------------------------------------
_CLIENTS: dict[tuple[int, str], redis.Redis] = {}


def _redis(url: str) -> redis.Redis:
    key = (os.getpid(), url)
    if key not in _CLIENTS:
        _CLIENTS[key] = connect(url)  # redis+cluster:// URLs too
    return _CLIENTS[key]


@dataclass(frozen=True)
class _Injector:
    """The map stage (a batch stage): crashes a share of tasks in their first attempt,
    fails a share of record attempts (``Outcome(failed=...)``)."""

    url: str
    prefix: str
    fail_rate: float
    crash_rate: float

    def __call__(self, batch: Any) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        from ftlayer.spark import Outcome

        if "value" in batch.schema.names:  # Kafka rows: the orders are their JSON values
            batch = _orders_of(batch)
        tc = TaskContext.get()
        if tc is not None and tc.attemptNumber() == 0 and self.crash_rate > 0:
            task = f"{tc.stageId()}/{tc.partitionId()}"
            if random.Random(f"{self.prefix}{task}").random() < self.crash_rate:
                if _redis(self.url).sadd(f"{self.prefix}:crashed", task):
                    raise TaskCrash(f"injected crash of task {task}")
        failed = np.flatnonzero(np.random.default_rng().random(batch.num_rows) < self.fail_rate)
        ids = batch.column("id").to_pylist()
        out = pa.RecordBatch.from_arrays(
            [batch.column("id"), batch.column("key"),
             pc.round(pc.multiply(batch.column("amount"), 1.2), 2)],
            names=["id", "key", "total"],
        )  # fmt: skip
        errors = [f"injected failure of order {ids[i]}" for i in failed]
        return Outcome(out, failed=failed, errors=errors)


def _orders_of(batch: Any) -> Any:
    """Kafka rows -> ``id, key, amount`` (their JSON values)."""
    import pyarrow as pa

    rows = [json.loads(v) for v in batch.column("value").to_pylist()]
    schema = pa.schema([("id", pa.int64()), ("key", pa.int64()), ("amount", pa.int64())])
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def _dead_ids(rows: Any) -> set[int]:
    """The order ids of the dead letters' rows (read back from their source: files give
    an ``id`` column, Kafka JSON values; a reference that no longer resolves names none)."""
    if "id" in rows.column_names:
        return {i for i in rows.column("id").to_pylist() if i is not None}
    return {json.loads(v)["id"] for v in rows.column("value").to_pylist() if v is not None}


@dataclass(frozen=True)
class _PlacementCheck:
    """After ``partition_by(["key"], n)``: is each record in the partition Spark assigns
    its key? Counts the ones that are not (fresh or replayed alike)."""

    url: str
    prefix: str

    def __call__(self, batch: Any) -> Any:
        from pyspark import TaskContext

        if "value" in batch.schema.names:  # Kafka rows: the orders are their JSON values
            batch = _orders_of(batch)
        tc = TaskContext.get()
        part = HashPartitioner(PARTITIONS, ["bigint"])
        wrong = sum(
            1 for k in batch.column("key").to_pylist()
            if tc is not None and tc.partitionId() != part.partition((k,))
        )  # fmt: skip
        if wrong:
            _redis(self.url).incrby(f"{self.prefix}:misplaced", wrong)
        return batch


@dataclass(frozen=True)
class _Sink:
    """Appends each batch's order ids to a Redis list; a share of the writes is never
    confirmed (lost in flight), so those records time out and are replayed. With a table
    (``table``: an idempotent sink of ftlayer.sinks), every row is written to it first,
    the unconfirmed ones too."""

    url: str
    prefix: str
    drop_rate: float
    table: Any = None

    @property
    def ft_lineage(self) -> str | None:
        return None if self.table is None else str(self.table.ft_lineage)

    def __call__(self, batch: Any, ctx: Any = None) -> Any:
        import numpy as np

        from ftlayer.spark import Outcome

        if self.table is not None:
            self.table(batch, ctx)
            _redis(self.url).rpush(f"{self.prefix}:written", *batch.column("id").to_pylist())
        dropped = np.random.default_rng().random(batch.num_rows) < self.drop_rate
        ids = [str(i) for i, d in zip(batch.column("id").to_pylist(), dropped, strict=True)
               if not d]  # fmt: skip
        if ids:
            _redis(self.url).rpush(f"{self.prefix}:sink", *ids)
        return Outcome(unconfirmed=np.flatnonzero(dropped))


# -- driver side ---------------------------------------------------------------------------
@contextlib.contextmanager
def _redis_url(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with EmbeddedRedis() as server:
        yield server.url


def _orders(records: int) -> Iterator[str]:
    rng = random.Random(records)
    for i in range(records):
        yield json.dumps({"id": i, "key": i % KEYS, "amount": rng.randint(1, 500)})


def _write_input(folder: Path, records: int, batches: int) -> None:
    per = -(-records // batches)
    orders = list(_orders(records))
    for b in range(batches):
        lines = orders[b * per : min(records, (b + 1) * per)]
        (folder / f"orders-{b:04d}.json").write_text("\n".join(lines) + "\n")


def _source(source: str, work: Path, records: int, batches: int,
            stack: contextlib.ExitStack) -> Any:  # fmt: skip
    """The orders, kept by reference: JSON files (one a micro-batch), or a Kafka topic of
    PARTITIONS partitions on a broker of the demo's own (``records / batches`` offsets a
    micro-batch)."""
    from ftlayer.spark import FileSource

    if source == "files":
        (work / "input").mkdir()
        _write_input(work / "input", records, batches)
        return FileSource("json", str(work / "input"), "id long, key long, amount long",
                          maxFilesPerTrigger=1)  # fmt: skip
    from ftlayer.spark import KafkaSource
    from ftlayer.spark.kafka.broker import LocalKafka

    kafka = stack.enter_context(LocalKafka())
    kafka.create_topic("orders", PARTITIONS)
    kafka.produce("orders", ((None, o.encode()) for o in _orders(records)),
                  partition_of=lambda i: i % PARTITIONS)  # fmt: skip
    return KafkaSource(kafka.bootstrap, ["orders"], startingOffsets="earliest",
                       maxOffsetsPerTrigger=-(-records // batches))  # fmt: skip


@contextlib.contextmanager
def _interrupt_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that lands while the driver's JVM starts until it has started.

    PySpark's ``launch_gateway``, interrupted while it waits for the JVM's connection file,
    deletes the file's directory; the JVM then fails to write it and stays alive forever
    (its py4j server thread is not a daemon). Held here, the interrupt is raised once the
    session is up, and the JVM ends with this process. A SIGTERM whose handler is Python's
    (a caller that turns it into an interrupt, as ``benchmarks.cluster_e2e`` does) is held
    the same way and handed to that handler then (a CI run's SIGTERM landed while a slow
    machine started the driver). ``SparkContext`` installs its own SIGINT handler once
    started; a Ctrl-C after that is PySpark's."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, _frame: object) -> None:
        held.append(signum)

    before = {signal.SIGINT: signal.signal(signal.SIGINT, hold)}
    if callable(term := signal.getsignal(signal.SIGTERM)):
        before[signal.SIGTERM] = signal.signal(signal.SIGTERM, hold)
    try:
        yield
    finally:
        for signum, handler in before.items():
            if signal.getsignal(signum) is hold:
                signal.signal(signum, handler)
    if signal.SIGTERM in held and callable(term):
        term(signal.SIGTERM, None)
    if held:
        raise KeyboardInterrupt


def _spark(log: Path, verbose: bool, conf: dict[str, str] | None = None) -> Any:
    """local[2] with 4 attempts per task (injected crashes retry), or what ``conf`` sets
    (``spark.master`` of a cluster, ...). Unless ``verbose``, the JVM's own output (startup
    warnings, log4j, Python workers' stderr) goes to ``log`` and Spark's console progress bar
    is off: the demo's display is the only thing on screen."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    settings = {"spark.master": f"local[2,{4}]", "spark.app.name": "ftlayer-demo",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "true" if verbose else "false",
            "spark.sql.shuffle.partitions": str(PARTITIONS),
            "spark.sql.session.timeZone": "UTC",
            "spark.pyspark.python": sys.executable, **(conf or {})}  # fmt: skip
    sconf = SparkConf().setAll(list(settings.items()))
    with _interrupt_deferred():
        if not verbose and SparkContext._gateway is None:  # noqa: SLF001 -- not started yet
            from pyspark.java_gateway import launch_gateway

            out = open(log, "ab")  # noqa: SIM115 -- the JVM's, for its whole life
            gateway = launch_gateway(sconf, {"stdout": out, "stderr": out})
            SparkContext(conf=sconf, gateway=gateway)
        spark = SparkSession.builder.config(conf=sconf).getOrCreate()
    spark.sparkContext.setLogLevel("INFO" if verbose else "FATAL")
    return spark


@dataclass
class DemoProgress:
    """What the demo has done so far (polled every half second while it runs;
    ``elapsed_s`` counts from the start of ``run_demo``, as the report's does)."""

    phase: str  # "streaming", "draining", "done"
    micro_batches: int
    batches_total: int
    records_in: int  # fresh records the batches read
    completed: int
    replayed: int
    dead_lettered: int
    pending: int
    elapsed_s: float


class _Watcher:
    """Polls the FT counters (twice a second: the sidecar's page polls too) and hands them
    to ``progress``, one call at a time; a change of phase is reported at once."""

    def __init__(self, ft: Any, batches: int, progress: Callable[[DemoProgress], None],
                 started: float):  # fmt: skip
        self.ft, self.batches, self.progress = ft, batches, progress
        self.phase = "streaming"
        self.started = started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-progress", daemon=True)

    def snapshot(self) -> DemoProgress:
        st = self.ft.layer.stats()
        results = list(self.ft.results)
        return DemoProgress(self.phase, sum(1 for r in results if r.fresh),
                            self.batches, sum(r.fresh for r in results), st.completed,
                            st.replayed, st.dead_lettered, st.pending,
                            round(time.monotonic() - self.started, 1))  # fmt: skip

    def report(self) -> None:
        with self._lock, contextlib.suppress(redis.RedisError):
            self.progress(self.snapshot())

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.report()

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.report()

    def __enter__(self) -> _Watcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.enter("done")


def run_demo(
    records: int = 20_000,
    fail_rate: float = 0.02,
    drop_rate: float = 0.01,
    crash_rate: float = 0.1,
    timeout_s: float = 3.0,
    redis_url: str | None = None,
    batches: int = 8,
    drain_timeout_s: float = 90.0,
    progress: Callable[[DemoProgress], None] | None = None,
    verbose: bool = False,
    on_status_page: Callable[[str], None] | None = None,
    hold: Callable[[DemoReport], None] | None = None,
    spark_conf: dict[str, str] | None = None,
    sidecar: bool = True,
    config: dict[str, Any] | None = None,
    sink: str = "redis",
    sink_url: str | None = None,
    source: str = "files",
) -> DemoReport:
    """Run the demo (see the module docstring). ``progress`` gets a DemoProgress every
    half second; ``on_status_page`` the sidecar's status page URL once it serves;
    ``hold`` gets the report before anything is stopped (``--serve``: shows it, and the
    page stays up until it returns). ``spark_conf`` overrides the Spark settings
    (``spark.master`` of a cluster, ...); ``sidecar=False`` starts no sidecar (the caller
    runs its own, for the namespace ``config["namespace"]``); ``config`` holds more FTConfig
    fields (``durability``, ``shards``, ...). ``sink``: ``redis``, ``delta`` or
    ``postgres`` (``sink_url`` names the PostgreSQL server; see the module docstring).
    ``source``: ``files`` (JSON files) or ``kafka`` (a topic on a broker of its own)."""
    if source not in ("files", "kafka"):
        raise ConfigError(f"source must be files or kafka, not {source!r}")
    if sink not in ("redis", "delta", "postgres"):
        raise ConfigError(f"sink must be redis, delta or postgres, not {sink!r}")
    if sink == "postgres" and not sink_url:
        raise ConfigError("the postgres sink needs a server: sink_url (--sink-url "
                          "postgresql://user@host:5432/db)")  # fmt: skip
    from ftlayer.spark import FaultTolerance

    started = time.monotonic()
    config = dict(config or {})
    ns = config.pop("namespace", None) or f"demo-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="ftlayer-demo-"))
    try:
        with _redis_url(redis_url) as url, contextlib.ExitStack() as stack:
            orders = _source(source, work, records, batches, stack)
            if sidecar:
                serve = ServeProcess(url, ns, work / "serve.log", timeout_s=timeout_s)
                stack.enter_context(serve)
                if on_status_page:
                    on_status_page(serve.page)
            prefix = f"ftdemo:{ns}"
            ft = FaultTolerance(
                FTConfig(namespace=ns, redis_url=url, timeout_s=timeout_s, **config)
            )
            spark = _spark(work / "spark.log", verbose, spark_conf)
            try:
                table = _table(sink, sink_url, work, ns)
                report = _run(spark, ft, url, prefix, work, orders, records, batches,
                              fail_rate, drop_rate, crash_rate, drain_timeout_s, progress,
                              started, table)  # fmt: skip
                report.source = source
                report.elapsed_s = round(time.monotonic() - started, 1)
                if hold:
                    hold(report)
            finally:
                assert ft.layer is not None
                ft.layer.clear()
                client = connect(url)
                for key in client.scan_iter(match=f"{prefix}:*"):
                    client.delete(key)
                client.close()
                ft.close()
                spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _table(sink: str, sink_url: str | None, work: Path, ns: str) -> Any:
    """The idempotent sink the demo writes through (None: the Redis list only)."""
    if sink == "delta":
        from ftlayer.sinks import DeltaSink

        return DeltaSink(str(work / "orders-delta"))
    if sink == "postgres":
        import psycopg

        from ftlayer.sinks import PostgresSink

        table = f"ftlayer_demo_{ns.replace('-', '_')}"
        with psycopg.connect(str(sink_url), autocommit=True) as c:
            c.execute(f"DROP TABLE IF EXISTS {table}")
        return PostgresSink(str(sink_url), table, create=True)
    return None


def _table_ids(table: Any) -> list[int]:
    """The order ids in the demo's table, one per row."""
    if hasattr(table, "predicate"):  # a DeltaSink
        from deltalake import DeltaTable

        return list(DeltaTable(table.path).to_pyarrow_table(columns=["id"]).column("id")
                    .to_pylist())  # fmt: skip
    import psycopg

    with psycopg.connect(table.url) as c:
        return [int(r[0]) for r in c.execute(f"SELECT id FROM {table.table}")]


def _run(spark: Any, ft: Any, url: str, prefix: str, work: Path, orders: Any, records: int,
         batches: int, fail_rate: float, drop_rate: float, crash_rate: float,
         drain_timeout_s: float, progress: Callable[[DemoProgress], None] | None,
         started: float, table: Any = None) -> DemoReport:  # fmt: skip
    # the orders are kept by reference (no copy in Redis); replays ride the stream
    pipeline = (
        ft.pipeline(source=0, reads=orders)
        .map_batches(_Injector(url, prefix, fail_rate, crash_rate), ORDER)
        .partition_by(["key"], PARTITIONS)
        .map_batches(_PlacementCheck(url, prefix), ORDER)
        .sink_batches(_Sink(url, prefix, drop_rate, table))
    )
    watch = _Watcher(ft, batches, progress, started) if progress else contextlib.nullcontext()
    with watch:
        query = (
            pipeline.stream(spark)
            .writeStream.foreachBatch(pipeline)
            .option("checkpointLocation", str(work / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()  # availableNow: until nothing is pending, replays included
        if query.exception():
            raise RuntimeError(f"the streaming query failed: {query.exception()}")
        if isinstance(watch, _Watcher):
            watch.enter("draining")
        # the query ran every replay; a drain only reports (and runs what a query cut
        # short by a stuck record left: it claims replays itself)
        drained = ft.drain(timeout_s=drain_timeout_s, pipeline=pipeline)

    layer = ft.layer
    client = connect(url)
    try:
        sink = Counter(int(x) for x in client.lrange(f"{prefix}:sink", 0, -1))
        sent = sink if table is None else Counter(
            int(x) for x in client.lrange(f"{prefix}:written", 0, -1))  # fmt: skip
        misplaced = int(client.get(f"{prefix}:misplaced") or 0)
        crashed = int(client.scard(f"{prefix}:crashed"))
    finally:
        client.close()
    # dead letters read back from the files (a reference that no longer resolves names no
    # id: its record counts as lost)
    dead = _dead_ids(pipeline.dead_letters(spark))
    if table is not None:  # the table is the sink: lost and duplicates counted from it
        sink = Counter(_table_ids(table))
    st = layer.stats()
    return DemoReport(
        source_records=records,
        completed=st.completed,
        replayed=st.replayed,
        failed_explicit=st.failed_explicit,
        timed_out=st.failed_timeout,
        dead_lettered=st.dead_lettered,
        lost=sum(1 for i in range(records) if i not in sink and i not in dead),
        pending=drained.pending,
        sink_rows=sum(sink.values()),
        dead_in_sink=sum(1 for i in dead if i in sink),
        duplicates=sum(n - 1 for n in sink.values()),
        rewrites=sum(n - 1 for n in sent.values()),
        misplaced=misplaced,
        crashed_tasks=crashed,
        micro_batches=sum(1 for r in ft.results if r.fresh),
        elapsed_s=0.0,
        sink="redis" if table is None else ("delta" if hasattr(table, "predicate")
                                            else "postgres"),
    )


def verdict(r: DemoReport) -> str:
    """One line: OK or FAILED, with what happened on the way (the table has the rest)."""
    if r.lost or r.pending:
        return (f"FAILED: {r.lost:,} lost, {r.pending:,} still pending "
                f"(of {r.source_records:,} records, {r.elapsed_s:g} s)")  # fmt: skip
    return (f"OK: {r.source_records:,} records, 0 lost, {r.replayed:,} replayed, "
            f"{r.dead_lettered:,} dead-lettered, {r.crashed_tasks:,} crashed "
            f"task{'' if r.crashed_tasks == 1 else 's'} recovered "
            f"({r.elapsed_s:g} s)")  # fmt: skip
