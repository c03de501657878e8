"""The stored form of a record: what Redis keeps of a pending record (docs/storage-layout.md),
decoded as a :class:`serialization.frame.Frame`.

Layout (big-endian, 28-byte header)::

    0  payload_len  I
    4  hash_code    i    int32 hash of the key
    8  partition    i    partition the source placed it in (-1: unknown)
   12  source       H    source index
   14  max_replays  H    the record's replay budget
   16  checksum     I    xxh32(payload, seed=0): a corrupted payload fails it
   20  lineage      q    the record's lineage id (ftlayer.lineage): set at the source,
                         never changed by a replay or a re-drive
   28  payload      payload_len bytes

Why a 32-bit checksum: it fails all but one in 4 billion corrupted payloads, and every
byte of the header is paid once per pending record (the lineage id added 8; the checksum
gave 4 back).

What Redis knows without it is not stored: the layout's version (the namespace's settings
name it: ``STORED_VERSION``), the source id (the key and slot of the record's ack entry
name it) and the current id (a replay gets a fresh one when claimed). A length past the
stored bytes fails the bounds check, a changed payload the checksum. Lua reads ``payload_len``,
``hash_code``, ``partition``, ``source`` and ``max_replays`` at these offsets
(lua/core/records.lua).

Where a stored record travels to Lua (a flush's persists, a segment's residues) it is
preceded by its 8-byte source id: ``[source id][stored]``, one *unit*.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import xxhash

from serialization.errors import (
    ChecksumMismatchError,
    CorruptFrameError,
    FrameError,
    OversizedFrameError,
    TruncatedFrameError,
)
from serialization.frame import DEFAULT_MAX_PAYLOAD, Frame, describe_record

__all__ = [
    "STORED",
    "STORED_DTYPE",
    "STORED_HEADER_SIZE",
    "STORED_VERSION",
    "decode_stored",
    "decode_stored_many",
    "encode_stored",
    "encode_stored_many",
]

STORED = struct.Struct(">IiiHHIq")
STORED_HEADER_SIZE = STORED.size  # 28
_unpack = STORED.unpack_from
_checksum = xxhash.xxh32_intdigest
STORED_VERSION = 3
"""The stored layout's version (1: whole frames, 2: no lineage id)."""
STORED_DTYPE = np.dtype(
    [("payload_len", ">u4"), ("hash_code", ">i4"), ("partition", ">i4"), ("source", ">u2"),
     ("max_replays", ">u2"), ("checksum", ">u4"), ("lineage", ">i8")]
)  # fmt: skip
assert STORED_DTYPE.itemsize == STORED_HEADER_SIZE


def encode_stored(
    payload: bytes,
    hash_code: int,
    source: int,
    *,
    partition: int = -1,
    max_replays: int = 0,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    source_id: int = 0,
    lineage: int = 0,
) -> bytes:
    """The stored form of a payload (``source_id`` only names it in errors); raises
    OversizedFrameError past ``max_payload``, CorruptFrameError for a field out of range."""
    if len(payload) > max_payload:
        raise OversizedFrameError(
            f"payload of {len(payload)} bytes exceeds the limit of {max_payload} bytes",
            record=describe_record(source_id, 0, source),
        )
    try:
        head = STORED.pack(len(payload), hash_code, partition, source, max_replays,
                           _checksum(payload), lineage)  # fmt: skip
    except struct.error as e:
        raise CorruptFrameError(
            f"cannot store record: {e} (hash_code and partition int32, source and max_replays "
            "u16, lineage int64)",
            record=describe_record(source_id, 0, source),
        ) from e
    return head + payload


def encode_stored_many(
    payloads: Sequence[bytes],
    hash_codes: np.ndarray | int,
    source: int,
    *,
    partitions: np.ndarray | int = -1,
    max_replays: int = 0,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
    lineages: np.ndarray | int = 0,
) -> np.ndarray:
    """The stored headers of many payloads as one STORED_DTYPE array: ``encode_stored``
    with no Python call per record but the checksum (``hash_codes``, ``partitions`` and
    ``lineages`` aligned arrays or one value for all). Raises OversizedFrameError or
    CorruptFrameError naming the index of the first bad record."""
    n = len(payloads)
    lens = np.fromiter(map(len, payloads), np.int64, n)
    hcs = np.broadcast_to(np.asarray(hash_codes, np.int64), (n,))
    parts = np.broadcast_to(np.asarray(partitions, np.int64), (n,))
    if not (0 <= source < 1 << 16 and 0 <= max_replays < 1 << 16):
        raise CorruptFrameError(f"source {source} and max_replays {max_replays} must be u16")
    for what, bad, err in (
        ("bytes exceed the limit of", lens > max_payload, OversizedFrameError),
        ("has a hash_code that is not int32", (hcs < -(2**31)) | (hcs >= 2**31), CorruptFrameError),
        ("has a partition that is not int32", (parts < -(2**31)) | (parts >= 2**31),
         CorruptFrameError),
    ):  # fmt: skip
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            limit = f" {max_payload}" if err is OversizedFrameError else ""
            raise err(f"record {i} ({int(lens[i])} bytes, hash_code={int(hcs[i])}, "
                      f"partition={int(parts[i])}, source={source}) {what}{limit}")  # fmt: skip
    h = np.empty(n, STORED_DTYPE)
    h["payload_len"] = lens
    h["hash_code"], h["partition"] = hcs, parts
    h["source"], h["max_replays"] = source, max_replays
    h["checksum"] = np.fromiter(map(_checksum, payloads), np.uint32, n)
    h["lineage"] = np.asarray(lineages).astype(np.int64, copy=False)
    return h


def decode_stored(
    stored: bytes, source_id: int, current_id: int = 0, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> Frame:
    """The Frame of a stored record named ``source_id`` (``current_id``: the one it is
    handed out with; 0 for a record at rest). Raises a FrameError naming the record for
    a short or oversized record, trailing bytes, or a payload whose checksum fails."""
    if len(stored) >= STORED_HEADER_SIZE:  # the path of every good record: no string made
        n, hc, part, source, budget, ck, lineage = _unpack(stored)
        if n <= max_payload and len(stored) == STORED_HEADER_SIZE + n:
            payload = bytes(stored[STORED_HEADER_SIZE:])
            if _checksum(payload) == ck:
                return Frame(source_id, current_id, hc, source, payload, part, budget, lineage)
    raise _why(stored, source_id, current_id, max_payload)


def decode_stored_many(
    blob: bytes,
    lens: Sequence[int],
    source_ids: Sequence[int],
    current_ids: Sequence[int],
    *,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> list[Frame | FrameError]:
    """``decode_stored`` of records stored end to end in ``blob`` (``lens`` bytes each),
    each named by its ids: a Frame for each one that decodes, the FrameError it would
    raise for each one that does not (so one bad record is handled alone). The headers
    are read and checked as one array; per record, only its payload's copy, its checksum
    and its Frame."""
    n = len(lens)
    size = np.asarray(lens, np.int64)
    ends = np.cumsum(size)
    if n and int(ends[-1]) != len(blob):
        raise CorruptFrameError(f"{len(blob)} bytes hold records of {int(ends[-1])} in all")
    starts = ends - size
    whole = size >= STORED_HEADER_SIZE  # a short one's header is not read
    at = np.where(whole, starts, 0)[:, None] + np.arange(STORED_HEADER_SIZE)
    # a record that is not whole reads the blob's first header's bytes (or zeros), unused
    big = len(blob) >= STORED_HEADER_SIZE
    buf = np.frombuffer(blob, np.uint8) if big else np.zeros(STORED_HEADER_SIZE, np.uint8)
    heads = buf[at].view(STORED_DTYPE)[:, 0]
    plen = heads["payload_len"].astype(np.int64)
    good = whole & (plen <= max_payload) & (plen == size - STORED_HEADER_SIZE)
    out: list[Frame | FrameError] = []
    add = out.append
    new = tuple.__new__  # a named tuple without its __new__'s argument handling
    for ok, start, end, src, cur, hc, part, source, budget, ck, lin in zip(
        good.tolist(), starts.tolist(), ends.tolist(), source_ids, current_ids,
        heads["hash_code"].tolist(), heads["partition"].tolist(), heads["source"].tolist(),
        heads["max_replays"].tolist(), heads["checksum"].tolist(), heads["lineage"].tolist(),
        strict=True,
    ):  # fmt: skip
        if ok:
            payload = blob[start + STORED_HEADER_SIZE : end]
            if _checksum(payload) == ck:
                add(new(Frame, (src, cur, hc, source, payload, part, budget, lin)))
                continue
        add(_why(blob[start:end], src, cur, max_payload))
    return out


def _why(stored: bytes, source_id: int, current_id: int, max_payload: int) -> FrameError:
    """The error ``decode_stored`` raises for a record it could not decode."""
    if len(stored) < STORED_HEADER_SIZE:
        return TruncatedFrameError(f"stored record of {len(stored)} bytes: header cut short",
                                   record=describe_record(source_id, current_id, 0))  # fmt: skip
    n, _hc, _part, source, _budget, _ck, _lin = _unpack(stored)
    desc = describe_record(source_id, current_id, source)
    if n > max_payload:
        return OversizedFrameError(f"payload of {n} bytes exceeds the limit of {max_payload} "
                                   "bytes", record=desc)  # fmt: skip
    if len(stored) != STORED_HEADER_SIZE + n:
        return CorruptFrameError(f"stored record of {len(stored)} bytes says its payload has "
                                 f"{n}", record=desc)  # fmt: skip
    return ChecksumMismatchError("payload checksum mismatch (payload corrupted)", record=desc)

