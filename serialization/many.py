"""Frames for many records at once: the headers of serialization.frame as one numpy array.

The per-record path (``encode_frame``) packs a header with ``struct`` and hashes it with
xxh32 in a Python call per record. Here the header fields are columns of a structured
array and the header check is xxh32 computed over all headers at once with uint32
arithmetic (the algorithm of Yann Collet's xxHash spec, ``doc/xxhash_spec.md``, for a
fixed 28-byte input). Only the payload checksum (xxh64 over variable-length payloads)
stays one library call per record.

Invariant: ``frame_headers(...)[i]`` is byte for byte the header ``encode_frame`` makes for
record ``i`` (tests/test_frames_many.py checks it against the per-record path).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xxhash

from serialization.errors import CorruptFrameError, OversizedFrameError
from serialization.frame import DEFAULT_MAX_PAYLOAD, HEADER_SIZE, MAGIC, VERSION, describe_record

__all__ = ["HEADER_DTYPE", "encode_frames", "frame_headers", "xxh32_28"]

HEADER_DTYPE = np.dtype(
    [("magic", "S2"), ("version", "u1"), ("flags", "u1"), ("payload_len", ">u4"),
     ("source_id", ">u8"), ("current_id", ">u8"), ("hash_code", ">i4"), ("partition", ">i4"),
     ("source", ">u2"), ("max_replays", ">u2"), ("checksum", ">u8"), ("header_check", ">u4")]
)  # fmt: skip
assert HEADER_DTYPE.itemsize == HEADER_SIZE

_P1, _P2, _P3, _P4, _P5 = (np.uint32(p) for p in
                           (2654435761, 2246822519, 3266489917, 668265263, 374761393))  # fmt: skip


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def xxh32_28(rows: np.ndarray) -> np.ndarray:
    """xxh32 (seed 0) of each row of an (n, 28) uint8 array, as uint32: one stripe of four
    lanes, three 4-byte words, no tail bytes, then the avalanche."""
    w = np.ascontiguousarray(rows).view("<u4").astype(np.uint32)  # (n, 7) little-endian words
    with np.errstate(over="ignore"):
        seeds = (_P1 + _P2, _P2, np.uint32(0), np.uint32(0) - _P1)
        lanes = [_rotl(seeds[i] + w[:, i] * _P2, 13) * _P1 for i in range(4)]
        h = _rotl(lanes[0], 1) + _rotl(lanes[1], 7) + _rotl(lanes[2], 12) + _rotl(lanes[3], 18)
        h += np.uint32(28)
        for i in range(4, 7):
            h = _rotl(h + w[:, i] * _P3, 17) * _P4
        h ^= h >> np.uint32(15)
        h *= _P2
        h ^= h >> np.uint32(13)
        h *= _P3
        h ^= h >> np.uint32(16)
    return h


def frame_headers(
    payload_lens: np.ndarray,
    source_ids: np.ndarray,
    current_ids: np.ndarray,
    hash_codes: np.ndarray,
    partitions: np.ndarray,
    source: int,
    max_replays: int,
    checksums: np.ndarray,
) -> np.ndarray:
    """The 48-byte headers of n frames as an (n,) array of HEADER_DTYPE (``.view(np.uint8)``
    for the bytes). Ranges are the caller's to check (see ``encode_frames``)."""
    h = np.zeros(len(payload_lens), HEADER_DTYPE)
    h["magic"], h["version"] = MAGIC, VERSION
    h["payload_len"] = payload_lens
    h["source_id"], h["current_id"] = source_ids, current_ids
    h["hash_code"], h["partition"] = hash_codes, partitions
    h["source"], h["max_replays"] = source, max_replays
    h["checksum"] = checksums
    raw = h.view(np.uint8).reshape(-1, HEADER_SIZE)
    h["header_check"] = xxh32_28(np.concatenate([raw[:, 0:8], raw[:, 24:44]], axis=1))
    return h


def encode_frames(
    payloads: Sequence[bytes],
    source_ids: np.ndarray,
    current_ids: np.ndarray,
    hash_codes: np.ndarray | int,
    source: int,
    *,
    partitions: np.ndarray | int = -1,
    max_replays: int = 0,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> np.ndarray:
    """``encode_frame`` for many payloads: their headers (see ``frame_headers``). Raises
    OversizedFrameError naming the first payload past ``max_payload``, CorruptFrameError
    for a field out of its range (ids u64, hash code and partition int32, source and
    max_replays u16)."""
    n = len(payloads)
    lens = np.fromiter(map(len, payloads), np.int64, n)
    hcs = np.broadcast_to(np.asarray(hash_codes, np.int64), (n,))
    parts = np.broadcast_to(np.asarray(partitions, np.int64), (n,))
    big = np.flatnonzero(lens > max_payload)
    if len(big):
        i = int(big[0])
        raise OversizedFrameError(
            f"payload {i} of {int(lens[i])} bytes exceeds the limit of {max_payload} bytes",
            record=describe_record(int(source_ids[i]), int(current_ids[i]), source),
        )
    for name, values in (("hash_code", hcs), ("partition", parts)):
        bad = np.flatnonzero((values < -(2**31)) | (values >= 2**31))
        if len(bad):
            i = int(bad[0])
            raise CorruptFrameError(
                f"cannot frame record {i}: {name} {int(values[i])} is not int32",
                record=describe_record(int(source_ids[i]), int(current_ids[i]), source),
            )
    if not (0 <= source < 1 << 16 and 0 <= max_replays < 1 << 16):
        raise CorruptFrameError(f"source {source} and max_replays {max_replays} must be u16")
    checks = np.fromiter(map(xxhash.xxh64_intdigest, payloads), np.uint64, n)
    return frame_headers(lens, source_ids, current_ids, hcs, parts, source, max_replays, checks)
