"""Sources kept by reference: a record Spark can read again is persisted as where it is,
not as a copy of its bytes.

A :class:`ReplayableSource` gives each row a *reference* -- a location id (an int64: a
file's path hashed, a Kafka topic-partition) and a position in it (an int64: a content
hash, an offset) -- computed by Spark expressions in the JVM, and reads rows back by
reference. A source task then stores, per fresh row, only its reference (``__ft_loc``
dictionary-encoded and ``__ft_pos``: about 12 bytes a row in the batch's segment) instead
of the row; a record
that fails is persisted and replayed as its reference, and the batch that runs the replay
reads the row back (:func:`resolve`: a broadcast join inside the batch's plan, one read
per location), with exactly its original columns.

:class:`FileSource` is built in for Spark's file sources (JSON, CSV, Parquet, ORC, text):
location ``xxhash64`` of its file's path (``_metadata.file_path``'s spelling, from
``input_file_name()``), position ``xxhash64`` of the row's columns as
Spark parsed them. The hash, not a row number, because Spark splits a file by byte ranges whose size
depends on the whole scan (``maxPartitionBytes``, the total size, the cores): a row number
within a split is not stable across reads, its content is. Rows of one file with the same
content share a reference, and a replay gets one of them: the same bytes. Parquet is the
exception: Spark gives each row its index in its file (``_metadata.row_index``), stable
whatever the splits, and that is its position (no hash).

Invariants:

* A replay comes back with the columns its source row had, read by the same reader with
  the same schema and options: never rebuilt from a copy of ours.
* A reference that no longer resolves (the file deleted, or rewritten without that row)
  dead-letters its record with an error naming the location; it is never dropped or
  acked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from ftlayer.errors import ConfigError
from ftlayer.spark.vector_plan import CUR_COL, LOC_COL, POS_COL, REPLAY_COLS, SRC_COL

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["FileSource", "RateMicroBatchSource", "ReplayableSource", "not_found", "references",
           "resolve", "with_references"]

log = logging.getLogger(__name__)


@runtime_checkable
class ReplayableSource(Protocol):
    """A source Spark can read again (the extension point; :class:`FileSource` is one).

    ``stream(spark)``: the source as a streaming DataFrame (its own columns).
    ``reference(df)``: (location, position) Columns of each row of ``df``, a DataFrame of
    this source as ``stream`` or ``read_back`` made it: JVM expressions, both int64 (a
    location id: a file's path hashed, a topic-partition's number; a position in it).
    ``read_back(spark, locations, wanted)``: a batch DataFrame holding at least the rows
    of the references ``wanted`` (a DataFrame of ``__ft_loc`` and ``__ft_pos``, at the
    location ids ``locations``), with the stream's columns, such that ``reference`` gives
    those rows the same values again; a location that no longer exists is left out
    (None: none exists), and its records are dead-lettered naming it. Built from Spark
    expressions: :func:`resolve` joins it with the replays inside the batch's plan.
    ``remember(spark, locations)``: called when records at these location ids are
    persisted (the locations surely exist): a source that names ids by a lookup (a
    file's path) makes it now. ``location_name(location)``: a location id as an
    operator reads it (a file's path). Optional, ``not_found(location, position)``: the
    error a replay whose row was not read back is dead-lettered with (default: a file's
    words, naming its location)."""

    def stream(self, spark: SparkSession) -> DataFrame: ...

    def reference(self, df: DataFrame) -> tuple[Column, Column]: ...

    def read_back(
        self, spark: SparkSession, locations: Sequence[int], wanted: DataFrame
    ) -> DataFrame | None: ...

    def remember(self, spark: SparkSession, locations: Sequence[int]) -> None: ...

    def location_name(self, location: int) -> str: ...


@dataclass(frozen=True)
class FileSource:
    """Files read by one of Spark's file sources (``format``: json, csv, parquet, orc,
    text), kept by reference: ``FileSource("json", "/data/events", "id long, payload
    string", maxFilesPerTrigger=1)``. ``path``: the files' directory (or glob), as the
    reader takes it; ``schema``: a DDL string or StructType (streaming file sources need
    one); ``**options``: the reader's options, as they are, for the stream and for reading
    replays back (less the stream-only ones, such as ``maxFilesPerTrigger``).

    A row's location is ``xxhash64`` of its file's path (:func:`file_path`): 8 bytes a row
    from the JVM, where the path itself would cost a string a row (3-4 % of a pipeline of
    1 KB events).
    Ids map back to files by listing the source's files (``inputFiles``: what Spark's file
    stream does every trigger anyway), when a batch persists records of a file not seen
    yet and when a replay names one: the paths seen name the files in errors."""

    format: str
    path: str
    schema: Any
    options: Mapping[str, str] = field(default_factory=dict)

    def __init__(self, format: str, path: str, schema: Any, **options: Any) -> None:  # noqa: A002
        if not schema:
            raise ConfigError("a FileSource needs the files' schema (streaming file sources do)")
        object.__setattr__(self, "format", format)
        object.__setattr__(self, "path", str(path))
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "options", {k: str(v) for k, v in options.items()})

    def stream(self, spark: SparkSession) -> DataFrame:
        reader = spark.readStream.format(self.format).schema(self.schema)
        return reader.options(**self.options).load(self.path)

    def reference(self, df: DataFrame, scanned: bool = False) -> tuple[Column, Column]:
        """``scanned``: ``df`` is this source's own read, nothing between it and the scan
        (its stream, a read back): the file's path then comes from ``input_file_name()``
        (:func:`file_path`); otherwise from ``_metadata.file_path``, which Spark refuses
        to resolve where it could not name the file (after a shuffle, say), where
        ``input_file_name()`` would be empty."""
        from pyspark.sql import functions as F  # noqa: N812

        loc = F.xxhash64(file_path() if scanned else F.col("_metadata.file_path"))
        if self.format == "parquet":  # a row's index in its file: stable, and no hash
            return loc, F.col("_metadata.row_index")
        cols = [c for c in df.columns if c not in (LOC_COL, POS_COL)]
        for f in df.schema.fields:
            if f.name in cols and "map<" in f.dataType.simpleString():
                raise ConfigError(f"column {f.name!r} is a map: Spark cannot hash it, so "
                                  "its rows cannot be kept by reference")  # fmt: skip
        return loc, F.xxhash64(*[F.col(c) for c in cols])

    def _read(self, spark: SparkSession, paths: Any) -> DataFrame:
        options = {k: v for k, v in self.options.items() if k not in _STREAM_ONLY}
        return spark.read.format(self.format).schema(self.schema).options(**options).load(paths)

    def files(self, spark: SparkSession, locations: Sequence[int]) -> dict[int, str]:
        """The files of ``locations`` (ids) that exist: listed again when one is unknown."""
        if any(loc not in _FILES for loc in locations):
            for path in self._read(spark, self.path).inputFiles():
                _FILES[location_id(path)] = path
        return {loc: _FILES[loc] for loc in locations if loc in _FILES}

    def remember(self, spark: SparkSession, locations: Sequence[int]) -> None:
        if NO_FILE in locations:  # Spark could not say which file a row came from
            raise ConfigError(
                f"rows of {self.path} reached ftlayer without their file's name "
                "(input_file_name() was empty): their references would name no file")
        self.files(spark, locations)

    def location_name(self, location: int) -> str:
        return _FILES.get(location) or (
            f"a file of {self.path} (location id {location & _U64:#018x}) that was gone "
            "before its first replay")  # fmt: skip

    def read_back(
        self, spark: SparkSession, locations: Sequence[int], wanted: DataFrame
    ) -> DataFrame | None:
        files = sorted(self.files(spark, locations).values())
        if not files:
            return None
        try:
            df = self._read(spark, files)
            df.schema  # noqa: B018 (Spark Connect analyses the plan here: missing paths fail)
            return df
        except Exception as e:
            if not _gone(e):
                raise
        present = []
        for f in files:  # find the files that are gone (rare: one plan each)
            try:
                self._read(spark, [f]).schema  # noqa: B018
                present.append(f)
            except Exception as e:
                if not _gone(e):
                    raise
                log.error("replay source file is gone: %s", f)
        return self._read(spark, present) if present else None


_FILES: dict[int, str] = {}
"""Location id -> file path, of every file a FileSource listed in this process."""


def file_path() -> Column:
    """The path of the file a row was read from, spelled as ``_metadata.file_path`` spells
    it (``file:/x``), from ``input_file_name()`` (``file:///x``), for a column computed
    right over the file scan (it is empty where a task reads no file, or several, as
    after a shuffle). Asking a row-based reader (JSON, CSV, text) for a ``_metadata``
    column makes it copy every row once more to append it (measured: a 1 KB event read
    0.5 us slower); ``input_file_name()`` reads the task's current file. The spelling
    keeps every location id, and the lineage ids made of them, what they were when the
    path came from ``_metadata``."""
    from pyspark.sql import functions as F  # noqa: N812

    name = F.input_file_name()
    local = F.concat(F.lit("file:/"), F.substring(name, 9, 1 << 30))
    return F.when(name.startswith("file:///"), local).otherwise(name)


def location_id(path: str) -> int:
    """A file's location id: Spark's ``xxhash64`` of its ``_metadata.file_path`` (which
    spells ``file:/x`` what ``inputFiles`` spells ``file:///x``)."""
    if path.startswith("file:///"):
        path = "file:/" + path[len("file:///"):]
    h = xxhash.xxh64_intdigest(path.encode(), seed=42)
    return h - (1 << 64) if h >= 1 << 63 else h


NO_FILE = location_id("")
"""The location id of a row whose file Spark could not name (``input_file_name()`` is
empty where a plan reads no file, or more than one, in the row's task)."""


def _gone(e: Exception) -> bool:
    return "PATH_NOT_FOUND" in str(e) or "does not exist" in str(e)


@dataclass(frozen=True)
class RateMicroBatchSource:
    """Spark's ``rate-micro-batch`` source kept by reference: a row's value is its
    position, and its timestamp a function of the value and the options (batch ``b``
    holds values ``b*rows_per_batch`` onwards, stamped ``start_timestamp +
    b*advance_millis_per_batch``), so a replay is rebuilt exactly, in the JVM, without a
    read. (The time-based ``rate`` source stamps rows by the wall clock of their batch:
    its 16-byte rows are kept as copies, which cost what a reference would.)"""

    rows_per_batch: int
    """Rows of each micro-batch (the source's ``rowsPerBatch``)."""
    num_partitions: int | None = None
    """Partitions of each micro-batch (``numPartitions``; None: Spark's default)."""
    start_timestamp: int = 0
    """Timestamp of batch 0's rows, in epoch milliseconds (``startTimestamp``)."""
    advance_millis_per_batch: int = 1000
    """Milliseconds each batch's timestamp advances (``advanceMillisPerBatch``)."""

    def stream(self, spark: SparkSession) -> DataFrame:
        reader = (spark.readStream.format("rate-micro-batch")
                  .option("rowsPerBatch", self.rows_per_batch)
                  .option("startTimestamp", self.start_timestamp)
                  .option("advanceMillisPerBatch", self.advance_millis_per_batch))  # fmt: skip
        if self.num_partitions:
            reader = reader.option("numPartitions", self.num_partitions)
        return reader.load()

    def reference(self, df: DataFrame) -> tuple[Column, Column]:
        from pyspark.sql import functions as F  # noqa: N812

        return F.lit(0).cast("long"), F.col("value")

    def remember(self, spark: SparkSession, locations: Sequence[int]) -> None:
        pass  # positions are values: nothing to look up

    def location_name(self, location: int) -> str:
        return "rate-micro-batch"

    def read_back(
        self, spark: SparkSession, locations: Sequence[int], wanted: DataFrame
    ) -> DataFrame | None:
        from pyspark.sql import functions as F  # noqa: N812

        batch = F.floor(F.col("value") / F.lit(self.rows_per_batch)).cast("long")
        millis = F.lit(self.start_timestamp) + batch * F.lit(self.advance_millis_per_batch)
        values = wanted.select(F.col(POS_COL).alias("value"))
        return values.select(F.timestamp_millis(millis).alias("timestamp"), "value")


_STREAM_ONLY = {"maxFilesPerTrigger", "maxBytesPerTrigger", "latestFirst", "fileNameOnly",
                "maxFileAge", "cleanSource", "sourceArchiveDir"}  # fmt: skip


def with_references(source: ReplayableSource, df: DataFrame, scanned: bool = False) -> DataFrame:
    """``df`` (rows of ``source``) with their references as ``__ft_loc`` / ``__ft_pos``.
    ``scanned``: ``df`` is the source's own read (its stream, a read back), which a
    :class:`FileSource` references the cheap way (asked by name: ``reference(df)`` of the
    ReplayableSource protocol stays as users' own sources implement it)."""
    if scanned and isinstance(source, FileSource):
        loc, pos = source.reference(df, scanned=True)
    else:
        loc, pos = source.reference(df)
    return df.select("*", loc.alias(LOC_COL), pos.alias(POS_COL))


def resolve(
    spark: SparkSession, source: ReplayableSource, replays: pa.Table, names: Sequence[str]
) -> DataFrame | None:
    """Replays (``replay_table``'s shape: copies, or null columns beside a reference) as a
    DataFrame of ``names`` and ``REPLAY_COLS``, references resolved inside the plan: the
    rows read back from ``source`` (one read of every location named) joined with the
    references (broadcast: no shuffle). A reference whose row is not found is left out:
    the batch dead-letters it after its job (:func:`references`). None: no rows."""
    from pyspark.sql import functions as F  # noqa: N812

    is_ref = replays.column(LOC_COL).is_valid()
    copies = replays.filter(pc.invert(is_ref))
    refs = replays.filter(is_ref)
    parts = []
    if copies.num_rows:
        parts.append(spark.createDataFrame(copies.select([*names, *REPLAY_COLS])))
    if refs.num_rows:
        wanted = refs.select([LOC_COL, POS_COL, *REPLAY_COLS])
        locations = pc.unique(wanted.column(LOC_COL)).to_pylist()
        keys = spark.createDataFrame(wanted)
        back = source.read_back(spark, sorted(locations), keys.select(LOC_COL, POS_COL))
        if back is not None:
            rows = with_references(source, back, scanned=True).join(F.broadcast(keys),
                                                                    [LOC_COL, POS_COL])
            parts.append(rows.select(*names, *REPLAY_COLS))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def references(replays: pa.Table) -> dict[int, tuple[int, int, int]]:
    """The replays kept by reference (``replay_table``'s shape): source id -> (current
    id, location id, position), each id as uint64 but the reference. One a batch's job
    did not run had its row not found: a dead letter, never dropped, never acked."""
    refs = replays.filter(replays.column(LOC_COL).is_valid())
    cols = (SRC_COL, CUR_COL, LOC_COL, POS_COL)
    src, cur, loc, pos = (refs.column(c).to_pylist() for c in cols)
    return {s & _U64: (c & _U64, lo, po) for s, c, lo, po in zip(src, cur, loc, pos, strict=True)}


def not_found(source: ReplayableSource, location: int, position: int) -> str:
    """Why a replay's source row was not read back: the source's own words
    (``not_found(location, position)``, optional: Kafka names the offset) or a file's."""
    own = getattr(source, "not_found", None)
    if own is not None:
        return str(own(location, position))
    return (f"replay source row not found: {source.location_name(location)} no longer "
            "exists or no longer holds the row (deleted or rewritten)")


_U64 = (1 << 64) - 1
