"""Kafka, kept by reference: a Spark streaming source of ftlayer's own over
``confluent-kafka`` (Spark 4's Python data source API, format ``ftlayer-kafka``), and
:class:`KafkaSource`, the :class:`~ftlayer.spark.references.ReplayableSource` that keeps
each record as its (topic-partition, offset) and reads a replay back by seeking.

The stream has the columns of Spark's own Kafka source (``key``, ``value``, ``topic``,
``partition``, ``offset``, ``timestamp``, ``timestampType``, and ``headers`` with
``includeHeaders``) and takes its options (``subscribe``, ``subscribePattern``,
``assign``, ``startingOffsets``, ``maxOffsetsPerTrigger``, ``kafka.*`` for the client), so
a job written for Spark's Kafka source keeps its code. Offsets live in Spark's checkpoint
as Spark's do: ``{"topic": {"partition": next offset}}``.

Modules: ``offsets`` (offset maps, the per-trigger limit, runs of wanted offsets),
``client`` (the Kafka client: metadata, watermarks, reading a range as Arrow),
``datasource`` (the data source: stream and batch readers), ``source`` (KafkaSource).
"""

from ftlayer.spark.kafka.source import FORMAT, KafkaSource

__all__ = ["FORMAT", "KafkaSource"]
