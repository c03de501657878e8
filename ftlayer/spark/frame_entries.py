"""Stage rows of DataFrame stages: a row that fails in a DataFrame stage is kept as the
input of its segment, in the same job, and its replay enters there
(ftlayer.stage_rows, ftlayer.spark.entries).

* **Carry.** A segment after a shuffle with a stage that marks failures (``failed=``)
  starts by copying its input's user columns under hidden names (``__ft_in_<i>``, tagged
  with :data:`CARRIED`): a stage may drop or recompute its input's columns, and the
  copies ride along as the identity columns do. Spark prunes them where nothing reads
  them. The first segment keeps only the replays read back from their source
  (:func:`keeps_until`): its copies are null in the other rows.
* **Keep.** The stage's observation (ftlayer.spark.frame_observations) also collects,
  for its failed rows only, ``location,position,`` and Spark's ``to_json`` of the copies
  (fields named by position), in base64. A stage whose output lost a copy keeps
  nothing: its failed rows go back to their source, as before; so does a record two of
  whose rows failed (a fan-out: one stored row cannot stand for both).
* **Bound.** A batch keeps about ``FTConfig.max_kept_rows`` rows a stage, and about
  :func:`kept_budget` bytes of them (the observation brings them through the driver's
  heap): when the stage's last batch failed more, a deterministic share of rows (by a
  hash of their identity) is kept and the rest go back to their source; where no batch
  tells (a stage's first; the first segment, when the replays read back could pass the
  bound if all failed again) the job itself keeps at most the bound's rows, those of
  the lowest identity hashes (:func:`row_cap`). A kept row larger than
  ``max_record_bytes`` goes back to its source too (ftlayer.spark.settle).
* **Enter.** A batch's stage rows for entry ``k`` are read with ``from_json`` and the
  entry's schema, named by identity like any replay (null location, the record id as
  position) and put before the shuffle that feeds segment ``k``. A row written under
  another schema of that entry (the stage before it changed its output) is
  dead-lettered, named: it cannot enter there, and the batch has read its source already.

Invariant: keeping changes where a replay enters, never whether a failed row is kept: a
failed fresh row is stored either way (as a stage row, or as its source row).
"""

from __future__ import annotations

import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from ftlayer.spark import jvm_args
from ftlayer.spark.identity import IDENTITY
from ftlayer.spark.intake import BODY_COL, HASH_COL
from ftlayer.spark.vector_plan import LOC_COL, POS_COL, SRC_COL
from ftlayer.stage_rows import JSON_OPTIONS, StageRow, schema_hash

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import StructType

    from ftlayer.ids import RecordId
    from ftlayer.spark.entries import Entry
    from ftlayer.spark.intake import Replays
    from ftlayer.spark.vector_plan import VectorPlan

__all__ = ["CARRIED", "FULL_SHARE", "WIDTH", "Kept", "carry", "entering", "entering_key",
           "entries_known", "keep_size", "keeps_until", "kept_budget", "kept_column",
           "kept_fields", "kept_rows", "no_rows", "note_kept", "row_cap", "rows_ids",
           "share_after", "still_carried", "text_width", "user_schema"]

CARRIED = {"ftlayer": "entry"}
"""The tag of a segment input's hidden copies (lost when a stage recomputes one)."""
_PREFIX = "__ft_in_"
FULL_SHARE = 1024
"""Hash buckets of the keeping share (all kept: every bucket)."""
WIDTH = 2048
"""The bytes a kept row is taken to cost through the driver before its stage kept any
(then: the mean of its last batch's)."""


@dataclass(frozen=True)
class Kept:
    """What a segment keeps of its input for its failed rows: ``entry`` (its index and
    fingerprint), the input's user columns as Spark's analysis gave them (``schema``)
    and the hidden copies' names."""

    entry: int
    fingerprint: int
    schema: StructType
    hash: int
    copies: tuple[str, ...]
    replays_only: bool = False
    """The copies hold only the replays' values (the first segment's: :func:`carry`)."""
    width: int | None = None
    """The most characters a kept row's text can take (:func:`text_width`); None where
    its columns' width has no bound (strings, arrays...)."""

    @property
    def row_width(self) -> int:
        """A kept row's width as the bounds count it: ``width``, else ``WIDTH``."""
        return self.width or WIDTH

    def row(self, location: int | None, position: int, body: bytes) -> StageRow:
        """A kept row (ftlayer.stage_rows)."""
        return StageRow(self.entry, self.fingerprint, self.hash, location, position, "json",
                        body)  # fmt: skip


def keeps_until(plan: VectorPlan, index: int, ft: bool, read_back: bool = False) -> int | None:
    """The last stage of segment ``index`` that keeps its failed rows as the segment's
    input (None: none does -- FT off, ``max_kept_rows=0``, ``replay_from="source"``, no
    DataFrame stage with ``failed=``, or a Python stage before it, which takes only its
    own columns). The first segment's input is the source row: a fresh row failing there
    goes back to its source (keeping a copy of every failed row costs more than reading
    them back once: every failed row's columns through the driver; measured with
    ``benchmarks.dataframe_overhead``, whose stage 1 fails), but a replay read back from
    its source (``read_back``: the batch has some) that fails there again keeps its
    values: reading its file again would cost a pass over the file for a few rows."""
    if not ft or not plan.config.max_kept_rows or plan.replay_from == "source":
        return None
    if not index and not read_back:
        return None
    seg = plan.segments[index]
    last = None
    for j, (kind, stage) in enumerate(seg.ops):
        if kind != "frame":
            break
        if stage.failed is not None:
            last = j
    return last


def no_rows(schema: pa.Schema, spark: Any) -> DataFrame:
    """An empty DataFrame of the source's columns ``schema`` and the identity columns:
    a batch with stage rows only (they enter later)."""
    from pyspark.sql import functions as F  # noqa: N812

    empty = spark.createDataFrame(schema.empty_table())
    return empty.select(*schema.names, F.lit(None).cast("long").alias(LOC_COL, metadata=IDENTITY),
                        F.lit(None).cast("long").alias(POS_COL, metadata=IDENTITY))


def user_schema(df: DataFrame) -> StructType:
    """``df``'s user columns: not the identity columns, not a hidden copy."""
    from pyspark.sql.types import StructType

    return StructType([f for f in df.schema.fields
                       if f.name not in (LOC_COL, POS_COL) and not f.name.startswith(_PREFIX)])


def carry(df: DataFrame, entry: Entry, cache: dict[Any, Any], key: Any,
          replays_only: bool = False) -> tuple[DataFrame, Kept]:  # fmt: skip
    """``df`` (a segment's input) with hidden copies of its user columns, and what its
    failing stages keep; ``replays_only``: the copies hold the replays' values (rows
    without a location), null in the fresh rows. The schema is read once per ``key`` (the
    pipeline's segment and the source's schema: the same in every batch of a query)."""
    from pyspark.sql import functions as F  # noqa: N812

    if key not in cache:
        schema = user_schema(df)
        copies = tuple(f"{_PREFIX}{i}" for i in range(len(schema.fields)))
        kept = Kept(entry.segment, entry.fingerprint(), schema, schema_hash(schema), copies,
                    replays_only, text_width(schema))  # fmt: skip
        replay = F.col(LOC_COL).isNull()
        cols = [(F.when(replay, F.col(f"`{f.name}`")) if replays_only else
                 F.col(f"`{f.name}`")).alias(c, metadata=CARRIED)
                for f, c in zip(schema.fields, copies, strict=True)]  # fmt: skip
        cache[key] = (kept, cols)
    kept, cols = cache[key]
    return jvm_args.select(df, ["*", *cols], cache, ("carry", key)), kept


def still_carried(out: DataFrame, kept: Kept) -> bool:
    """Whether a stage's output still has every hidden copy, unchanged (tagged)."""
    fields = {f.name: f for f in out.schema.fields}
    return all(c in fields and fields[c].metadata.get("ftlayer") == "entry"
               for c in kept.copies)  # fmt: skip


def kept_column(kept: Kept, failed: Column, share: int,
                cap: tuple[int, int] | None = None) -> list[Column]:  # fmt: skip
    """The observation's aggregates of a stage's kept rows: ``kept``, the
    ``location,position,body`` of each failed row (of the ``share`` of 1024 hash buckets
    kept), joined by ``;``. ``cap`` (rows, width; :func:`row_cap`): at most ``rows`` rows
    of at most ``width`` characters are kept -- those of the lowest identity hashes, by
    a bounded ``min_by`` that holds no more in a task or in the driver -- and, where the
    rows' width has no bound (``Kept.width``), ``kept_width`` measures the mean width of
    all the failed rows (the next batch's share); rows of a bounded width are neither
    measured nor checked (each check builds the row's text again: about 4 µs a row)."""
    from pyspark.sql import functions as F  # noqa: N812

    body = F.to_json(F.struct(*[F.col(c).alias(str(i)) for i, c in enumerate(kept.copies)]),
                     JSON_OPTIONS)  # fmt: skip
    # base64 without its line breaks: the metrics reach Python as JSON text through
    # py4j, whose unescaping costs per escaped character -- and JSON inside JSON, or
    # Spark's chunked base64 (CRLF every 76 characters), is full of them
    b64 = F.translate(F.base64(body), "\r\n", "")
    row = F.concat_ws(",", F.coalesce(F.col(LOC_COL).cast("string"), F.lit("")),
                      F.col(POS_COL).cast("string"), b64)  # fmt: skip
    if kept.replays_only:
        failed = failed & F.col(LOC_COL).isNull()
    ident = F.xxhash64(F.col(LOC_COL), F.col(POS_COL))
    if share < FULL_SHARE:
        failed = failed & (F.pmod(ident, F.lit(FULL_SHARE)) < share)
    if cap is None:
        return [F.array_join(F.collect_list(F.when(failed, row)), ";").alias("kept")]
    rows, width = cap
    wanted = failed if kept.width is not None else failed & (F.length(row) <= width)
    lowest = F.min_by(F.when(wanted, row), F.when(wanted, ident), rows)
    kept_text = F.coalesce(F.array_join(lowest, ";"), F.lit("")).alias("kept")  # none: null
    if kept.width is not None:
        return [kept_text]
    return [kept_text, F.avg(F.when(failed, F.length(row))).cast("string").alias("kept_width")]


def kept_fields(kept: Kept | None, cap: tuple[int, int] | None) -> tuple[str, ...]:
    """The names of :func:`kept_column`'s aggregates (none: ``kept`` None)."""
    if kept is None:
        return ()
    return ("kept",) + (("kept_width",) if cap is not None and kept.width is None else ())


def keep_size(kept: Kept, key: Any, cache: dict[Any, Any], bound: tuple[int, int],
              read_back: int, spark: Any) -> tuple[int, tuple[int, int] | None]:  # fmt: skip
    """(share, cap) of a stage keeping ``kept`` in this batch (``key``: the stage's, in
    ``cache``; ``bound``: rows and bytes, about): the share its last batch sized
    (:func:`note_kept`); in its first batch (no share sized yet), the cap
    :func:`row_cap`; in the first segment, where at most every replay read back
    (``read_back``) fails again, all of them when that fits the bound, else the cap
    (not a share sized as if all failed again: the few that usually do are all kept,
    none read back once more). Only there: ``min_by``'s buffer costs each task its
    ``k`` slots, where ``collect_list`` costs nothing until a row fails."""
    if kept.replays_only:
        share = share_after(read_back, bound[0], cache.get(("width", key), WIDTH), bound[1])
        cap = row_cap(spark, cache, *bound, kept.row_width) if share < FULL_SHARE else None
        return (FULL_SHARE, cap) if cap else (share, None)
    if ("share", key) in cache:
        return cache[("share", key)], None
    return FULL_SHARE, row_cap(spark, cache, *bound, kept.row_width)


def note_kept(kept: Kept, key: Any, cache: dict[Any, Any], bound: tuple[int, int],
              failed: int, width: int | None, measured: str | None) -> None:
    """What a stage's batch tells its next: the width of its kept rows through the driver
    (``width``: theirs; ``measured``: the mean of all its failed rows', where its keeping
    was capped; else the last known) and its share after ``failed`` failed rows."""
    width = int(float(measured)) + 1 if measured else width
    cache[("width", key)] = width = width or cache.get(("width", key), kept.row_width)
    if not kept.replays_only:
        cache[("share", key)] = share_after(failed, bound[0], width, bound[1])


def row_cap(spark: Any, cache: dict[Any, Any], most: int, budget: int,
            width: int = WIDTH) -> tuple[int, int] | None:  # fmt: skip
    """(rows, width): what a stage keeps at most in its first batch, where nothing bounds
    how many of its rows fail: ``budget`` bytes as rows of at most ``width`` characters
    (``Kept.width``: exact for columns of bounded width, else an assumption), ``most``
    rows at most. None where Spark cannot bound an aggregate's rows (``min_by`` with
    ``k`` came in Spark 4.2): such a batch keeps every failed row, as before."""
    if "min_by_k" not in cache:
        try:
            major, minor = (int(x) for x in str(spark.version).split(".")[:2])
        except (ValueError, AttributeError):
            major, minor = 0, 0
        cache["min_by_k"] = (major, minor) >= (4, 2)
    if not cache["min_by_k"]:
        return None
    return max(1, min(most, budget // width, MAX_K)), width


MAX_K = 100_000
"""The most rows Spark's ``min_by`` keeps (its ``k``)."""

_JSON_WIDTH = {"boolean": 5, "tinyint": 4, "smallint": 6, "int": 11, "bigint": 20,
               "float": 16, "double": 24, "date": 16, "timestamp": 40, "timestamp_ntz": 40}
"""The most characters Spark's ``to_json`` (JSON_OPTIONS) writes for a value of these
types: a sign and every digit of the integers, ``Double.toString``'s longest
(``-2.2250738585072014E-308``), a quoted date or timestamp to the microsecond with its
offset, and room to spare for years past 9999."""


def text_width(schema: StructType) -> int | None:
    """The most characters of a kept row's text (:func:`kept_column`: location,
    position, and the base64 of ``to_json`` of its columns named by position) for a
    schema of bounded columns only (numbers, booleans, decimals, dates, timestamps);
    None where a column's width has no bound (strings, binary, nested types). Checked
    against Spark's own ``to_json`` of the widest values in the tests."""
    from pyspark.sql.types import DecimalType

    body = 2  # braces
    for i, f in enumerate(schema.fields):
        t = f.dataType
        value = t.precision + 8 if isinstance(t, DecimalType) else _JSON_WIDTH.get(
            t.simpleString())
        if value is None:
            return None
        body += len(str(i)) + 4 + value  # "i": and a comma
    return 20 + 1 + 20 + 1 + 4 * -(-body // 3)  # location, position, base64 of the body


def share_after(failed: int, most: int, width: int = 0, budget: int = 0) -> int:
    """The hash buckets (of 1024) to keep in a stage's next batch when this one failed
    ``failed`` rows (or when at most that many can fail) and a batch keeps about ``most``
    rows and about ``budget`` bytes (0: no byte bound) of rows ``width`` bytes wide."""
    share = FULL_SHARE
    if failed > most:
        share = FULL_SHARE * most // failed
    if budget and failed * width > budget:
        share = min(share, FULL_SHARE * budget // (failed * width))
    return max(1, share)


def kept_budget(spark: Any, cache: dict[Any, Any], configured: int = 0) -> int:
    """The bytes of kept rows one stage may send through the driver in a batch:
    ``configured`` (FTConfig.max_kept_bytes), else 1/64 of the driver's heap (16 MiB of
    1 GiB: a 1 GiB local driver ran out of heap at about 70 MB of them, each a base64
    text in the observation's buffers, merged, joined and served: several copies), read
    once a query (Spark Connect: 1 GiB assumed)."""
    if configured:
        return configured
    if "kept_budget" not in cache:
        try:
            heap = int(spark._jvm.java.lang.Runtime.getRuntime().maxMemory())
        except Exception:  # no JVM at hand (Spark Connect)
            heap = 1 << 30
        cache["kept_budget"] = max(1 << 20, heap // 64)
    return int(cache["kept_budget"])


def kept_rows(values: str, kept: Kept) -> dict[tuple[int | None, int], StageRow]:
    """The kept rows an observation collected (joined by ``;``), by identity (location
    or None, position)."""
    out: dict[tuple[int | None, int], StageRow] = {}
    for value in values.split(";") if values else ():
        loc_text, pos_text, body = value.split(",", 2)
        loc = int(loc_text) if loc_text else None
        out[(loc, int(pos_text))] = kept.row(loc, int(pos_text), binascii.a2b_base64(body))
    return out


def entering(out: DataFrame | None, table: pa.Table, cache: dict[Any, Any], key: Any,
             spark: Any = None) -> tuple[DataFrame | None, list[tuple[RecordId, str]]]:  # fmt: skip
    """The stage rows ``table`` (Replays.entered's shape) that enter before the segment
    ``out`` feeds, as a DataFrame of ``out``'s user columns with their identity (None:
    none enter), and those written under another schema, each with an error naming it.
    ``out``'s schema and the columns that read the rows are built once per ``key`` (the
    segment and the source's schema: the same in every batch of a query); ``out`` None:
    built already, ``spark`` given."""
    from ftlayer.ids import RecordId

    if key not in cache:
        assert out is not None, "an entry's schema is read from its input once"
        cache[key] = _reading(user_schema(out))
    schema, want, shape, cols = cache[key]
    fits = pc.equal(table.column(HASH_COL), pa.scalar(want, pa.int64()))
    bad = []
    for src in table.filter(pc.invert(fits)).column(SRC_COL).to_pylist():
        bad.append((RecordId(src & ((1 << 64) - 1), 0),
                    f"src={src & ((1 << 64) - 1):016x}: kept as a stage's input under "
                    f"another schema than its input has now ({json.dumps(schema.simpleString())}"
                    "): the stage before it changed its output"))  # fmt: skip
    rows = table.filter(fits)
    if not rows.num_rows:
        return None, bad
    if spark is None:
        assert out is not None
        spark = out.sparkSession
    raw = jvm_args.arrow_frame(spark, rows.select([BODY_COL, SRC_COL]), cache)
    parsed = jvm_args.select(raw, [shape, SRC_COL], cache, ("parsed", key))
    return jvm_args.select(parsed, cols, cache, ("entering", key)), bad


def entering_key(plan: VectorPlan, segment: int) -> tuple[Any, ...]:
    """The key :func:`entering` keeps an entry's reading under in the query's cache."""
    return ("entering", id(plan.segments[segment]), plan.inputs[0])


def entries_known(replays: Replays | None, plan: VectorPlan,
                  cache: dict[Any, Any]) -> Iterator[int]:  # fmt: skip
    """The segments ``k > 0`` whose entry has stage rows in ``replays``, in order, as long
    as the entry's input schema is known from an earlier batch of the query (in
    ``cache``: :func:`entering` can then read them without the segment's input); none
    when some enter before segment 0 (replays read back that failed again there)."""
    entered = {k: t for k, t in (replays.entered if replays else {}).items() if t.num_rows}
    if 0 in entered:
        return
    for k in sorted(k for k in entered if k):
        if entering_key(plan, k) not in cache:
            return
        yield k


def rows_ids(table: pa.Table, bad: list[tuple[RecordId, str]]) -> list[int]:
    """The source ids of the stage rows ``table`` that entered (not in ``bad``)."""
    rejected = {rid[0] for rid, _ in bad}
    return [x for x in (s & ((1 << 64) - 1) for s in table.column(SRC_COL).to_pylist())
            if x not in rejected]


def _reading(schema: StructType) -> tuple[StructType, int, Column, list[Column]]:
    """What reads stage rows into ``schema`` (an entry's user columns): the schema, its
    hash, the parsed body and the columns it becomes (with the identity of a replay)."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StructField, StructType

    shape = StructType([StructField(str(i), f.dataType, True)
                        for i, f in enumerate(schema.fields)])  # fmt: skip
    body = F.from_json(F.col(BODY_COL).cast("string"), shape, JSON_OPTIONS).alias("v")
    cols = [*[F.col("v").getField(str(i)).alias(f.name) for i, f in enumerate(schema.fields)],
            F.lit(None).cast("long").alias(LOC_COL, metadata=IDENTITY),
            F.col(SRC_COL).alias(POS_COL, metadata=IDENTITY)]  # fmt: skip
    return schema, schema_hash(schema), body, cols
