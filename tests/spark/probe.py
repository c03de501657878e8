"""Test instruments that run inside Spark tasks: they record into the session's Redis.

Registered pickle-by-value, so Spark's workers need not import this test module.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import redis
from pyspark import TaskContext, cloudpickle


def _clients() -> dict[tuple[int, str], redis.Redis]:
    """Clients per (process, URL), kept on ``sys`` (pickled by reference): a module-level
    dict here would be pickled by value, live clients included."""
    cache: dict[tuple[int, str], redis.Redis] = sys.__dict__.setdefault("_ftlayer_probe", {})
    return cache


class TaskKilled(BaseException):  # noqa: N818 -- simulates a crashed task, not an error
    """Escapes every ``except Exception``: the task dies as if its worker crashed."""


class Probe:
    """Picklable (a URL and a key prefix); records what the pipeline saw."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url, self.prefix = url, prefix

    @property
    def r(self) -> redis.Redis:
        key, cache = (os.getpid(), self.url), _clients()
        if key not in cache:
            cache[key] = redis.Redis.from_url(self.url)
        return cache[key]

    def first_time(self, tag: str, ident: Any) -> bool:
        return int(self.r.sadd(f"{self.prefix}:{tag}", str(ident))) == 1

    def write(self, records: list[dict[str, Any]]) -> None:
        if records:
            self.r.rpush(f"{self.prefix}:sink", *[str(r["id"]) for r in records])

    def write_one(self, record: dict[str, Any]) -> None:
        self.r.rpush(f"{self.prefix}:out", repr(sorted(record.items())))

    def check_partition(self, record: dict[str, Any], want: int) -> None:
        """Record where ``record`` ran against ``want``, the partition real Spark gives
        its key (``spark_placement``): never a partitioner of ours on both sides."""
        tc = TaskContext.get()
        self.r.rpush(f"{self.prefix}:placed_ids", str(record["id"]))
        replay = not self.first_time("placed", record["id"])
        self.r.incr(f"{self.prefix}:checked:{'replay' if replay else 'fresh'}")
        if tc.partitionId() != want:
            self.r.rpush(f"{self.prefix}:misplaced", f"{record['id']}:{tc.partitionId()}!={want}")
        if tc.attemptNumber() > 0:
            self.r.sadd(f"{self.prefix}:retried", f"{tc.stageId()}/{tc.partitionId()}")

    # -- reading back (driver side) ------------------------------------------------------
    def ids(self, what: str = "sink") -> list[int]:
        return [int(x) for x in self.r.lrange(f"{self.prefix}:{what}", 0, -1)]

    def strings(self, what: str) -> list[str]:
        return [x.decode() for x in self.r.lrange(f"{self.prefix}:{what}", 0, -1)]

    def count(self, what: str) -> int:
        return int(self.r.get(f"{self.prefix}:{what}") or 0)

    def members(self, what: str) -> set[str]:
        return {x.decode() for x in self.r.smembers(f"{self.prefix}:{what}")}


cloudpickle.register_pickle_by_value(sys.modules[__name__])


def spark_placement(spark: Any, keys: int, spark_type: str, n: int) -> dict[int, int]:
    """Key -> partition as Spark's own ``repartition(n, key)`` places keys 0..keys-1 of
    ``spark_type`` (the oracle the pipelines' placement is checked against)."""
    from pyspark.sql import functions as F  # noqa: N812

    df = spark.range(keys).select(F.col("id").cast(spark_type).alias("key"))
    rows = df.repartition(n, "key").select("key", F.spark_partition_id().alias("p")).collect()
    return {int(r["key"]): int(r["p"]) for r in rows}


def first_seen(probe: Probe, tag: str, ids: Any, where: Any) -> Any:
    """Indices of the rows where ``where`` holds whose id ``tag`` sees for the first time
    (one round trip; numpy arrays in and out)."""
    import numpy as np

    cand = np.flatnonzero(where)
    if not len(cand):
        return cand
    with probe.r.pipeline(transaction=False) as p:
        for i in ids[cand].tolist():
            p.sadd(f"{probe.prefix}:{tag}", i)
        return cand[np.array(p.execute(), dtype=bool)]


def times_seen(probe: Probe, tag: str, ids: Any) -> Any:
    """For each id, how many times ``tag`` has seen it, this call included (one round
    trip; numpy arrays in and out)."""
    import numpy as np

    if len(ids) == 0:
        return np.zeros(0, np.int64)
    with probe.r.pipeline(transaction=False) as p:
        for i in ids.tolist():
            p.hincrby(f"{probe.prefix}:{tag}", str(i), 1)
        return np.array(p.execute(), dtype=np.int64)


def calls(probe: Probe, tag: str) -> dict[int, int]:
    """How many times ``tag`` has seen each id (what :func:`times_seen` counted)."""
    return {int(k): int(v) for k, v in probe.r.hgetall(f"{probe.prefix}:{tag}").items()}


class Counted:
    """A batch stage passing its rows on, counting each id it sees under ``tag``
    (:func:`calls` reads the counts)."""

    def __init__(self, probe: Probe, tag: str) -> None:
        self.probe, self.tag = probe, tag
        self.__name__ = f"counted_{tag}"

    def __call__(self, b: Any) -> Any:
        times_seen(self.probe, self.tag, b.column("id").to_numpy())
        return b


class FailsOnce:
    """A batch stage failing the ids = ``rem`` (mod ``mod``) the first time it sees them."""

    def __init__(self, probe: Probe, mod: int, rem: int) -> None:
        self.probe, self.mod, self.rem = probe, mod, rem
        self.__name__ = "fails_once"

    def __call__(self, b: Any) -> Any:
        from ftlayer.spark import Outcome

        ids = b.column("id").to_numpy()
        return Outcome(b, failed=first_seen(self.probe, "fails_once", ids,
                                            ids % self.mod == self.rem),
                       errors="fails the first time")  # fmt: skip


class FanOut:
    """A batch stage making two rows (``copy`` 0 and 1) of each id = 0 (mod 5), one of
    the others (columns id, key = id mod ``keys``, copy), counting each id under ``s1``."""

    def __init__(self, probe: Probe, keys: int) -> None:
        self.probe, self.keys = probe, keys
        self.__name__ = "fan_out"

    def __call__(self, b: Any) -> Any:
        import numpy as np
        import pyarrow as pa

        from ftlayer.spark import Outcome

        ids = b.column("id").to_numpy()
        times_seen(self.probe, "s1", ids)
        parents = np.sort(np.concatenate([np.arange(len(ids)), np.flatnonzero(ids % 5 == 0)]))
        copy = np.zeros(len(parents), np.int64)
        copy[1:] = parents[1:] == parents[:-1]
        out = pa.RecordBatch.from_arrays(
            [pa.array(ids[parents]), pa.array(ids[parents] % self.keys), pa.array(copy)],
            names=["id", "key", "copy"])  # fmt: skip
        return Outcome(out, parents=parents)
