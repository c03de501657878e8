"""KafkaSource: Kafka topics kept by reference (a
:class:`~ftlayer.spark.references.ReplayableSource`).

A record's reference is its topic-partition and offset: location ``xxhash64("<topic>-
<partition>")`` (a string hash computed in the JVM, as a file's path is), position its
offset; its lineage id is therefore ``xxhash64(source, topic-partition, offset)``, the
same however often the record is read. Nothing of the payload goes to Redis while
records succeed; a replay is read back by seeking to its offset, the replays of one
partition in ranges of nearby offsets (one seek each). An offset that is gone (retention,
compaction, a topic re-created) dead-letters its record with an error naming topic,
partition and offset.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ftlayer.errors import ConfigError
from ftlayer.spark.kafka.datasource import FORMAT, KafkaDataSource
from ftlayer.spark.references import location_id
from ftlayer.spark.vector_plan import LOC_COL, POS_COL

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["FORMAT", "KafkaSource", "partition_location", "register", "spark_read_options"]

_PARTITIONS: dict[int, tuple[str, int]] = {}
"""Location id -> (topic, partition), of every topic-partition a KafkaSource met."""
_SCANNED: set[str] = set()
"""Topics whose first MAX_PARTITIONS partitions' location ids are in _PARTITIONS."""
_registered: set[int] = set()

MAX_PARTITIONS = 10_000
"""Partitions per topic whose location ids a source finds without asking Kafka (the ids of
a named topic are a hash of its name and the partition number: computed, not listed)."""


def register(spark: SparkSession) -> None:
    """Register the ``ftlayer-kafka`` data source with ``spark`` (once per session)."""
    if id(spark) not in _registered:
        spark.dataSource.register(KafkaDataSource)
        _registered.add(id(spark))


def partition_location(topic: str, partition: int) -> int:
    """The location id of a topic-partition: Spark's ``xxhash64`` of ``<topic>-<n>``."""
    loc = location_id(f"{topic}-{partition}")
    _PARTITIONS[loc] = (topic, partition)
    return loc


@dataclass(frozen=True)
class KafkaSource:
    """Kafka topics read by ftlayer's ``ftlayer-kafka`` source, kept by reference:
    ``KafkaSource("broker:9092", topics=["events"], startingOffsets="earliest",
    maxOffsetsPerTrigger=50000)``. ``topics`` (or ``pattern``, a regex, or ``assign``,
    Spark's JSON) name what it reads; ``**options``: Spark's Kafka source options
    (``startingOffsets``, ``maxOffsetsPerTrigger``, ``includeHeaders``,
    ``failOnDataLoss``) and ``kafka.*`` settings of the client (librdkafka's names)."""

    bootstrap_servers: str
    """The brokers, ``host:port`` comma-separated (Spark's ``kafka.bootstrap.servers``)."""
    topics: tuple[str, ...] = ()
    """The topics read (Spark's ``subscribe``)."""
    pattern: str | None = None
    """A regex of the topics read (Spark's ``subscribePattern``), instead of ``topics``."""
    options: Mapping[str, str] = field(default_factory=dict)
    """Spark's Kafka source options (``startingOffsets``, ``maxOffsetsPerTrigger``,
    ``includeHeaders``, ``failOnDataLoss``, ``assign``) and ``kafka.*`` client settings,
    given as keyword arguments."""
    connector: str = "ftlayer"
    """``ftlayer``: ftlayer's own Kafka source (``confluent-kafka``); ``spark``: Spark's
    Kafka connector, where its jar is installed (the same columns, so the same
    references; replays read back with ``spark.read.format("kafka")``)."""

    def __init__(self, bootstrap_servers: str, topics: Sequence[str] | str = (), *,
                 pattern: str | None = None, connector: str = "ftlayer",
                 **options: Any) -> None:  # fmt: skip
        names = (topics,) if isinstance(topics, str) else tuple(topics)
        if bool(names) + bool(pattern) + ("assign" in options) != 1:
            raise ConfigError("a KafkaSource reads topics=, pattern= or assign=: exactly one")
        if connector not in ("ftlayer", "spark"):
            raise ConfigError(f"connector is 'ftlayer' or 'spark', not {connector!r}")
        object.__setattr__(self, "connector", connector)
        object.__setattr__(self, "bootstrap_servers", bootstrap_servers)
        object.__setattr__(self, "topics", names)
        object.__setattr__(self, "pattern", pattern)
        object.__setattr__(self, "options", {k: str(v) for k, v in options.items()})

    @property
    def identity(self) -> str:
        """What it reads, for the source's owner (ftlayer.sources): its topics."""
        what = ",".join(self.topics) or self.pattern or self.options.get("assign", "")
        return f"kafka:{what}"

    def _reader_options(self) -> dict[str, str]:
        opts = {"kafka.bootstrap.servers": self.bootstrap_servers, **self.options}
        if self.topics:
            opts["subscribe"] = ",".join(self.topics)
        elif self.pattern:
            opts["subscribePattern"] = self.pattern
        return opts

    def stream(self, spark: SparkSession) -> DataFrame:
        if self.connector == "spark":
            return spark.readStream.format("kafka").options(**self._reader_options()).load()
        register(spark)
        return spark.readStream.format(FORMAT).options(**self._reader_options()).load()

    def reference(self, df: DataFrame) -> tuple[Column, Column]:
        from pyspark.sql import functions as F  # noqa: N812

        tp = F.concat(F.col("topic"), F.lit("-"), F.col("partition").cast("string"))
        return F.xxhash64(tp), F.col("offset")

    def remember(self, spark: SparkSession, locations: Sequence[int]) -> None:
        if any(loc not in _PARTITIONS for loc in locations):
            self._find_partitions()

    def _named_topics(self) -> list[str]:
        return list(self.topics) or list(json.loads(self.options.get("assign", "{}")))

    def _find_partitions(self) -> None:
        """Location ids of this source's partitions: computed for the topics it names
        (their first MAX_PARTITIONS partitions), listed from Kafka for a pattern."""
        for topic in self._named_topics():
            if topic not in _SCANNED:
                for p in range(MAX_PARTITIONS):
                    partition_location(topic, p)
                _SCANNED.add(topic)
        if self.pattern is None:
            return
        if self.connector == "spark":
            raise ConfigError("connector='spark' keeps Kafka by reference for topics= or "
                              "assign=, not a pattern (no client to list its topics)")  # fmt: skip
        from ftlayer.spark.kafka.client import consumer, topic_partitions

        c = consumer(self._reader_options())
        try:
            for topic, p in topic_partitions(c, self._reader_options()):
                partition_location(topic, p)
        finally:
            c.close()

    def location_name(self, location: int) -> str:
        tp = _PARTITIONS.get(location)
        if tp is None:
            return f"a Kafka partition of {self.identity} (location id {location:#x})"
        return f"Kafka topic {tp[0]!r} partition {tp[1]}"

    def not_found(self, location: int, position: int) -> str:
        """Why a replay's record was not read back: its offset is gone."""
        return (f"replay source record not found: {self.location_name(location)} offset "
                f"{position} is gone (retention, compaction, or the topic re-created)")

    def read_back(
        self, spark: SparkSession, locations: Sequence[int], wanted: DataFrame
    ) -> DataFrame | None:
        self.remember(spark, locations)
        offsets: dict[str, dict[str, list[int]]] = {}
        for row in wanted.select(LOC_COL, POS_COL).toArrow().to_pylist():
            tp = _PARTITIONS.get(row[LOC_COL])
            if tp is not None:
                offsets.setdefault(tp[0], {}).setdefault(str(tp[1]), []).append(row[POS_COL])
        if not offsets:
            return None
        opts = {k: v for k, v in self._reader_options().items()
                if k not in ("startingOffsets", "maxOffsetsPerTrigger", "subscribe",
                             "subscribePattern", "assign")}  # fmt: skip
        if self.connector == "spark":
            return spark.read.format("kafka").options(**opts, **spark_read_options(offsets)).load()
        register(spark)
        reader = spark.read.format(FORMAT).options(**opts)
        return reader.option("wanted", json.dumps(offsets)).load()


def spark_read_options(offsets: Mapping[str, Mapping[str, Sequence[int]]]) -> dict[str, str]:
    """The options of Spark's Kafka connector's batch read holding the ``offsets`` (topic
    -> partition -> wanted offsets): those partitions (``assign``), each from its smallest
    to past its largest wanted offset; an offset that is gone is left out, not an error
    (``failOnDataLoss``: its record is dead-lettered, named)."""
    parts = {t: sorted(int(p) for p in ps) for t, ps in offsets.items()}
    start = {t: {p: min(o) for p, o in ps.items()} for t, ps in offsets.items()}
    end = {t: {p: max(o) + 1 for p, o in ps.items()} for t, ps in offsets.items()}
    return {"assign": json.dumps(parts), "startingOffsets": json.dumps(start),
            "endingOffsets": json.dumps(end), "failOnDataLoss": "false"}  # fmt: skip
