"""The ``ftlayer-kafka`` data source (Spark 4's Python data source API): Kafka as a stream
(``spark.readStream.format("ftlayer-kafka")``) and as a batch (``spark.read``: a range of
offsets, or the exact offsets a replay needs, option ``wanted``).

The stream's offsets are Spark's Kafka source's (ftlayer.spark.kafka.offsets); one input
partition per topic-partition with records in the micro-batch. Invariants: a micro-batch's
range is fixed by its offsets in the checkpoint, so a re-run batch reads the same records;
a partition that appears later (new partitions, a new topic matching the pattern) starts
at its earliest offset; ``maxOffsetsPerTrigger`` caps a micro-batch, and with
``trigger(availableNow=True)`` the query ends at the offsets it found when it started.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

import ftlayer.spark.kafka.client as kc
from ftlayer.spark.kafka.offsets import Offsets, TopicPartition, dump, limited, load, runs

__all__ = ["FORMAT", "KafkaDataSource", "SEEK_GAP"]

FORMAT = "ftlayer-kafka"

SEEK_GAP = 8_000
"""Wanted offsets closer than this are read as one range: reading 8,000 records of 1 KB
costs about what one seek does (measured with librdkafka on a local broker: 50,000
records in 0.12 s sequentially, 23 ms a seek)."""


class KafkaPartition(InputPartition):
    """Records ``first <= offset < until`` of one topic-partition (only ``wanted``)."""

    def __init__(self, tp: TopicPartition, first: int, until: int,
                 wanted: Sequence[int] | None = None) -> None:  # fmt: skip
        self.tp, self.first, self.until, self.wanted = tp, first, until, wanted


def _lower(options: Any) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


class _Reading:
    """What both readers share: the options, a client made on first use, reading."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        self.headers = options.get("includeheaders", "false").lower() == "true"
        self.fail_on_data_loss = options.get("failondataloss", "true").lower() == "true"
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:  # a reader is pickled to tasks: no client
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = kc.consumer(self.options)
        return self._client

    def read(self, partition: Any) -> Iterator[pa.RecordBatch]:  # a KafkaPartition
        c = kc.consumer(self.options)
        try:
            yield from kc.read_range(c, partition.tp, partition.first, partition.until,
                                     partition.wanted, self.headers,
                                     self.fail_on_data_loss)  # fmt: skip
        finally:
            c.close()


class KafkaStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        cap = options.get("maxoffsetspertrigger")
        self.max_records = int(cap) if cap else None
        self.until: Offsets | None = None  # availableNow: the offsets to end at

    def _marks(self) -> dict[TopicPartition, tuple[int, int]]:
        return kc.watermarks(self.client, kc.topic_partitions(self.client, self.options))

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        return dump(kc.starting(self.options, self._marks()))

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.until = {tp: high for tp, (_, high) in self._marks().items()}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadAllAvailable() if self.max_records is None else ReadMaxRows(self.max_records)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        begin = load(start)
        marks = self._marks()
        end = {tp: high for tp, (_, high) in marks.items()}
        if self.until is not None:
            end = {tp: min(o, self.until.get(tp, begin.get(tp, marks[tp][0])))
                   for tp, o in end.items()}  # fmt: skip
        for tp, o in begin.items():
            end[tp] = max(end.get(tp, o), o)  # never behind the start (a partition gone)
        first = {tp: begin.get(tp, marks[tp][0]) for tp in end}  # new ones: from earliest
        cap = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return dump(limited(first, end, cap))

    def reportLatestOffset(self) -> dict[str, Any] | None:  # noqa: N802
        return dump({tp: high for tp, (_, high) in self._marks().items()})

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, stop = load(start), load(end)
        new = [tp for tp in stop if tp not in begin]
        lows = {tp: low for tp, (low, _) in kc.watermarks(self.client, new).items()}
        out: list[InputPartition] = []
        for tp, until in sorted(stop.items()):
            first = begin.get(tp, lows.get(tp, 0))
            if until > first:
                out.append(KafkaPartition(tp, first, until))
        return out

    def commit(self, end: dict[str, Any]) -> None:
        pass  # offsets live in Spark's checkpoint; nothing to commit to Kafka

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


class KafkaBatchReader(_Reading, DataSourceReader):
    """``wanted`` (JSON ``{"topic": {"partition": [offsets]}}``): those records, read in
    ranges of nearby offsets (SEEK_GAP), absent ones left out. Else ``startingOffsets``
    (default earliest) to ``endingOffsets`` (default latest), as Spark's batch read."""

    def partitions(self) -> list[InputPartition]:
        wanted = self.options.get("wanted")
        if wanted is not None:
            out: list[InputPartition] = []
            for topic, parts in json.loads(wanted).items():
                for p, offsets in parts.items():
                    for first, last in runs(offsets, SEEK_GAP):
                        inside = [o for o in offsets if first <= o <= last]
                        out.append(KafkaPartition((topic, int(p)), first, last + 1, inside))
            return out
        marks = kc.watermarks(self.client, kc.topic_partitions(self.client, self.options))
        begin = kc.starting(self.options, marks, default="earliest")
        ending = self.options.get("endingoffsets", "latest")
        end = ({tp: high for tp, (_, high) in marks.items()} if ending == "latest"
               else kc.starting({"startingOffsets": ending}, marks))  # fmt: skip
        return [KafkaPartition(tp, begin[tp], end[tp]) for tp in sorted(marks)
                if end[tp] > begin[tp]]  # fmt: skip


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        opts = _lower(self.options)
        headers = opts.get("includeheaders", "false").lower() == "true"
        return kc.SCHEMA + (", " + kc.HEADERS if headers else "")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:  # noqa: N802
        return KafkaStreamReader(_lower(self.options))

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaBatchReader(_lower(self.options))
