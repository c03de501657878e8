"""Record frames: the seed's SemiDeserializedStreamRecord.

A frame carries the user's record as msgpack bytes that the FT layer never decodes or
re-encodes, together with what the fault-tolerance logic needs: the RecordId, the int32
hash code of the record's key (for replay partitioning) and the source index.

Layout (big-endian, 48-byte header)::

    0  magic        2s   b"FT"
    2  version      B    1
    3  flags        B    0 (reserved)
    4  payload_len  I
    8  source_id    Q    source_record_id
   16  current_id   Q    current_record_id
   24  hash_code    i    int32 hash of the key (Spark's hash() of the key columns)
   28  partition    i    partition the source placed it in (-1: unknown)
   32  source       H    source index
   34  max_replays  H    the record's replay budget (set by the pipeline persisting it)
   36  checksum     Q    xxh64(payload, seed=0)
   44  header_check I    xxh32(bytes 0..8 + bytes 24..44)
   48  payload      payload_len bytes

The header check lets a stream decoder tell a corrupt header (resync at the next magic)
from a genuinely oversized record (skip exactly its length). The record ids are
deliberately outside both checks: the FT layer gives a replayed record a new source id by
rewriting bytes 8..24 inside Redis, where Lua has no xxhash; the payload -- the only part
that comes from outside -- stays covered.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

import msgpack
import xxhash

from serialization.errors import (
    ChecksumMismatchError,
    CorruptFrameError,
    OversizedFrameError,
    PayloadDecodeError,
    PayloadEncodeError,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "VERSION",
    "Frame",
    "decode_payload",
    "encode_frame",
    "encode_payload",
    "frame_header",
]

MAGIC = b"FT"
VERSION = 1
HEADER = struct.Struct(">2sBBIQQiiHHQI")
HEADER_SIZE = HEADER.size  # 48
_CHECKED = struct.Struct(">2sBBIiiHHQ")  # the header fields covered by header_check
DEFAULT_MAX_PAYLOAD = 1 << 20

_checksum = xxhash.xxh64_intdigest
_header_check = xxhash.xxh32_intdigest


class Frame(NamedTuple):
    """One framed record; ``payload`` is the record's msgpack bytes, untouched. A named
    tuple: built for every claimed replay, where a frozen dataclass cost ~1 µs each."""

    source_id: int
    current_id: int
    hash_code: int
    source: int
    payload: bytes
    partition: int = -1
    max_replays: int = 0
    lineage: int = 0
    """The record's lineage id (int64): the same for its first attempt, every replay and
    every re-drive (ftlayer.lineage)."""

    def describe(self) -> str:
        return describe_record(self.source_id, self.current_id, self.source)

    def decode(self) -> Any:
        """The user's record, decoded from msgpack (raises PayloadDecodeError)."""
        return decode_payload(self.payload, record=self.describe())


def describe_record(source_id: int, current_id: int, source: int) -> str:
    return f"src={source_id:016x} cur={current_id:016x} source={source}"


def encode_payload(record: Any, *, record_desc: str | None = None) -> bytes:
    """msgpack-encode a user record; unsupported types raise PayloadEncodeError."""
    try:
        return msgpack.packb(record, use_bin_type=True, datetime=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise PayloadEncodeError(
            f"record of type {type(record).__name__} cannot be encoded as msgpack: {e}",
            record=record_desc,
        ) from e


def decode_payload(payload: bytes, *, record: str | None = None) -> Any:
    """Decode msgpack bytes strictly: exactly one object, no trailing bytes."""
    try:
        return msgpack.unpackb(payload, raw=False, timestamp=3, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise PayloadDecodeError(f"payload is not valid msgpack: {e}", record=record) from e


def frame_header(
    payload_len: int,
    source_id: int,
    current_id: int,
    hash_code: int,
    source: int,
    checksum: int,
    partition: int = -1,
    max_replays: int = 0,
) -> bytes:
    checked = _CHECKED.pack(
        MAGIC, VERSION, 0, payload_len, hash_code, partition, source, max_replays, checksum
    )
    return HEADER.pack(
        MAGIC, VERSION, 0, payload_len, source_id, current_id, hash_code, partition, source,
        max_replays, checksum, _header_check(checked),
    )  # fmt: skip


def encode_frame(
    payload: bytes,
    source_id: int,
    current_id: int,
    hash_code: int,
    source: int,
    *,
    partition: int = -1,
    max_replays: int = 0,
    max_payload: int = DEFAULT_MAX_PAYLOAD,
) -> bytes:
    """Frame a payload; raises OversizedFrameError past ``max_payload`` bytes."""
    if len(payload) > max_payload:
        raise OversizedFrameError(
            f"payload of {len(payload)} bytes exceeds the limit of {max_payload} bytes",
            record=describe_record(source_id, current_id, source),
        )
    try:
        head = frame_header(
            len(payload),
            source_id,
            current_id,
            hash_code,
            source,
            _checksum(payload),
            partition,
            max_replays,
        )
    except struct.error as e:
        raise CorruptFrameError(
            f"cannot frame record: {e} "
            "(ids must be u64, hash_code and partition int32, source and max_replays u16)",
            record=describe_record(source_id, current_id, source),
        ) from e
    return head + payload


Header = tuple[int, int, int, int, int, int, int, int]


def parse_header(buf: bytes | bytearray, pos: int = 0, base: int = 0) -> Header:
    """Return (payload_len, source_id, current_id, hash_code, source, checksum, partition,
    max_replays) or raise CorruptFrameError, reporting ``base + pos`` as the offset."""
    magic, version, _fl, n, src, cur, hc, part, source, mr, ck, hcheck = HEADER.unpack_from(
        buf, pos
    )
    if magic != MAGIC:
        raise CorruptFrameError(
            f"bad magic {bytes(magic)!r}, expected {MAGIC!r}", offset=base + pos
        )
    raw = bytes(buf[pos : pos + 8]) + bytes(buf[pos + 24 : pos + 44])
    if _header_check(raw) != hcheck:
        raise CorruptFrameError("header check failed (corrupt header)", offset=base + pos)
    if version != VERSION:
        raise CorruptFrameError(f"unknown frame version {version}", offset=base + pos)
    return n, src, cur, hc, source, ck, part, mr


def check_payload(payload: bytes, header: Header, *, offset: int | None = None) -> Frame:
    _n, src, cur, hc, source, ck, part, mr = header
    if _checksum(payload) != ck:
        raise ChecksumMismatchError(
            "payload checksum mismatch (payload corrupted)",
            record=describe_record(src, cur, source),
            offset=offset,
        )
    return Frame(src, cur, hc, source, payload, part, mr)
