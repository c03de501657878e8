"""Row stages (map, flat_map, filter, sink) on the vectorized machinery: records look like
``Row.asDict()`` and keep their values across Spark's shuffle, keys land where Spark puts
them (Spark is the oracle), bad keys fail their record alone, fan-out siblings never
arrive twice, the success path touches Redis O(tasks) times."""

from __future__ import annotations

import datetime as dt
import sys
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from pyspark import TaskContext, cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F  # noqa: N812

from ftlayer import ConfigError, FailRecord
from ftlayer.spark.row_stages import decode_rec, encode_rec
from tests.spark.probe import Probe

cloudpickle.register_pickle_by_value(sys.modules[__name__])
pytestmark = pytest.mark.spark


def test_records_cross_a_shuffle_with_their_values() -> None:
    rec = {
        "id": np.int64(3), "f": np.float32(0.5), "ts": dt.datetime(2026, 1, 2, 3, 4, 5, 6),
        "tz": dt.datetime(2026, 1, 2, tzinfo=dt.timezone.utc), "day": dt.date(2026, 2, 3),
        "amount": Decimal("12.3400"), "raw": bytearray(b"\x00\xff"), "xs": [1, None, (2, 3)],
        "nested": {"k": [Decimal("-1")]}, 7: "int key",
    }  # fmt: skip
    back = decode_rec(encode_rec(rec))
    assert back == {**rec, "id": 3, "f": 0.5, "raw": b"\x00\xff", "xs": [1, None, [2, 3]]}
    assert type(back["amount"]) is Decimal and back["ts"].tzinfo is None
    assert back["tz"].utcoffset() == dt.timedelta(0)
    with pytest.raises(TypeError, match="set cannot cross a shuffle"):
        encode_rec({"s": {1, 2}})


def _typed_frame(spark: SparkSession, n: int) -> Any:
    return spark.range(n).select(
        "id",
        (F.col("id") % 7).cast("int").alias("key"),
        F.timestamp_seconds(F.col("id") * 7777).alias("ts"),
        F.to_date(F.timestamp_seconds(F.col("id") * 86400)).alias("day"),
        (F.col("id") / 7).cast("decimal(10,4)").alias("amount"),
        F.col("id").cast("string").cast("binary").alias("raw"),
        F.array(F.col("id"), F.lit(None)).alias("xs"),
        F.struct(F.col("id").alias("a"), F.lit("b").alias("b")).alias("st"),
    )


def _as_dict(row: Any) -> dict[str, Any]:
    out = row.asDict(recursive=True)
    out["raw"] = bytes(out["raw"])
    return out


def test_records_look_like_row_asdict_before_and_after_a_shuffle(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """Spark is the oracle: what ``df.collect()`` gives, row by row, is what the first
    stage sees, and the second one after Spark's shuffle; the replay of a failed record
    (through its persisted segment) looks the same again."""
    ft = make_ft(timeout_s=30)
    df = _typed_frame(spark, 300)
    want = sorted(repr(sorted(_as_dict(r).items())) for r in df.collect())

    def first(r: dict[str, Any]) -> dict[str, Any]:
        probe.write_one(r)
        if r["id"] % 10 == 3 and probe.first_time("failed", r["id"]):
            raise FailRecord("first attempt fails")
        return r

    def second(r: dict[str, Any]) -> dict[str, Any]:
        probe.r.rpush(f"{probe.prefix}:after", repr(sorted(r.items())))
        return r

    p = ft.pipeline(immediate_replays=0).map(first).partition_by("key", 3).map(second)
    result = ft.run_batch(p.sink(probe.write, per="partition"), df, 0)
    assert result.failed == 30 and result.written == 270
    assert ft.drain(timeout_s=30).drained
    seen = probe.strings("out")
    assert sorted(set(seen)) == want and len(seen) == 330  # replays look like fresh rows
    assert sorted(probe.strings("after")) == want
    assert sorted(probe.ids()) == list(range(300))


def test_keys_land_where_spark_puts_them_fresh_and_replayed(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """A key made by a stage (a string column, ``types=``), failures after the shuffle
    replayed through the queue: every record reaches the partition Spark's own
    ``repartition(4, key)`` gives that key."""
    ft = make_ft(timeout_s=30)
    n = 2000
    df = spark.range(n).select("id")

    def rekey(r: dict[str, Any]) -> dict[str, Any]:
        return {"id": r["id"], "name": f"k{r['id'] % 97}", "v": r["id"] * 2}

    def after(r: dict[str, Any]) -> dict[str, Any]:
        tc = TaskContext.get()
        probe.r.hset(f"{probe.prefix}:place", f"{r['id']}:{probe.first_time('x', r['id'])}",
                     f"{r['name']}={tc.partitionId()}")  # fmt: skip
        if r["id"] % 50 == 1 and probe.first_time("fail", r["id"]):
            raise ValueError(f"after the shuffle {r['id']}")
        return r

    p = (ft.pipeline(immediate_replays=0)  # failures past the shuffle queue
         .map(rekey).partition_by(["name"], 4, types=["string"]).map(after))
    first = ft.run_batch(p.sink(probe.write, per="partition"), df, 0)
    assert first.failed == 40 and any("ValueError: after the shuffle" in e for e in first.errors)
    assert ft.drain(timeout_s=30).drained
    keys = spark.createDataFrame([(f"k{i}",) for i in range(97)], "name string")
    oracle = {r["name"]: r["p"] for r in
              keys.repartition(4, "name").select("name", F.spark_partition_id().alias("p"))
              .collect()}  # fmt: skip
    placed = {k.decode(): v.decode() for k, v in probe.r.hgetall(f"{probe.prefix}:place").items()}
    assert len(placed) == n + 40  # every record once, the 40 failed ones again as replays
    for name_part in placed.values():
        name, part = name_part.split("=")
        assert int(part) == oracle[name], name_part
    assert sorted(probe.ids()) == list(range(n))


def test_a_bad_key_fails_its_record_alone_and_siblings_never_arrive_twice(
    spark: SparkSession, make_ft: Any, probe: Probe
) -> None:
    """flat_map fans each record out to two; one child's key does not fit ``int`` on the
    first attempt only, another child cannot be encoded at all (a set): the parent fails
    with the reason, its sibling is dropped with it, and the replay delivers both children
    exactly once. The unencodable one is dead-lettered with its error."""
    ft = make_ft(timeout_s=30, max_replays=2)
    df = spark.range(400).select("id")

    def fan(r: dict[str, Any]) -> list[dict[str, Any]]:
        i = r["id"]
        bad = i % 40 == 5 and probe.first_time("badkey", i)
        kids = [{"id": i, "k": "oops" if bad else i % 3}, {"id": i + 1000, "k": i % 5}]
        if i == 77:
            kids[1]["tags"] = {"a", "b"}
        return kids

    p = ft.pipeline(immediate_replays=0).flat_map(fan).partition_by("k", 3, types=["int"])
    first = ft.run_batch(p.sink(probe.write, per="partition"), df, 0)
    assert first.failed == 11
    assert any("partition_by['k']" in e and "'oops' is not a int32" in e for e in first.errors)
    assert ft.drain(timeout_s=30).drained
    dead = ft.layer.persistence.dead_letters()
    assert [d.frame.decode()["id"] for d in dead] == [77]
    assert "set cannot cross a shuffle" in dead[0].history[-1].error
    ids = probe.ids()
    assert len(ids) == len(set(ids)), "a sibling arrived twice"
    assert set(ids) == ({*range(400), *range(1000, 1400)} - {77, 1077})


def test_the_success_path_touches_redis_per_task_not_per_record(
    spark: SparkSession, make_ft: Any
) -> None:
    ft = make_ft()
    df = spark.range(20_000).select("id", (F.col("id") % 11).alias("key")).repartition(2)
    p = ft.pipeline().map(lambda r: {**r, "v": r["id"] + 1}).filter(lambda r: r["id"] % 3)
    result = ft.run_batch(p.partition_by("key", 3).sink(lambda rs: None, per="partition"), df, 0)
    assert result.fresh == 20_000 and result.failed == 0
    assert result.written == 20_000 - len(range(0, 20_000, 3))
    assert result.redis_calls <= 12, result.redis_calls
    st = ft.layer.stats()
    assert st.pending == 0 and st.unsettled_segments == 0


def test_configuration_errors_are_named(spark: SparkSession, make_ft: Any) -> None:
    ft = make_ft()
    df = spark.range(3).select("id")
    with pytest.raises(ConfigError, match=r"needs types= for \['k'\]"):
        ft.run_batch(ft.pipeline().map(lambda r: r).partition_by("k", 2).sink(print), df, 0)
    with pytest.raises(ConfigError, match="row stages only"):
        ft.pipeline(ack_scope="task").map_batches(lambda b: b, "id long")
    with pytest.raises(ConfigError, match="ack_scope must be"):
        ft.pipeline(ack_scope="record")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="row stages .* take a pipeline of their own"):
        ft.pipeline().map(lambda r: r).map_batches(lambda b: b, "id long")
