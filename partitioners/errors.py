"""Errors raised by the replay partitioners.

Invariant: a partitioner either returns the partition Spark would have chosen or raises one
of these; it never guesses. Every class derives from :class:`PartitionerError`, itself a
:class:`ValueError`, so callers can catch the whole family at once.
"""

from __future__ import annotations

__all__ = [
    "InvalidPartitionError",
    "PartitionerError",
    "TypeMismatchError",
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


class InvalidPartitionError(PartitionerError):
    """A bad partition count."""

