"""A frame: one stored record (serialization.stored) as Python holds it -- the user's record
as msgpack bytes, never decoded or re-encoded on the way, with what the fault-tolerance
logic needs: its ids, the int32 hash code of its key (replay partitioning), its source
index, original partition, replay budget and lineage id. Also the payload codec: msgpack
only, never pickle.

In Redis a frame is the stored bytes (a bucket's ``frames`` string, lua/core/buckets.lua);
``Frame`` is the same record decoded. The word means nothing else.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack

from serialization.errors import PayloadDecodeError, PayloadEncodeError

__all__ = ["DEFAULT_MAX_PAYLOAD", "Frame", "decode_payload", "describe_record", "encode_payload"]

DEFAULT_MAX_PAYLOAD = 1 << 20
"""The default limit of a record's payload, in bytes."""


class Frame(NamedTuple):
    """One stored record, decoded; ``payload`` is the record's msgpack bytes, untouched. A
    named tuple: one is built for every claimed replay."""

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
