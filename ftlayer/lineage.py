"""Lineage ids: one 64-bit id per source record, the same through every replay.

A record's *RecordId* changes with each replay (a replay is a new emit, Storm's rule); its
*lineage id* does not. It is set where the record enters ftlayer, stored in the record's
header (serialization.stored) whenever the record is persisted, and copied with it by
every replay and every ``dlq replay`` re-drive. An idempotent sink (ftlayer.sinks) keeps
one row per lineage id, so a record that reached the sink before a crash and comes back
is recognised.

How a source record gets its lineage id (an int64, Spark's ``long``):

* kept by reference (``reads=``): ``xxhash64(source, location, position)`` -- Spark's
  ``xxhash64`` of the record's reference, computed in the JVM for DataFrame stages and by
  :func:`spark_xxhash64` in Python; a function of where the record is in its source, so
  a re-run batch, and a query restarted on the same files, give the same ids;
* with ``record_key``: the key itself (a non-negative int64; a record whose key is null
  or negative is dead-lettered at its source with the error naming it, and keeps the key
  as its lineage id, -1 for null);
* a copy (a source ftlayer cannot read again): ``xxhash64(seed, batch-local id)``, the
  batch-local id a function of (partition, row index) (ftlayer.ids.batch_source_ids) and
  the seed of (Spark's query id, source index, batch id) -- so a micro-batch re-run after
  a driver crash gives its rows the same ids. Outside a streaming query (a pipeline
  called on a DataFrame) the seed is random per batch run.
* the task-scope handler (``FTHandler.persist``) without one given: the record's first
  source id (random).

Invariant: a lineage id is never recomputed once a record is stored; whoever persists a
record (a source task, the driver settling a segment, the sidecar timing one out) uses
these functions, so the same record gets the same id wherever it is persisted.
"""

from __future__ import annotations

import os

import numpy as np
import xxhash

__all__ = [
    "LINEAGE_META",
    "copy_lineage",
    "copy_seed",
    "reference_lineage",
    "spark_xxhash64",
]

LINEAGE_META = b"ftlayer.lineage"
"""Arrow schema metadata of a segment: how its rows' lineage ids are made (``ref``,
``key:<column>``, ``seed:<int>``), so whoever settles it -- the driver, or the sidecar
timing it out -- persists each row with the id its batch gave it."""

SPARK_SEED = 42
"""The seed of Spark's ``xxhash64`` function."""

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _hash_long(value: np.ndarray, seed: np.ndarray) -> np.ndarray:
    """XXH64 of one 8-byte little-endian value (Spark's ``XXH64.hashLong``, the same
    arithmetic as the reference XXH64 of 8 bytes), elementwise over uint64 arrays."""
    h = seed + _P5 + np.uint64(8)
    h ^= _rotl(value * _P2, 31) * _P1
    h = _rotl(h, 27) * _P1 + _P4
    h ^= h >> np.uint64(33)
    h *= _P2
    h ^= h >> np.uint64(29)
    h *= _P3
    h ^= h >> np.uint64(32)
    return h


def spark_xxhash64(*columns: np.ndarray | int, seed: int = SPARK_SEED) -> np.ndarray:
    """Spark's ``xxhash64(c1, c2, ...)`` of int64 columns (no nulls) as an int64 array:
    each column's hash seeds the next (Spark's HashExpression over LongType)."""
    arrays = [np.atleast_1d(np.asarray(c).astype(np.int64, copy=False)) for c in columns]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    h = np.full(shape, np.int64(seed).view(np.uint64), np.uint64)
    with np.errstate(over="ignore"):
        for a in arrays:
            h = _hash_long(np.broadcast_to(a, shape).view(np.uint64), h)
    return h.view(np.int64)


def reference_lineage(source: int, locations: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The lineage ids of records kept by reference: ``xxhash64(source, loc, pos)``."""
    return spark_xxhash64(np.int64(source), locations, positions)


def copy_seed(query_id: str | None, source: int, batch_id: int | str) -> int:
    """The seed of a copy source's lineage ids in one batch: a function of (query id,
    source, batch id) in a streaming query, random outside one (int64)."""
    if query_id is None:
        return int.from_bytes(os.urandom(8), "big", signed=True)
    digest = xxhash.xxh64_digest(f"{query_id}:{source}:{batch_id}".encode())
    return int.from_bytes(digest, "big", signed=True)


def copy_lineage(seed: int, local_ids: np.ndarray) -> np.ndarray:
    """The lineage ids of copied rows by their batch-local ids: ``xxhash64(seed, id)``."""
    return spark_xxhash64(np.int64(seed), np.asarray(local_ids).view(np.int64))
