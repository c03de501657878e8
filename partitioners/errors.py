"""Errors raised by the replay partitioners.

Invariant: a partitioner either returns the partition Spark would have chosen or raises one
of these; it never guesses. Every class derives from :class:`PartitionerError`, itself a
:class:`ValueError`, so callers can catch the whole family at once.
"""

from __future__ import annotations

__all__ = [
    "HashSeedError",
    "InvalidPartitionError",
    "NonPortableValueError",
    "PartitionerError",
    "TypeMismatchError",
    "UnsupportedStrategyError",
    "UnsupportedTypeError",
    "ValueOutOfRangeError",
]


class PartitionerError(ValueError):
    """Root of every error raised by :mod:`partitioners`."""


class UnsupportedTypeError(PartitionerError):
    """A Spark SQL type name we do not mirror (e.g. a collated string), or a Python value
    whose Spark SQL type cannot be inferred (e.g. a ``dict``)."""


class TypeMismatchError(PartitionerError):
    """A Python value of the wrong type for the declared Spark SQL type (e.g. a ``str`` for
    ``int``, a ``bool`` for ``bigint``)."""


class ValueOutOfRangeError(PartitionerError):
    """A value that does not fit its Spark SQL type: an int outside the type's range, a
    decimal with too many digits or a non-finite decimal, a double that overflows ``float``,
    or a hash code outside the signed 32-bit range."""


class HashSeedError(PartitionerError):
    """``PYTHONHASHSEED`` is missing or invalid, or the Python hash of this interpreter
    cannot be mirrored for the seed Spark's Python workers use."""


class NonPortableValueError(PartitionerError):
    """A value whose Python hash is not the same across processes (NaN, objects hashed by
    identity) or that :func:`partitioners.portable_hash` does not mirror."""


class InvalidPartitionError(PartitionerError):
    """A bad partition count, an original partition outside ``[0, num_partitions)``, or range
    bounds that are not strictly increasing or not comparable with a key."""


class UnsupportedStrategyError(PartitionerError):
    """:func:`partitioners.replay_partitioner` was given a strategy name it does not know."""
