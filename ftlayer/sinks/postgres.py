"""PostgreSQL: ``INSERT ... ON CONFLICT (lineage) DO NOTHING``, one transaction a write.

A write copies its rows into a temporary table of the session (``COPY``, the fast path
into PostgreSQL) and inserts them into the target in the same transaction, skipping the
rows whose key the table holds: the key's unique constraint decides, so concurrent
writers and a write retried after a lost reply insert a record once.

Invariant: a write either commits all of its new rows or none (one transaction); a row
is skipped only when a row with its key was committed before. A write that cannot commit
raises, and its rows fail and replay (ftlayer never acks them).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import xxhash

from ftlayer.errors import ConfigError
from ftlayer.sinks.keyed import KeyedSink

__all__ = ["PostgresSink"]

log = logging.getLogger(__name__)

_TYPES = {
    "int8": "smallint", "int16": "smallint", "int32": "integer", "int64": "bigint",
    "uint8": "smallint", "uint16": "integer", "uint32": "bigint", "float": "real",
    "double": "double precision", "bool": "boolean", "string": "text",
    "large_string": "text", "binary": "bytea", "large_binary": "bytea", "date32[day]": "date",
}  # fmt: skip
"""Arrow type -> PostgreSQL column type, for ``create=True``."""

_CONNECTIONS: dict[tuple[int, int, str], Any] = {}
"""One connection per (process, thread, URL): a Python worker reuses it for every write."""

_CREATED: set[tuple[str, str]] = set()
"""(URL, table) of the ``create=True`` tables this process knows exist (a fact about the
database: a forked worker may trust its parent's)."""


def _pg_type(t: pa.DataType) -> str:
    if pa.types.is_timestamp(t):
        return "timestamptz" if t.tz else "timestamp"
    if pa.types.is_decimal(t):
        return f"numeric({t.precision},{t.scale})"
    name = _TYPES.get(str(t))
    if name is None:
        raise ConfigError(f"PostgresSink(create=True) cannot map the Arrow type {t}: create "
                          "the table yourself, with a unique key on the lineage column")
    return name


class PostgresSink(KeyedSink):
    """A ``sink_batches`` function writing each batch into ``table`` of the PostgreSQL at
    ``url`` (``postgresql://user@host:port/db``), one row per key: ``(lineage, *key)``.
    ``lineage``: the lineage id column, which the sink asks its pipeline for; ``key``: more
    key columns (a stage that makes several rows of one record adds their ordinal).

    ``create=True`` creates the table from the first batch's columns if it does not
    exist, with the key as its primary key; otherwise the table must exist with a unique
    constraint on exactly the key's columns (the ``ON CONFLICT`` target). ``attempts``:
    how many times a write that lost its connection is tried (a new connection each
    time; the whole transaction again, harmless: it skips what committed)."""

    def __init__(
        self,
        url: str,
        table: str,
        *,
        lineage: str = "lineage_id",
        key: Sequence[str] = (),
        create: bool = False,
        attempts: int = 5,
    ) -> None:
        if not table or not all(part for part in table.split(".")):
            raise ConfigError(f"PostgresSink needs a table name, not {table!r}")
        super().__init__(lineage, key, attempts)
        self.url, self.table, self.create = url, table, create

    def __repr__(self) -> str:
        return f"PostgresSink({self.table!r}, key={list(self.key)})"

    @property
    def __name__(self) -> str:  # a stage's name in counts and errors
        return f"PostgresSink {self.table}"

    def __call__(self, batch: pa.RecordBatch, ctx: Any = None) -> None:
        """Write ``batch`` (``ctx``, a stage context, is accepted and not needed: the key
        decides whatever the attempt)."""
        import psycopg

        if batch.num_rows == 0:
            return
        self.check_key(batch)
        # a table dropped under a running pipeline is created again (create=True)
        retried = (psycopg.OperationalError, *((psycopg.errors.UndefinedTable,)
                                              if self.create else ()))  # fmt: skip

        def note(attempt: int, e: BaseException) -> None:  # a new connection next time
            _CONNECTIONS.pop((os.getpid(), threading.get_ident(), self.url), None)
            _CREATED.discard((self.url, self.table))
            log.warning("PostgreSQL write failed, retrying attempt=%d table=%s error=%s",
                        attempt, self.table, e)  # fmt: skip

        inserted = self.retried(lambda: self._write(batch), retried, 0.05, note)
        self.counted(batch.num_rows, inserted, f"postgres {self.table}")

    def _connection(self) -> Any:
        import psycopg

        k = (os.getpid(), threading.get_ident(), self.url)
        conn = _CONNECTIONS.get(k)
        if conn is None or conn.closed or conn.broken:
            conn = _CONNECTIONS[k] = psycopg.connect(self.url, autocommit=False)
        return conn

    def _write(self, batch: pa.RecordBatch) -> int:
        """One transaction: the rows copied into a session table, then inserted where
        their key is new. Returns how many were inserted."""
        from psycopg import sql

        conn = self._connection()
        target = sql.Identifier(*self.table.split("."))
        stage = sql.Identifier(f"ftlayer_stage_{xxhash.xxh32_hexdigest(self.table.encode())}")
        cols = sql.SQL(", ").join(map(sql.Identifier, batch.schema.names))
        key = sql.SQL(", ").join(map(sql.Identifier, self.key))
        rows = zip(*(c.to_pylist() for c in batch.columns), strict=True)
        if self.create and (self.url, self.table) not in _CREATED:
            self._create(conn, target, batch.schema)
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {}) "
                                "ON COMMIT DELETE ROWS").format(stage, target))  # fmt: skip
            with cur.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(stage, cols)) as copy:
                for row in rows:
                    copy.write_row(row)
            cur.execute(sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) "
                                "DO NOTHING").format(target, cols, cols, stage, key))  # fmt: skip
            return int(cur.rowcount)

    def _create(self, conn: Any, target: Any, schema: pa.Schema) -> None:
        """The table made sure of in a transaction of its own, under an advisory lock
        named after it: ``CREATE TABLE IF NOT EXISTS`` alone races (two sessions both see
        no table, one fails on the catalog's unique index), and the lock ends with the
        short transaction, so writers never wait on each other's writes."""
        from psycopg import sql

        lock = xxhash.xxh64_intdigest(self.table.encode()) - (1 << 63)  # a signed bigint
        columns = sql.SQL(", ").join(
            sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(_pg_type(f.type)))
            for f in schema
        )
        key = sql.SQL(", ").join(map(sql.Identifier, self.key))
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", (lock,))
            cur.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({}, PRIMARY KEY ({}))")
                        .format(target, columns, key))  # fmt: skip
        _CREATED.add((self.url, self.table))
