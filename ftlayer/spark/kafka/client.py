"""The Kafka client side of the ``ftlayer-kafka`` data source (``confluent-kafka``):
its options, the topic-partitions it reads, their watermarks, and a range of offsets read
as Arrow record batches with the columns of Spark's Kafka source.

Invariants: a range is read up to its end or to the partition's high watermark, whichever
comes first, never waiting for records that are gone (deleted by retention, compacted);
a start below the low watermark is data lost before ftlayer saw it, an error unless
``failOnDataLoss`` is false (as in Spark's Kafka source).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa

from ftlayer.errors import ConfigError
from ftlayer.spark.kafka.offsets import EARLIEST, LATEST, Offsets, TopicPartition, load

__all__ = ["ARROW_SCHEMA", "HEADERS", "KafkaReadError", "SCHEMA", "consumer", "read_range",
           "topic_partitions", "watermarks"]  # fmt: skip

log = logging.getLogger(__name__)

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int")  # fmt: skip
"""The columns of Spark's Kafka source (``includeHeaders``: and HEADERS)."""
HEADERS = "headers array<struct<key:string,value:binary>>"
ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
])  # fmt: skip
_HEADERS_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

BATCH_ROWS = 10_000
"""Records per Arrow batch a read yields (and per ``consume`` call)."""
STALL_S = 60.0
"""A read that gets nothing for this long while its records should be there fails (Spark
retries the task)."""


class KafkaReadError(RuntimeError):
    """A range that cannot be read: lost before it was read, or the broker stalled."""


def _options(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


def consumer(options: Mapping[str, str]) -> Any:
    """A consumer with the options' ``kafka.*`` settings (``kafka.bootstrap.servers``
    required), in a group of its own that commits nothing: ftlayer's offsets live in
    Spark's checkpoint, as Spark's Kafka source's do."""
    from confluent_kafka import Consumer

    opts = _options(options)
    conf: dict[str, Any] = {k[len("kafka."):]: v for k, v in opts.items()
                            if k.startswith("kafka.")}  # fmt: skip
    if "bootstrap.servers" not in conf:
        raise ConfigError("a Kafka source needs kafka.bootstrap.servers")
    conf.setdefault("group.id", f"ftlayer-{uuid.uuid4().hex[:12]}")
    conf.update({"enable.auto.commit": False, "enable.partition.eof": True,
                 "auto.offset.reset": "earliest"})  # fmt: skip
    conf.setdefault("fetch.wait.max.ms", 10)
    return Consumer(conf)


def topic_partitions(client: Any, options: Mapping[str, str]) -> list[TopicPartition]:
    """The topic-partitions the options name: ``assign`` (JSON ``{"topic": [0, 1]}``),
    ``subscribe`` (topics, comma-separated) or ``subscribePattern`` (a regex), as in
    Spark's Kafka source; exactly one of them."""
    opts = _options(options)
    given = [k for k in ("assign", "subscribe", "subscribepattern") if opts.get(k)]
    if len(given) != 1:
        raise ConfigError("a Kafka source takes exactly one of assign, subscribe and "
                          f"subscribePattern (got {given or 'none'})")  # fmt: skip
    if given[0] == "assign":
        return sorted((t, int(p)) for t, ps in json.loads(opts["assign"]).items() for p in ps)
    meta = client.list_topics(timeout=10)
    if given[0] == "subscribe":
        names = [t.strip() for t in opts["subscribe"].split(",") if t.strip()]
    else:
        pattern = re.compile(opts["subscribepattern"])
        names = [t for t in meta.topics if pattern.fullmatch(t) and not t.startswith("__")]
    out: list[TopicPartition] = []
    for t in names:
        topic = meta.topics.get(t)
        if topic is None or topic.error is not None:
            continue  # not there (yet): Spark's Kafka source reads it once it exists
        out.extend((t, p) for p in topic.partitions)
    return sorted(out)


def watermarks(client: Any, tps: Sequence[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
    """(low, high) watermark of each topic-partition: the first offset held and the next
    one to be written. The high one is the broker's answer to a fetch at the end of the
    partition, not ListOffsets' alone: some Kafka-protocol brokers (tansu 0.6) answer that
    with the last record batch's base offset + 1, short of the records that batch holds."""
    from confluent_kafka import KafkaError
    from confluent_kafka import TopicPartition as TP  # noqa: N817

    marks = {tp: tuple(client.get_watermark_offsets(TP(*tp), timeout=10)) for tp in tps}
    if not marks:
        return {}
    client.assign([TP(t, p, max(low, high - 1)) for (t, p), (low, high) in marks.items()])
    open_ = set(marks)
    deadline = time.monotonic() + 10
    try:
        while open_ and time.monotonic() < deadline:
            m = client.poll(0.2)  # one event as soon as there is one (consume() would
            err = None if m is None else m.error()  # wait out its timeout for a batch)
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                tp = (m.topic(), m.partition())
                marks[tp] = (marks[tp][0], max(marks[tp][1], m.offset()))
                open_.discard(tp)
    finally:
        client.unassign()
    if open_:
        raise KafkaReadError(f"Kafka: no end of partition reported for {sorted(open_)} in 10 s")
    return {tp: (int(lo), int(hi)) for tp, (lo, hi) in marks.items()}


def starting(options: Mapping[str, str], marks: Mapping[TopicPartition, tuple[int, int]],
             default: str = "latest") -> Offsets:  # fmt: skip
    """The first offsets to read: ``startingOffsets`` ``earliest``, ``latest`` or JSON
    (``-2``: earliest, ``-1``: latest; a partition it does not name starts at the
    latest), as Spark's Kafka source reads it."""
    text = _options(options).get("startingoffsets", default)
    if text in ("earliest", "latest"):
        return {tp: marks[tp][0 if text == "earliest" else 1] for tp in marks}
    given = load(text)
    out = {}
    for tp, (low, high) in marks.items():
        o = given.get(tp, LATEST)
        out[tp] = low if o == EARLIEST else high if o == LATEST else o
    return out


def read_range(client: Any, tp: TopicPartition, first: int, until: int,
               wanted: Sequence[int] | None = None, headers: bool = False,
               fail_on_data_loss: bool = True) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """Records ``first <= offset < until`` of ``tp`` (only the ``wanted`` offsets, when
    given) as Arrow batches of ARROW_SCHEMA (and ``headers``). Records gone meanwhile
    (retention, compaction) are skipped; a ``first`` below the low watermark raises
    KafkaReadError when ``fail_on_data_loss`` (a stream's range: records ftlayer never
    saw), not for ``wanted`` reads (a replay whose record is gone: its caller dead-letters
    it, naming it)."""
    from confluent_kafka import TopicPartition as TP  # noqa: N817

    span = _readable(client, tp, first, until, wanted is None, fail_on_data_loss)
    if span is None:
        return
    start, until = span
    keep = None if wanted is None else set(wanted)
    client.assign([TP(tp[0], tp[1], start)])
    cols: dict[str, list[Any]] = {f: [] for f in ("key", "value", "offset", "ts", "tst", "h")}
    stalled = time.monotonic()
    nxt = start
    while nxt < until:
        msgs = client.consume(min(BATCH_ROWS, until - nxt), timeout=1.0)
        if not msgs:
            if time.monotonic() - stalled > STALL_S:
                raise KafkaReadError(f"Kafka {tp[0]}-{tp[1]}: nothing read at offset {nxt} "
                                     f"for {STALL_S:.0f}s (range ends at {until})")  # fmt: skip
            continue
        stalled = time.monotonic()
        nxt = _take(msgs, tp, nxt, until, keep, cols, headers)
        if len(cols["offset"]) >= BATCH_ROWS:
            yield _batch(tp, cols, headers)
    if cols["offset"]:
        yield _batch(tp, cols, headers)


def _readable(client: Any, tp: TopicPartition, first: int, until: int, stream: bool,
              fail_on_data_loss: bool) -> tuple[int, int] | None:  # fmt: skip
    """The part of ``first..until`` that ``tp`` still holds, as (start, end); None:
    nothing, or (a replay's read, not a ``stream``'s) the topic is gone. A stream's
    range starting below the low watermark raises KafkaReadError when
    ``fail_on_data_loss``."""
    from confluent_kafka import KafkaError, KafkaException

    gone = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_PARTITION,
            KafkaError._UNKNOWN_TOPIC}  # fmt: skip
    try:
        low, high = watermarks(client, [tp])[tp]
    except KafkaException as e:
        if stream or e.args[0].code() not in gone:
            raise
        log.error("Kafka %s-%d is gone (%s): its replays' records are not there", *tp, e)
        return None
    if first < low and stream:
        text = (f"Kafka {tp[0]}-{tp[1]}: offsets {first}..{min(low, until) - 1} are gone "
                "(retention or compaction) before they were read")  # fmt: skip
        if fail_on_data_loss:
            raise KafkaReadError(text + "; set failOnDataLoss=false to go on without them")
        log.warning("%s: skipped (failOnDataLoss=false)", text)
    start, end = max(first, low), min(until, high)
    return (start, end) if start < end else None


def _take(msgs: list[Any], tp: TopicPartition, nxt: int, until: int, keep: set[int] | None,
          cols: dict[str, list[Any]], headers: bool) -> int:  # fmt: skip
    """Append the records of ``msgs`` (those in ``keep``, when given) to ``cols``; the next
    offset to read (``until``: the range is done, or the rest of it is gone)."""
    from confluent_kafka import KafkaError

    for m in msgs:
        err = m.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                return until  # the rest of the range is gone
            raise KafkaReadError(f"Kafka {tp[0]}-{tp[1]} at offset {nxt}: {err}")
        off = m.offset()
        if off >= until:
            return until
        nxt = off + 1
        if keep is not None and off not in keep:
            continue
        ts_type, ts = m.timestamp()
        cols["key"].append(m.key())
        cols["value"].append(m.value())
        cols["offset"].append(off)
        cols["ts"].append(ts * 1000 if ts >= 0 else None)
        cols["tst"].append(ts_type - 1 if ts_type > 0 else None)
        if headers:
            cols["h"].append([{"key": k, "value": v} for k, v in (m.headers() or [])])
    return nxt


def _batch(tp: TopicPartition, cols: dict[str, list[Any]], headers: bool) -> pa.RecordBatch:
    n = len(cols["offset"])
    arrays = [
        pa.array(cols["key"], pa.binary()), pa.array(cols["value"], pa.binary()),
        pa.array([tp[0]] * n, pa.string()), pa.array([tp[1]] * n, pa.int32()),
        pa.array(cols["offset"], pa.int64()),
        pa.array(cols["ts"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(cols["tst"], pa.int32()),
    ]  # fmt: skip
    schema = ARROW_SCHEMA
    if headers:
        arrays.append(pa.array(cols["h"], _HEADERS_TYPE))
        schema = schema.append(pa.field("headers", _HEADERS_TYPE))
    for v in cols.values():
        v.clear()
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
