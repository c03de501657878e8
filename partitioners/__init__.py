"""Replay partitioners that mirror Spark's placement of records bit for bit.

A replayed record must reach the partition where its key lives. These mirrors compute that
partition in Python exactly as Spark does (Spark itself is the oracle in the tests):

* :func:`spark_murmur3` / :func:`spark_xxhash64` – Spark SQL ``hash(…)`` / ``xxhash64(…)``;
* :func:`portable_hash` – PySpark's ``portable_hash`` (``rdd.partitionBy``);
* :class:`HashPartitioner`, :class:`PortableHashPartitioner`, :class:`RangePartitioner`,
  :class:`ForwardPartitioner`, :class:`BroadcastPartitioner`,
  :class:`RoundRobinPartitioner`, all :class:`ReplayPartitioner`, built by
  :func:`replay_partitioner`.

Unsupported input raises a :class:`PartitionerError`; a wrong partition is never returned.
This package depends on neither ``ftlayer`` nor ``serialization`` (nor on pyspark).
"""

from __future__ import annotations

from .errors import (
    HashSeedError,
    InvalidPartitionError,
    NonPortableValueError,
    PartitionerError,
    TypeMismatchError,
    UnsupportedStrategyError,
    UnsupportedTypeError,
    ValueOutOfRangeError,
)
from .murmur3 import spark_murmur3
from .portable import portable_hash
from .replay import (
    STRATEGIES,
    BroadcastPartitioner,
    ForwardPartitioner,
    HashPartitioner,
    PortableHashPartitioner,
    RangePartitioner,
    ReplayPartitioner,
    RoundRobinPartitioner,
    replay_partitioner,
)
from .spark_types import SparkType, infer_type, parse_type
from .xxhash64 import spark_xxhash64

__all__ = [
    "STRATEGIES",
    "BroadcastPartitioner",
    "ForwardPartitioner",
    "HashPartitioner",
    "HashSeedError",
    "InvalidPartitionError",
    "NonPortableValueError",
    "PartitionerError",
    "PortableHashPartitioner",
    "RangePartitioner",
    "ReplayPartitioner",
    "RoundRobinPartitioner",
    "SparkType",
    "TypeMismatchError",
    "UnsupportedStrategyError",
    "UnsupportedTypeError",
    "ValueOutOfRangeError",
    "infer_type",
    "parse_type",
    "portable_hash",
    "replay_partitioner",
    "spark_murmur3",
    "spark_xxhash64",
]
