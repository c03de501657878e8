"""Spark-free tests: HashPartitioner.select semantics, properties, bad inputs."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partitioners
from partitioners import (
    HashPartitioner,
    InvalidPartitionError,
    PartitionerError,
    TypeMismatchError,
    UnsupportedTypeError,
    ValueOutOfRangeError,
    spark_murmur3,
    spark_xxhash64,
)

INT64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=20)
counts = st.integers(1, 1000)


@settings(max_examples=300, deadline=None)
@given(key=st.tuples(INT64), n=counts)
def test_select_of_stored_hash_equals_partition_bigint(key: tuple[int], n: int) -> None:
    p = HashPartitioner(n, ["bigint"])
    assert p.select(spark_murmur3(key, ["bigint"]), 0) == (p.partition(key),)
    assert HashPartitioner(n).partition(key) == p.partition(key)


@settings(max_examples=300, deadline=None)
@given(key=st.tuples(TEXT, st.none() | INT64, st.none() | st.floats()), n=counts)
def test_select_of_stored_hash_equals_partition_multi(key: tuple[Any, ...], n: int) -> None:
    types = ["string", "bigint", "double"]
    p = HashPartitioner(n, types)
    (target,) = p.select(spark_murmur3(key, types), n - 1)
    assert 0 <= target < n
    assert target == p.partition(key) == HashPartitioner(n).partition(key)


@given(st.tuples(TEXT, INT64))
def test_nulls_pass_the_seed_through(key: tuple[str, int]) -> None:
    assert spark_murmur3((None,) + key) == spark_murmur3(key) == spark_murmur3(key + (None,))
    assert spark_xxhash64((None, None)) == 42 == spark_murmur3((None, None))


def test_negative_zero_and_nan_normalised() -> None:
    for t in ("float", "double"):
        assert spark_murmur3((-0.0,), [t]) == spark_murmur3((0.0,), [t])
        assert spark_xxhash64((-0.0,), [t]) == spark_xxhash64((0.0,), [t])
    nan2 = -float("nan")
    assert spark_murmur3((nan2,), ["double"]) == spark_murmur3((float("nan"),), ["double"])


def test_select_is_pmod_of_the_stored_hash() -> None:
    assert HashPartitioner(7).select(-1, 3) == ((-1) % 7,) == (6,)
    assert HashPartitioner(7).num_partitions == 7


def test_errors_are_one_family() -> None:
    for cls in (InvalidPartitionError, TypeMismatchError, UnsupportedTypeError,
                ValueOutOfRangeError):  # fmt: skip
        assert issubclass(cls, PartitionerError) and issubclass(cls, ValueError)
    assert set(partitioners.__all__) >= {"PartitionerError", "HashPartitioner"}


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: spark_murmur3(({"a": 1},)), UnsupportedTypeError),
        (lambda: spark_xxhash64(([1],)), UnsupportedTypeError),
        (lambda: spark_murmur3(("a",), ["string collate UTF8_LCASE"]), UnsupportedTypeError),
        (lambda: HashPartitioner(3, ["string COLLATE unicode_ci"]), UnsupportedTypeError),
        (lambda: spark_murmur3((1,), ["map<string,int>"]), UnsupportedTypeError),
        (lambda: spark_murmur3((1,), ["decimal(40,2)"]), UnsupportedTypeError),
        (lambda: spark_murmur3((128,), ["tinyint"]), ValueOutOfRangeError),
        (lambda: spark_murmur3((-(2**15) - 1,), ["smallint"]), ValueOutOfRangeError),
        (lambda: spark_murmur3((2**31,), ["int"]), ValueOutOfRangeError),
        (
            lambda: spark_murmur3(
                (2**63,),
            ),
            ValueOutOfRangeError,
        ),
        (lambda: HashPartitioner(4, ["bigint"]).partition((-(2**63) - 1,)), ValueOutOfRangeError),
        (lambda: spark_xxhash64((2**63,), ["bigint"]), ValueOutOfRangeError),
        (lambda: spark_murmur3((Decimal("1.234"),), ["decimal(10,2)"]), ValueOutOfRangeError),
        (lambda: spark_murmur3((Decimal("1e10"),), ["decimal(10,2)"]), ValueOutOfRangeError),
        (
            lambda: spark_murmur3(
                (Decimal("NaN"),),
            ),
            ValueOutOfRangeError,
        ),
        (lambda: spark_murmur3((1e39,), ["float"]), ValueOutOfRangeError),
        (lambda: spark_murmur3(("\ud800",), ["string"]), ValueOutOfRangeError),
        (lambda: spark_murmur3(("1",), ["int"]), TypeMismatchError),
        (lambda: spark_murmur3((True,), ["bigint"]), TypeMismatchError),
        (lambda: spark_murmur3((1,), ["double"]), TypeMismatchError),
        (lambda: spark_murmur3((1,), ["boolean"]), TypeMismatchError),
        (lambda: spark_murmur3((b"x",), ["string"]), TypeMismatchError),
        (lambda: spark_murmur3(("x",), ["binary"]), TypeMismatchError),
        (lambda: spark_murmur3((1.5,), ["decimal(10,2)"]), TypeMismatchError),
        (lambda: spark_murmur3((datetime.date(2020, 1, 1),), ["timestamp"]), TypeMismatchError),
        (lambda: spark_murmur3(("2020-01-01",), ["date"]), TypeMismatchError),
        (lambda: spark_murmur3((1, 2), ["int"]), TypeMismatchError),
        (lambda: spark_murmur3(5), TypeMismatchError),
        (lambda: HashPartitioner(4, ["int"]).partition((1, 2)), TypeMismatchError),
        (lambda: HashPartitioner(4, ["int"]).partition(1), TypeMismatchError),
        (lambda: HashPartitioner(4, ["int", "int"]).partition(("1", 2)), TypeMismatchError),
        (lambda: HashPartitioner(4, ["string"]).partition((1,)), TypeMismatchError),
        (lambda: HashPartitioner(4).partition("ab"), TypeMismatchError),
        (lambda: HashPartitioner(0), InvalidPartitionError),
        (lambda: HashPartitioner(4).select(2**31, 0), ValueOutOfRangeError),
    ],
)
def test_bad_inputs_raise(call: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()
