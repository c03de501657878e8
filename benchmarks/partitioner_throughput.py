"""Throughput of the replay-side hash partitioner mirror (keys per second, measured).

Usage: ``python -m benchmarks.partitioner_throughput [--json] [--keys N]``

Measures ``HashPartitioner.partition`` for string keys and bigint keys (declared and inferred
types) and ``spark_murmur3`` alone, each over the same ``N`` seeded keys, best of
``--repeat`` runs. Prints a table, or with ``--json`` one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import string
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks._common import parse_args
from partitioners import HashPartitioner, spark_murmur3


def _keys(n: int, seed: int = 7) -> tuple[list[tuple[str]], list[tuple[int]]]:
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + "éж日😀"
    strings = [("".join(rng.choices(alphabet, k=rng.randint(4, 24))),) for _ in range(n)]
    longs = [(rng.randint(-(2**63), 2**63 - 1),) for _ in range(n)]
    return strings, longs


def _rate(fn: Callable[[Any], Any], keys: Sequence[Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for key in keys:
            fn(key)
        best = min(best, time.perf_counter() - start)
    return len(keys) / best if best > 0 else float("inf")


def measure(n: int, repeat: int = 3, partitions: int = 200) -> dict[str, Any]:
    """Keys/s of each case over ``n`` keys (best of ``repeat``)."""
    strings, longs = _keys(n)
    string_p = HashPartitioner(partitions, ["string"])
    long_p = HashPartitioner(partitions, ["bigint"])
    inferred = HashPartitioner(partitions)
    cases: dict[str, tuple[Callable[[Any], Any], Sequence[Any]]] = {
        "HashPartitioner.partition string": (string_p.partition, strings),
        "HashPartitioner.partition bigint": (long_p.partition, longs),
        "HashPartitioner.partition string (inferred)": (inferred.partition, strings),
        "HashPartitioner.partition bigint (inferred)": (inferred.partition, longs),
        "spark_murmur3 string": (lambda k: spark_murmur3(k, ["string"]), strings),
        "spark_murmur3 bigint": (lambda k: spark_murmur3(k, ["bigint"]), longs),
        "HashPartitioner.select": (lambda h: long_p.select(h, 0), [k[0] >> 32 for k in longs]),
    }
    return {
        "keys": n,
        "repeat": repeat,
        "num_partitions": partitions,
        "python": platform.python_version(),
        "keys_per_second": {name: round(_rate(fn, ks, repeat)) for name, (fn, ks) in cases.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000, help="keys per case")
    parser.add_argument("--repeat", type=int, default=3, help="runs per case (best is kept)")
    args = parse_args(parser, argv)
    if args.keys < 1 or args.repeat < 1:
        parser.error("--keys and --repeat must be positive")
    result = measure(args.keys, args.repeat)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.keys} keys per case, best of {args.repeat}, Python {result['python']}")
    width = max(map(len, result["keys_per_second"]))
    print(f"{'case':<{width}}  {'keys/s':>12}")
    for name, rate in result["keys_per_second"].items():
        print(f"{name:<{width}}  {rate:>12,}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
