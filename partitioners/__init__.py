"""The replay partitioner, which mirrors Spark's placement of records bit for bit.

A replayed record must reach the partition where its key lives. :class:`HashPartitioner`
computes that partition in Python exactly as ``df.repartition(n, *cols)`` does, from the
key or from the Murmur3 hash code stored with the record; :func:`spark_murmur3` and
:func:`spark_xxhash64` are Spark SQL's ``hash(...)`` and ``xxhash64(...)``. Spark itself is
the oracle in the tests.

Unsupported input raises a :class:`PartitionerError`; a wrong partition is never returned.
This package depends on neither ``ftlayer`` nor ``serialization`` (nor on pyspark).
"""

from __future__ import annotations

from .errors import (
    InvalidPartitionError,
    PartitionerError,
    TypeMismatchError,
    UnsupportedTypeError,
    ValueOutOfRangeError,
)
from .murmur3 import spark_murmur3
from .replay import HashPartitioner
from .spark_types import SparkType, infer_type, parse_type
from .xxhash64 import spark_xxhash64

__all__ = [
    "HashPartitioner",
    "InvalidPartitionError",
    "PartitionerError",
    "SparkType",
    "TypeMismatchError",
    "UnsupportedTypeError",
    "ValueOutOfRangeError",
    "infer_type",
    "parse_type",
    "spark_murmur3",
    "spark_xxhash64",
]
