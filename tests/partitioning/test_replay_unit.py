"""Spark-free tests: replay select() semantics, properties, portable seed mirror, bad inputs."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import partitioners
from partitioners import (
    STRATEGIES,
    BroadcastPartitioner,
    ForwardPartitioner,
    HashPartitioner,
    HashSeedError,
    InvalidPartitionError,
    NonPortableValueError,
    PartitionerError,
    PortableHashPartitioner,
    RangePartitioner,
    ReplayPartitioner,
    RoundRobinPartitioner,
    TypeMismatchError,
    UnsupportedStrategyError,
    UnsupportedTypeError,
    ValueOutOfRangeError,
    portable_hash,
    replay_partitioner,
    spark_murmur3,
    spark_xxhash64,
)
from partitioners.portable import seeded_str_hash

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


def test_select_per_strategy() -> None:
    assert HashPartitioner(7).select(-1, 3) == ((-1) % 7,) == (6,)
    assert ForwardPartitioner(4).select(999, 2) == (2,)
    assert PortableHashPartitioner(4).select(999, 3) == (3,)
    assert RangePartitioner([10, 20]).select(5, 2) == (2,)
    assert BroadcastPartitioner(3).select(0, 0) == (0, 1, 2)
    rr = RoundRobinPartitioner(3, start=1)
    picks = [rr.select(0, 0)[0] for _ in range(9)]
    assert picks == [1, 2, 0] * 3
    for p in (HashPartitioner(2), ForwardPartitioner(2), RangePartitioner([1]), rr):
        assert isinstance(p, ReplayPartitioner)


def test_factory() -> None:
    expected = {
        "hash": HashPartitioner,
        "portable_hash": PortableHashPartitioner,
        "forward": ForwardPartitioner,
        "broadcast": BroadcastPartitioner,
        "round_robin": RoundRobinPartitioner,
    }
    for name, cls in expected.items():
        p = replay_partitioner(name, 5)
        assert type(p) is cls and p.num_partitions == 5 and p.strategy == name
    hp = replay_partitioner("hash", 9, types=["string"])
    assert isinstance(hp, HashPartitioner) and hp.partition(("x",)) == HashPartitioner(9).partition(
        ("x",)
    )
    rp = replay_partitioner("range", bounds=[5, 1], ascending=False)
    assert isinstance(rp, RangePartitioner) and rp.num_partitions == 3
    assert set(STRATEGIES) == set(expected) | {"range"}
    with pytest.raises(UnsupportedStrategyError):
        replay_partitioner("zigzag", 3)
    with pytest.raises(InvalidPartitionError):
        replay_partitioner("hash")
    with pytest.raises(InvalidPartitionError):
        replay_partitioner("range", 4, bounds=[1])
    with pytest.raises(InvalidPartitionError):
        replay_partitioner("range", 2)


def test_range_partitioner_orders() -> None:
    asc = RangePartitioner([None, 0.0, 5.5, float("nan")])
    assert [asc.partition(v) for v in (None, -1e9, -0.0, 0.0, 1.0, 5.5, 6.0, float("nan"))] == [
        0,
        1,
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    desc = RangePartitioner(["z", "b"], ascending=False)
    assert desc.nulls_first is False
    assert [desc.partition(v) for v in ("zz", "z", "c", "b", "a", "", None)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        2,
    ]
    two = RangePartitioner([("a", 1), ("a", None), ("b", 3)], nulls_first=False)
    assert [two.partition(k) for k in (("a", 0), ("a", 2), ("a", None), ("b", 0), ("c", 0))] == [
        0,
        1,
        1,
        2,
        3,
    ]


def test_errors_are_one_family() -> None:
    for cls in (
        HashSeedError,
        InvalidPartitionError,
        NonPortableValueError,
        TypeMismatchError,
        UnsupportedStrategyError,
        UnsupportedTypeError,
        ValueOutOfRangeError,
    ):
        assert issubclass(cls, PartitionerError) and issubclass(cls, ValueError)
    assert set(partitioners.__all__) >= {"PartitionerError", "ReplayPartitioner"}


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
        (lambda: ForwardPartitioner(4).select(0, 4), InvalidPartitionError),
        (lambda: RangePartitioner([1, 2]).select(0, -1), InvalidPartitionError),
        (lambda: RangePartitioner([2, 1]), InvalidPartitionError),
        (lambda: RangePartitioner([1, 1]), InvalidPartitionError),
        (lambda: RangePartitioner([1, "a"]), InvalidPartitionError),
        (lambda: RangePartitioner([1, 2]).partition("x"), InvalidPartitionError),
        (lambda: RangePartitioner([(1, 2)]).partition((1, 2, 3)), InvalidPartitionError),
    ],
)
def test_bad_inputs_raise(call: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        call()


def test_portable_hash_needs_seed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(HashSeedError, match="PYTHONHASHSEED"):
        portable_hash("a")
    with pytest.raises(HashSeedError, match="PYTHONHASHSEED"):
        PortableHashPartitioner(3).partition(1)
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    with pytest.raises(HashSeedError, match="PYTHONHASHSEED"):
        portable_hash("a")


@pytest.mark.parametrize(
    "value",
    [float("nan"), (1, float("nan")), Decimal("NaN"), object(), datetime.date(2020, 1, 1), [1]],
)
def test_portable_hash_refuses_non_portable(monkeypatch: pytest.MonkeyPatch, value: Any) -> None:
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    with pytest.raises(NonPortableValueError):
        portable_hash(value)


_CHILD = """
import json, sys
from decimal import Decimal
from pyspark.rdd import portable_hash
def tup(k):
    return tuple(tup(i) for i in k) if isinstance(k, list) else k
keys = [tup(k) for k in json.loads(sys.argv[1])]
keys += [b"", b"\\x00\\xff", b"bytes-key!", Decimal("2.5"), (None, b"x")]
print(json.dumps([portable_hash(k) for k in keys]))
"""

KEYS: list[Any] = [
    None,
    0,
    -1,
    2**62,
    1.5,
    True,
    "",
    "a",
    "abcdefgh",
    "abcdefghi",
    "é",
    "ж日",
    "😀",
    "\x00",
    ["a", None, 3],
    ["é", ["x", 2.5]],
]


def _tup(k: Any) -> Any:
    return tuple(_tup(i) for i in k) if isinstance(k, list) else k


@pytest.mark.parametrize("seed", ["0", "1", "2718", "4294967295"])
def test_portable_hash_mirrors_a_worker_with_that_seed(
    monkeypatch: pytest.MonkeyPatch, seed: str
) -> None:
    """Another interpreter started with PYTHONHASHSEED=seed plays Spark's worker; this one
    (whatever its own seed) must agree once the variable names that seed."""
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(KEYS)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    expected = json.loads(out.stdout)
    keys = [_tup(k) for k in KEYS]
    keys += [b"", b"\x00\xff", b"bytes-key!", Decimal("2.5"), (None, b"x")]
    monkeypatch.setenv("PYTHONHASHSEED", seed)
    assert [portable_hash(k) for k in keys] == expected
    for k, h in zip(keys, expected, strict=True):
        assert PortableHashPartitioner(13).partition(k) == h % 13
        if isinstance(k, (str, bytes)):
            assert seeded_str_hash(k, int(seed)) == h


_NATIVE = "import os; from partitioners.portable import _hasher; print(_hasher().native)"


@pytest.mark.parametrize(("own", "named", "native"), [("5", "5", True), ("5", "6", False)])
def test_builtin_hash_is_used_only_when_seeds_agree(own: str, named: str, native: bool) -> None:
    code = f"import os; os.environ['PYTHONHASHSEED'] = {named!r}; {_NATIVE}"
    env = {**os.environ, "PYTHONHASHSEED": own}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == str(native)
