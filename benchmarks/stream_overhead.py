"""The streaming yardstick: what ftlayer costs the streaming job people run, against the same
job without ftlayer, in one local[2] Spark session.

The job: a Structured Streaming query over JSON files of W-byte events (``id``, ``key``,
``payload``: a W-byte JSON document holding ``amount``), one file per micro-batch
(``maxFilesPerTrigger=1``, ``trigger(availableNow=True)``), ``foreachBatch`` running:

1. parse the payload's ``amount`` and join a 64-row lookup table (region, rate) on ``key``;
2. a keyed shuffle into 4 partitions (``repartition(4, "key")``);
3. the VAT of each row (the stage that fails, in the failing variants);
4. append Parquet.

Two pipelines, each written twice:

* ``df``: DataFrame code (``get_json_object``, a ``broadcast`` join) -- plain, and as
  ftlayer ``transform`` stages over ``FileSource`` (``pipeline.stream(spark)``, the rows
  kept by reference) ending in the same Parquet ``sink_dataframe``;
* ``arrow``: the same work in Python, ``mapInArrow`` (pyarrow.compute, the lookup by
  ``index_in``/``take``) -- plain, and as ftlayer ``map_batches`` stages, the same sink.

Each ftlayer query runs as ``ft_on`` and as ``ft_on_failing`` (5 % of the attempts of
stage 3 fail, after the shuffle -- ``_wide.failing_attempts`` for ``df``: their replays
are part of the query, which ends when nothing is pending); the ``df`` query also as
``ft_on_marked``: stage 3 with ``failed=F.col("vat").isNull()``, which marks no row -- a
DataFrame stage that can fail rows adds a column, an observation and a filter to the
plan, and a pipeline people write has one (a Python stage pays for its answers' checks in
``ft_on`` already). Two cadences, each its own input: 20 micro-batches of 5,000 events
and 8 of 50,000. Every round runs each ftlayer query beside a plain run of its own
(alternating which goes first; ``--warmup`` rounds uncounted); a figure is the median of
the per-round ratios (plain time / ftlayer time) with their quartiles. The time of a run
is the query's, from building its streaming DataFrame to its end; after the clock stops
its output is checked: every event id once, in the Parquet table or (ftlayer) in the dead
letters.

Per cadence and pipeline: ``ratio_stream_<df|arrow>_ft_on_vs_plain``,
``ratio_stream_df_ft_on_marked_vs_plain`` and ``..._ft_on_failing_vs_plain``, the plain
and ftlayer seconds per micro-batch. Per pipeline, fitted over both cadences from the
median extra time of each (ftlayer minus plain, paired), less the cost paid once per
query, as ``extra = batches * a + events * b``: ``ft_ms_per_batch`` (a, the part that does
not grow with the batch) and ``ft_us_per_record`` (b). The cost per query,
``ft_s_per_query``, is measured from the queries' own progress, not fitted: starting the
query and ending it (ftlayer's seconds outside its micro-batches less the plain query's)
and what its first micro-batch costs beyond its others (ftlayer's first-batch excess less
the plain query's: work done once per query inside it -- the replay reader's first offset,
the columns a query builds once); a cost paid once per query that the fit were given would
read as a cost per micro-batch and per record (both cadences run one query).
``<variant>_micro_batches`` (replay rounds included), ``<variant>_trigger_s_per_batch``
(Spark's ``triggerExecution`` per micro-batch), ``<variant>_outside_batches_s`` (a run's
wall time less its micro-batches'), ``<variant>_first_batch_excess_s`` (its first
micro-batch's ``triggerExecution`` less the median of its others') and
``<variant>_tail_micro_batches`` / ``<variant>_tail_s`` (the micro-batches after the input
ended, in which no source read a row: replays alone, and their seconds -- a cost of a
finite input, which a stream that goes on pays inside micro-batches it runs anyway; a
DataFrame stage's failed rows ride them, those of a Python stage are retried in their
task). Beside it, ``python_source_s_per_query``: what Spark charges any query for a Python
streaming source (the API the replay stream is written in), measured in the same session
on a source that never has data. ``replays_read_back_entered``: per ftlayer variant, a
run's replays read back from their files and those that entered at the stage they failed
in (medians). What Redis received (its ``total_net_input_bytes``):
``ft_on_redis_bytes_per_record`` and, where at least 1 % of the events failed for ftlayer
(not retried in their task), ``ft_on_failing_redis_bytes_per_failure`` (beyond the same
round's run without failures, per failure; goal: the failing stage's input row,
``stage_input_arrow_bytes``, + 64).

``--source kafka``: the same events as JSON values of a 4-partition Kafka topic (on a
throwaway tansu broker), read by ftlayer's Kafka source (``maxOffsetsPerTrigger`` cutting
the micro-batches) -- plain: that source and a first stage turning Kafka rows into the
events' columns (``from_json`` for ``df``, ``json.loads`` for ``arrow``); ftlayer: the
same stage over ``KafkaSource`` (kept by reference). Its results go to
``stream_overhead_kafka.json``; Redis bytes per record have a goal there: <= 16.

    python -m benchmarks.stream_overhead [--cadences 5000x20,50000x8] [--pipelines df,arrow]
        [--source files|kafka] [--repeat 9] [--warmup 1] [--payload-bytes 1024]
        [--source-pairs 5] [--json] [--record | --results DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader

from benchmarks._common import parse_args, provenance, redis_for_benchmark, save, url_of
from benchmarks._kafka_events import arrow_events, df_events, produce_events
from benchmarks._kafka_events import stream as kafka_stream
from benchmarks._paired import PARTITIONS, PairedRounds, quartiles, spark_session
from benchmarks._wide import (
    SCHEMA,
    FailLate,
    amount_of,
    failing_attempts,
    net_input_bytes,
    write_events,
)
from ftlayer import FTConfig
from ftlayer.spark import FaultTolerance, FileSource, KafkaSource

FAIL_RATE = 0.05
LOOKUP_KEYS = 64
ENRICHED = "id long, key long, region string, total double"
TAXED = "id long, key long, region string, total double, vat double"
LOOKUP = [(k, f"region-{k % 7}", 1.0 + k / 100) for k in range(LOOKUP_KEYS)]
"""The lookup table's rows (key, region, rate): a Spark DataFrame for ``df``, the columns
below for ``arrow``."""
_KEYS, _REGIONS, _RATES = (pa.array(col) for col in zip(*LOOKUP, strict=True))
GOAL_FT_ON = {5_000: 0.85, 50_000: 0.90}
"""``ratio_stream_*_ft_on_vs_plain`` (and ``..._ft_on_marked_...``) at these events per
micro-batch."""
GOAL_FAILING = 0.80
"""``ratio_stream_*_ft_on_failing_vs_plain``, at both cadences."""
GOAL_FIT = {"ft_ms_per_batch": 30.0, "ft_us_per_record": 1.0}
GOAL_KAFKA_REDIS_BYTES = 16
"""``ft_on_redis_bytes_per_record`` reading Kafka: a reference, no payload."""
MARKED = ("df",)
"""The pipelines also run as ``ft_on_marked`` (a stage with ``failed=`` that marks no
row)."""


def variants(pipeline: str) -> tuple[str, ...]:
    """The ftlayer queries of ``pipeline``, in the order they are reported."""
    return ("ft_on", "ft_on_marked", "ft_on_failing") if pipeline in MARKED else \
        ("ft_on", "ft_on_failing")


MIN_FAILURES = 0.01
"""Redis bytes per failure are reported where the failing run's failures (those ftlayer
counted: not the attempts retried in their task) were at least this share of the events."""
"""Upper bounds of the fitted per-batch and per-record costs."""


class Progress(NamedTuple):
    """What a finished query's own progress says of it (:meth:`of`)."""

    batches: int
    """Micro-batches run (replay rounds included)."""
    trigger_s: float
    """Seconds Spark spent in them (their ``triggerExecution``, summed)."""
    first_excess: float
    """The first one's seconds beyond the median of the others' (0 with fewer than two)."""
    tail_batches: int
    tail_s: float
    """The micro-batches after the input ended, and their seconds (:func:`tail`)."""

    @classmethod
    def of(cls, query: Any) -> Progress:
        """``query``'s figures, from its progress read once."""
        batches = micro_batches(query)
        took = [s for _, s in batches]
        first = took[0] - statistics.median(took[1:]) if len(took) > 1 else 0.0
        return cls(len(batches), sum(took), first, *tail(batches))


@dataclass(frozen=True)
class Cadence:
    """``batches`` micro-batches of ``per_batch`` events (a file each)."""

    per_batch: int
    batches: int

    @property
    def name(self) -> str:
        return f"{self.per_batch}x{self.batches}"

    @property
    def events(self) -> int:
        return self.per_batch * self.batches

    @staticmethod
    def parse(text: str) -> Cadence:
        per_batch, batches = text.lower().split("x")
        return Cadence(int(per_batch), int(batches))


# -- the stages, as DataFrame code ----------------------------------------------------------
def lookup_table(spark: Any) -> Any:
    """The 64-row lookup table (key, region, rate), cached."""
    return spark.createDataFrame(LOOKUP, "key long, region string, rate double").cache()


def df_enrich(lookup: Any) -> Callable[[Any], Any]:
    """Stage 1: the amount out of the payload, the lookup joined (broadcast)."""
    from pyspark.sql import functions as F  # noqa: N812

    def enrich(df: Any) -> Any:
        amount = F.get_json_object("payload", "$.amount").cast("long")
        joined = df.withColumn("amount", amount).drop("payload").join(F.broadcast(lookup), "key")
        return joined.withColumn("total", F.col("amount") * F.col("rate")).drop("amount", "rate")

    return enrich


def df_vat(df: Any) -> Any:
    """Stage 3 (after the keyed shuffle)."""
    from pyspark.sql import functions as F  # noqa: N812

    return df.withColumn("vat", F.round(F.col("total") * 0.2, 2))


# -- the same stages in Python (mapInArrow / map_batches) -----------------------------------
def arrow_enrich(b: pa.RecordBatch) -> pa.RecordBatch:
    """Stage 1 in pyarrow: the amount by regex, the lookup by ``index_in`` + ``take``."""
    at = pc.index_in(b.column(1), value_set=_KEYS)
    total = pc.multiply(pc.cast(amount_of(b.column(2)), pa.float64()), pc.take(_RATES, at))
    return pa.RecordBatch.from_arrays([b.column(0), b.column(1), pc.take(_REGIONS, at), total],
                                      names=["id", "key", "region", "total"])  # fmt: skip


def arrow_vat(b: pa.RecordBatch) -> pa.RecordBatch:
    vat = pc.round(pc.multiply(b.column(3), 0.2), 2)
    return pa.RecordBatch.from_arrays([*b.columns, vat], names=[*b.schema.names, "vat"])


def _each(fn: Callable[[pa.RecordBatch], pa.RecordBatch]) -> Callable[..., Any]:
    def run(it: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in it:
            yield fn(b)

    return run


def micro_batches(query: Any) -> list[tuple[int, float]]:
    """A finished query's micro-batches as its progress shows them, read once: the rows
    its sources read and its seconds (Spark's own ``triggerExecution``) each."""
    return [(p.numInputRows, p.durationMs.get("triggerExecution", 0) / 1e3)
            for p in query.recentProgress]  # fmt: skip


def trigger_seconds(query: Any) -> float:
    """The seconds a finished query spent in its micro-batches."""
    return sum(s for _, s in micro_batches(query))


def tail(batches: list[tuple[int, float]]) -> tuple[int, float]:
    """The micro-batches (:func:`micro_batches`) a query ran after its input ended, and
    their seconds: the trailing ones in which no source read a row -- replays alone, a
    DataFrame stage's failed rows entering where they failed (the replay stream of a
    source kept by reference reads no rows of its own: its batches take their claims
    themselves). A cost of a finite input: a stream that goes on carries its replays in
    micro-batches it runs anyway."""
    n, seconds = 0, 0.0
    for rows, took in reversed(batches):
        if rows:
            break
        n, seconds = n + 1, seconds + took
    return n, seconds


# -- what Spark charges any Python streaming source ------------------------------------------
class EmptyReader(DataSourceStreamReader):
    """A Python streaming source's reader with nothing to read, ever."""

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 (Spark's names)
        return {"seq": 0}

    def latestOffset(self) -> dict[str, int]:  # noqa: N802
        return {"seq": 0}

    def partitions(self, start: Any, end: Any) -> list[Any]:
        return []

    def read(self, partition: Any) -> Iterator[Any]:
        return iter([])


class EmptySource(DataSource):
    """A Python streaming source (format ``ftbench-empty``) that never has data."""

    @classmethod
    def name(cls) -> str:
        return "ftbench-empty"

    def schema(self) -> str:
        return "id long, key long, payload string"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        return EmptyReader()


def python_source_s_per_query(spark: Any, tmp: Path, pairs: int = 5) -> float:
    """What Spark charges a query for a Python streaming source (the data source API the
    replay stream is written in), whoever wrote it: a query over one small JSON file
    unioned with a source that never has data, against the same query without it, paired;
    the median difference of their seconds outside their micro-batches (the source's
    Python process started at the query's start, from ``pyspark.zip`` on a pip install)."""
    spark.dataSource.register(EmptySource)
    root = tmp / "tiny"
    write_events(root, 10, 16, 1)

    def outside(with_source: bool) -> float:
        t0 = time.perf_counter()
        stream = spark.readStream.schema(SCHEMA).json(str(root))
        if with_source:
            stream = stream.unionByName(spark.readStream.format("ftbench-empty").load())
        q = (stream.writeStream.foreachBatch(lambda df, _: df.count())
             .trigger(availableNow=True)
             .option("checkpointLocation", str(tmp / f"ck-{uuid.uuid4().hex[:8]}")).start())
        q.awaitTermination()
        return time.perf_counter() - t0 - trigger_seconds(q)

    outside(True)  # warm: the data source registered, its first planning done
    diffs = []
    for i in range(pairs):
        first = i % 2 == 0
        a = outside(first)
        b = outside(not first)
        diffs.append(a - b if first else b - a)
    return round(statistics.median(diffs), 3)


# -- the runs -------------------------------------------------------------------------------
class Runs:
    """Makes each variant's run ready: a fresh checkpoint and output directory (and, for
    ftlayer, a fresh namespace), the query timed from its DataFrame to its end, its output
    checked after."""

    def __init__(self, spark: Any, client: Any, url: str, tmp: Path,
                 inputs: dict[str, Any], kafka: str | None = None) -> None:  # fmt: skip
        self.spark, self.client, self.url, self.tmp, self.inputs = spark, client, url, tmp, inputs
        self.kafka = kafka
        """The broker's bootstrap address with ``--source kafka`` (inputs are topics)."""
        self.lookup = lookup_table(spark)
        self.lookup.count()
        self.progress: dict[str, list[Progress]] = {}
        """Per variant, each run's progress figures, in run order."""
        self.replays: dict[str, list[tuple[int, int]]] = {}
        """Per ftlayer variant, each run's replays (read back from their files, entered
        at their stage), in run order."""
        self.sent: dict[str, list[tuple[int, int]]] = {}
        """Per ftlayer variant, each run's bytes Redis received during the query and the
        failed attempts it counted, in run order."""

    def _progress(self, name: str, q: Any) -> None:
        self.progress.setdefault(name, []).append(
            Progress.of(q))

    def prepare(self, name: str) -> Callable[[], Any]:
        pipeline, cadence, variant = name.split(":")
        c = Cadence.parse(cadence)
        for old in self.tmp.glob("run-*"):
            shutil.rmtree(old, ignore_errors=True)
        work = self.tmp / f"run-{uuid.uuid4().hex[:8]}"
        if variant == "plain":
            job = self._plain(name, pipeline, self.inputs[cadence], work, c)
        else:
            job = self._ft(name, pipeline, self.inputs[cadence], work, c, variant)

        def named() -> Callable[[], None]:
            check = job()

            def checked() -> None:
                try:
                    check()
                except AssertionError as e:
                    raise AssertionError(f"{name}: {e}") from e

            return checked

        return named

    def _plain(self, name: str, pipeline: str, root: Any, work: Path,
               c: Cadence) -> Callable[[], Any]:  # fmt: skip
        out, enrich = str(work / "out"), df_enrich(self.lookup)

        def each(df: Any, _: int) -> None:
            if self.kafka is not None:  # Kafka rows -> the events' columns
                df = df_events(df) if pipeline == "df" else df.mapInArrow(
                    _each(arrow_events), SCHEMA)  # fmt: skip
            if pipeline == "df":
                staged = df_vat(enrich(df).repartition(PARTITIONS, "key"))
            else:
                first = df.mapInArrow(_each(arrow_enrich), ENRICHED)
                staged = first.repartition(PARTITIONS, "key").mapInArrow(_each(arrow_vat), TAXED)
            staged.write.mode("append").parquet(out)

        def job() -> Callable[[], None]:
            if self.kafka is not None:
                stream = kafka_stream(self.spark, self.kafka, root, c.per_batch)
            else:
                stream = (self.spark.readStream.schema(SCHEMA)
                          .option("maxFilesPerTrigger", 1).json(str(root)))  # fmt: skip
            q = (stream.writeStream.foreachBatch(each).trigger(availableNow=True)
                 .option("checkpointLocation", str(work / "ck")).start())  # fmt: skip
            q.awaitTermination()
            self._progress(name, q)
            return lambda: self._check(out, None, c)

        return job

    def _ft(self, name: str, pipeline: str, root: Any, work: Path, c: Cadence,
            variant: str) -> Callable[[], Any]:  # fmt: skip
        from pyspark.sql import functions as F  # noqa: N812

        out = str(work / "out")
        ft = FaultTolerance(FTConfig(namespace=f"so-{uuid.uuid4().hex[:8]}", redis_url=self.url))
        if self.kafka is not None:
            reads: Any = KafkaSource(self.kafka, [root], startingOffsets="earliest",
                                     maxOffsetsPerTrigger=c.per_batch)  # fmt: skip
        else:
            reads = FileSource("json", str(root), SCHEMA, maxFilesPerTrigger=1)
        p = ft.pipeline(source=0, reads=reads, name="stream-overhead")
        if self.kafka is not None:  # Kafka rows -> the events' columns, as the plain job
            p = p.transform(df_events) if pipeline == "df" else p.map_batches(arrow_events,
                                                                                SCHEMA)
        failing = variant == "ft_on_failing"
        if pipeline == "df":
            failed = {"ft_on_failing": failing_attempts(FAIL_RATE),
                      "ft_on_marked": F.col("vat").isNull()}.get(variant)  # fmt: skip
            p = (p.transform(df_enrich(self.lookup)).partition_by(["key"], PARTITIONS)
                 .transform(df_vat, failed=failed, errors="injected failure"))  # fmt: skip
        else:
            vat = FailLate(arrow_vat, FAIL_RATE) if failing else arrow_vat
            p = (p.map_batches(arrow_enrich, ENRICHED).partition_by(["key"], PARTITIONS)
                 .map_batches(vat, TAXED))  # fmt: skip
        p = p.sink_dataframe(lambda df, _: df.write.mode("append").parquet(out))

        def job() -> Callable[[], None]:
            before = net_input_bytes(self.client)
            q = (p.stream(self.spark).writeStream.foreachBatch(p).trigger(availableNow=True)
                 .option("checkpointLocation", str(work / "ck")).start())  # fmt: skip
            q.awaitTermination()
            sent = net_input_bytes(self.client) - before
            self._progress(name, q)

            def check() -> None:
                layer = ft.layer
                assert layer is not None
                self.replays.setdefault(name, []).append(
                    (sum(r.read_back for r in ft.results), sum(r.entered for r in ft.results)))
                self.sent.setdefault(name, []).append((sent, sum(r.failed for r in ft.results)))
                try:
                    st = layer.stats()
                    assert st.pending == 0, st
                    self._check(out, p.dead_letters(self.spark), c)
                finally:
                    layer.clear()
                    ft.close()

            return check

        return job

    def _check(self, out: str, dead: pa.Table | None, c: Cadence) -> None:
        """Every event id once, in the table or in the dead letters."""
        written = self.spark.read.parquet(out).select("id").toArrow().column(0).to_numpy()
        dead_ids: Any = []
        if dead is not None and dead.num_rows:
            dead_ids = (dead.column("id").to_numpy() if "id" in dead.column_names else
                        np.array([json.loads(v)["id"] for v in dead.column("value").to_pylist()]))
        counts = np.bincount(np.concatenate([written, dead_ids]).astype(np.int64),
                             minlength=c.events)  # fmt: skip
        assert len(counts) == c.events, f"ids beyond {c.events}: {len(counts) - 1}"
        twice = np.flatnonzero(np.bincount(written, minlength=c.events) > 1)
        assert counts.min() == 1 and counts.max() == 1, (
            f"{int((counts == 0).sum())} ids lost, {int((counts > 1).sum())} more than once "
            f"({len(twice)} written twice, e.g. {twice[:5].tolist()}; "
            f"{len(dead_ids)} dead-lettered)")


def fit(extra: dict[Cadence, float]) -> dict[str, float]:
    """``extra = batches * a + events * b`` through the cadences (least squares when more
    than two): a in ms per micro-batch, b in microseconds per record."""
    a = np.array([[c.batches, c.events] for c in extra], dtype=float)
    y = np.array(list(extra.values()))
    (per_batch, per_record), *_ = np.linalg.lstsq(a, y, rcond=None)
    return {"ft_ms_per_batch": round(per_batch * 1e3, 1),
            "ft_us_per_record": round(per_record * 1e6, 3)}  # fmt: skip


def fit_per_batch(per: dict[str, Any], rounds: PairedRounds, cadences: list[Cadence],
                  pipeline: str) -> dict[str, float]:  # fmt: skip
    """``pipeline``'s extra time per query (``ft_s_per_query``: ftlayer's seconds outside
    its micro-batches and its first micro-batch's excess, less the plain query's, the
    median over the cadences), and the rest of its extra time fitted (:func:`fit`) as per
    micro-batch and per record."""
    med = statistics.median

    def once(fig: dict[str, Any], variant: str) -> float:
        return fig[f"{variant}_outside_batches_s"] + fig[f"{variant}_first_batch_excess_s"]

    figs = {c: per[c.name][pipeline] for c in cadences}
    each = {c: once(f, "ft_on") - once(f, "plain") for c, f in figs.items()}
    extra = {c: med(rounds.diffs[f"{pipeline}:{c.name}:ft_on"]) - each[c] for c in cadences}
    return {"ft_s_per_query": round(med(each.values()), 3), **fit(extra)}


def run(cadences: list[Cadence], pipelines: list[str], width: int, repeat: int, warmup: int,
        url: str | None, source_pairs: int = 5,
        source: str = "files") -> dict[str, Any]:  # fmt: skip
    spark = spark_session()
    tmp = Path(tempfile.mkdtemp(prefix="ftbench-stream-"))
    broker = contextlib.ExitStack()
    pairs = {f"{p}:{c.name}:{v}": f"{p}:{c.name}:plain" for c in cadences for p in pipelines
             for v in variants(p)}  # fmt: skip
    try:
        with redis_for_benchmark(url) as client, broker:
            inputs: dict[str, Any] = {}
            kafka = None
            if source == "kafka":
                from ftlayer.spark.kafka.broker import LocalKafka

                kafka = broker.enter_context(LocalKafka())
            for c in cadences:
                if kafka is not None:
                    inputs[c.name] = f"events-{c.name}"
                    produce_events(kafka, inputs[c.name], c.events, width)
                else:
                    inputs[c.name] = tmp / f"in-{c.name}"
                    write_events(inputs[c.name], c.events, width, c.batches)
            runs = Runs(spark, client, url_of(client, url), tmp, inputs,
                        kafka.bootstrap if kafka is not None else None)  # fmt: skip
            rounds = PairedRounds(pairs, warmup)
            for rnd in range(warmup + repeat):
                t0 = time.perf_counter()
                rounds.round(rnd, runs.prepare)
                print(f"round {rnd + 1}/{warmup + repeat}: {time.perf_counter() - t0:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip (stdout: the result only)
            redis_version = client.info("server")["redis_version"]
            floor = python_source_s_per_query(spark, tmp, source_pairs)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    # a plain query runs beside each ftlayer query of its pipeline: that many a round
    counted = {k: v[-repeat * (len(variants(k.split(":")[0])) if k.endswith(":plain") else 1):]
               for k, v in runs.progress.items()}  # fmt: skip
    r = result(rounds, counted, cadences, pipelines, width, repeat, warmup, redis_version)
    r["python_source_s_per_query"] = floor
    r["source"] = source
    if source == "kafka":
        r["goals"].update({f"{c.name}:{p}:ft_on_redis_bytes_per_record":
                           f"<= {GOAL_KAFKA_REDIS_BYTES}" for c in cadences for p in pipelines})
    redis_bytes(r, runs.sent, cadences, pipelines, repeat)
    med = statistics.median
    r["replays_read_back_entered"] = {k: [med(a for a, _ in v[-repeat:]),
                                          med(b for _, b in v[-repeat:])]
                                      for k, v in runs.replays.items()}  # fmt: skip
    return r


def result(rounds: PairedRounds, progress: dict[str, list[Progress]],
           cadences: list[Cadence], pipelines: list[str], width: int, repeat: int,
           warmup: int, redis_version: str) -> dict[str, Any]:  # fmt: skip
    med = statistics.median
    per: dict[str, Any] = {}
    for c in cadences:
        for p in pipelines:
            plain = rounds.times[f"{p}:{c.name}:plain"]
            fig: dict[str, Any] = {"plain_s_per_batch": round(med(plain) / c.batches, 4)}
            fig.update(spark_figures("plain", progress[f"{p}:{c.name}:plain"], plain))
            for v in variants(p):
                name = f"{p}:{c.name}:{v}"
                key = f"ratio_stream_{p}_{v}_vs_plain"
                fig[key] = round(med(rounds.ratios[name]), 3)
                fig[f"{key}_quartiles"] = [round(q, 3) for q in quartiles(rounds.ratios[name])]
                fig[f"{v}_s_per_batch"] = round(med(rounds.times[name]) / c.batches, 4)
                fig[f"{v}_extra_s_per_batch"] = round(med(rounds.diffs[name]) / c.batches, 4)
                fig.update(spark_figures(v, progress[name], rounds.times[name]))
            per.setdefault(c.name, {})[p] = fig
    fitted = {p: fit_per_batch(per, rounds, cadences, p)
              for p in pipelines} if len(cadences) > 1 else {}  # fmt: skip
    return {
        "payload_bytes": width, "repeat": repeat, "warmup": warmup, "fail_rate": FAIL_RATE,
        "partitions": PARTITIONS, "lookup_rows": LOOKUP_KEYS, "redis_version": redis_version,
        "cadences": {c.name: {"events_per_batch": c.per_batch, "batches": c.batches,
                              **per[c.name]} for c in cadences},
        "fit": fitted, "goals": goals(cadences, pipelines),
        "runs_s": {k: [round(x, 3) for x in v] for k, v in rounds.times.items()},
        **provenance("stream_overhead"),
    }  # fmt: skip


def stage_input_arrow_bytes() -> float:
    """The Arrow width of a row of the failing stage's input (``ENRICHED``: what stage 1
    makes of an event), over the lookup's keys."""
    n = len(LOOKUP)
    rows = pa.RecordBatch.from_arrays([pa.array(range(n), pa.int64()), _KEYS, _REGIONS,
                                       pa.array([1.5] * n, pa.float64())],
                                      names=["id", "key", "region", "total"])  # fmt: skip
    return round(rows.nbytes / n, 1)


def redis_bytes(r: dict[str, Any], sent: dict[str, list[tuple[int, int]]],
                cadences: list[Cadence], pipelines: list[str], repeat: int) -> None:
    """What Redis received, per cadence and pipeline (medians of the counted rounds):
    ``ft_on_redis_bytes_per_record``, ``ft_on_failing_failures`` (the failures ftlayer
    counted) and, where they were at least ``MIN_FAILURES`` of the events,
    ``ft_on_failing_redis_bytes_per_failure`` (the failing run's bytes less the same round's
    run without failures, per failure), with its goal: at most the failing stage's input
    row (``stage_input_arrow_bytes``) + 64."""
    med = statistics.median
    width = r["stage_input_arrow_bytes"] = stage_input_arrow_bytes()
    for c in cadences:
        for p in pipelines:
            on = sent[f"{p}:{c.name}:ft_on"][-repeat:]
            failing = sent[f"{p}:{c.name}:ft_on_failing"][-repeat:]
            fig = r["cadences"][c.name][p]
            fig["ft_on_redis_bytes_per_record"] = round(med(b / c.events for b, _ in on), 2)
            failures = med(n for _, n in failing)
            fig["ft_on_failing_failures"] = failures
            if failures < MIN_FAILURES * c.events:  # retried in their task: too few reached
                continue  # Redis to tell their bytes from the runs' own variation
            fig["ft_on_failing_redis_bytes_per_failure"] = round(med(
                (b - b0) / max(n, 1) for (b, n), (b0, _) in zip(failing, on, strict=True)), 1)
            r["goals"][f"{c.name}:{p}:ft_on_failing_redis_bytes_per_failure"] = \
                f"<= {width + 64:g}"


def spark_figures(variant: str, runs: list[Progress], walls: list[float]) -> dict[str, Any]:
    """From the queries' own progress: the micro-batches a run took (replay rounds
    included), the seconds Spark spent per micro-batch (``triggerExecution``: offsets,
    planning, the batch function, commit), the seconds of a run outside its micro-batches
    (its wall time ``walls`` less their sum: starting the query and ending it), its
    first micro-batch's excess over its others, and its tail (:func:`tail`: micro-batches
    after the input ended, and their seconds), medians over the runs."""
    med = statistics.median
    outside = (w - r.trigger_s for w, r in zip(walls, runs, strict=True))
    return {f"{variant}_micro_batches": med(r.batches for r in runs),
            f"{variant}_trigger_s_per_batch": round(med(r.trigger_s / max(r.batches, 1)
                                                        for r in runs), 4),
            f"{variant}_outside_batches_s": round(med(outside), 3),
            f"{variant}_first_batch_excess_s": round(med(r.first_excess for r in runs), 3),
            f"{variant}_tail_micro_batches": med(r.tail_batches for r in runs),
            f"{variant}_tail_s": round(med(r.tail_s for r in runs), 3)}  # fmt: skip


def goals(cadences: list[Cadence], pipelines: list[str]) -> dict[str, str]:
    """The goals of this run's figures, keyed ``<cadence>:<figure>`` and ``<pipeline>:<fit
    figure>``, as ``">= x"`` / ``"<= x"``."""
    g: dict[str, str] = {}
    for c in cadences:
        for p in pipelines:
            if c.per_batch in GOAL_FT_ON:
                for v in (v for v in variants(p) if v != "ft_on_failing"):
                    g[f"{c.name}:ratio_stream_{p}_{v}_vs_plain"] = \
                        f">= {GOAL_FT_ON[c.per_batch]}"
            g[f"{c.name}:ratio_stream_{p}_ft_on_failing_vs_plain"] = f">= {GOAL_FAILING}"
    if len(cadences) > 1:
        for p in pipelines:
            g.update({f"{p}:{k}": f"<= {v:g}" for k, v in GOAL_FIT.items()})
    return g


def text(r: dict[str, Any]) -> str:
    lines = [f"{r['payload_bytes']} B events, {r['repeat']} rounds (+{r['warmup']} warmup), "
             f"Redis {r['redis_version']}"]  # fmt: skip
    for cad in r["cadences"].values():
        lines.append(f"  {cad['batches']} micro-batches of {cad['events_per_batch']:,} events")
        for p in ("df", "arrow"):
            if p not in cad:
                continue
            f = cad[p]
            for v in variants(p):
                key = f"ratio_stream_{p}_{v}_vs_plain"
                if key not in f:  # recorded before the variant existed
                    continue
                q = f[f"{key}_quartiles"]
                lines.append(
                    f"    {p:5s} {v:14s} {f[key]:.3f}x plain (quartiles {q[0]:.3f}-{q[1]:.3f})"
                    f"  {f[f'{v}_s_per_batch']:.3f} s/batch vs {f['plain_s_per_batch']:.3f},"
                    f" +{f[f'{v}_extra_s_per_batch'] * 1e3:.0f} ms")
                if f.get(f"{v}_tail_micro_batches"):
                    lines.append(f"      of which {f[f'{v}_tail_micro_batches']:g} micro-batches "
                                 f"of replays alone after the input ended: "
                                 f"{f[f'{v}_tail_s']:.3f} s a run")  # fmt: skip
    for p, f in r["fit"].items():
        lines.append(f"  {p}: {f['ft_s_per_query']} s per query + {f['ft_ms_per_batch']} ms "
                     f"per micro-batch + {f['ft_us_per_record']} us per record over plain")
    if "python_source_s_per_query" in r:
        lines.append(f"  any Python streaming source: {r['python_source_s_per_query']} s per "
                     "query (Spark's, measured in this run)")
    for cname, cad in r["cadences"].items():
        for p in ("df", "arrow"):
            f = cad.get(p, {})
            if "ft_on_redis_bytes_per_record" not in f:
                continue
            more = (f"{f['ft_on_failing_redis_bytes_per_failure']} B more per failure "
                    f"(stage input row: {r['stage_input_arrow_bytes']} B)"
                    if "ft_on_failing_redis_bytes_per_failure" in f else
                    f"{f['ft_on_failing_failures']:g} failures reached Redis: too few to "
                    "measure their bytes")  # fmt: skip
            lines.append(f"  {p} {cname}: Redis received {f['ft_on_redis_bytes_per_record']} "
                         f"B per record; {more}")
    for name, (back, entered) in sorted(r.get("replays_read_back_entered", {}).items()):
        if back or entered:
            lines.append(f"  {name}: {back:g} replays read back from their files, "
                         f"{entered:g} entered at their stage (per run)")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cadences", default="5000x20,50000x8",
                    help="micro-batches as EVENTSxBATCHES, comma-separated")
    ap.add_argument("--pipelines", default="df,arrow", help="df, arrow or both")
    ap.add_argument("--payload-bytes", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=9, help="counted rounds")
    ap.add_argument("--warmup", type=int, default=1, help="rounds run, not counted")
    ap.add_argument("--redis-url", default=None, help="default: an embedded redis-server")
    ap.add_argument("--source", choices=["files", "kafka"], default="files",
                    help="JSON files, or a Kafka topic on a throwaway broker")
    ap.add_argument("--source-pairs", type=int, default=5,
                    help="paired queries measuring a Python source's cost per query")
    args = parse_args(ap)
    cadences = [Cadence.parse(x) for x in args.cadences.split(",")]
    pipelines = [p for p in args.pipelines.split(",") if p]
    r = run(cadences, pipelines, args.payload_bytes, args.repeat, args.warmup, args.redis_url,
            args.source_pairs, args.source)  # fmt: skip
    save("stream_overhead" if args.source == "files" else "stream_overhead_kafka", r)
    print(json.dumps(r) if args.json else text(r))


if __name__ == "__main__":
    main()
