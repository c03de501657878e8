"""Errors raised while framing or unframing records.

Every error names what is wrong and, whenever the header could be read, which record
(its RecordId and source index), so a bad record can be reported instead of dropped.
"""

from __future__ import annotations

__all__ = [
    "ChecksumMismatchError",
    "CorruptFrameError",
    "FrameError",
    "OversizedFrameError",
    "PayloadDecodeError",
    "PayloadEncodeError",
    "TruncatedFrameError",
]


class FrameError(ValueError):
    """Root of the framing errors.

    ``record`` is a short description of the record (``src=… cur=… source=…``) when the
    header was readable, else ``None``; ``offset`` is the byte offset of the frame in the
    stream the decoder was fed, when known.
    """

    def __init__(self, message: str, *, record: str | None = None, offset: int | None = None):
        where = []
        if record is not None:
            where.append(f"record {record}")
        if offset is not None:
            where.append(f"at byte {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.record = record
        self.offset = offset


class CorruptFrameError(FrameError):
    """The bytes are not a frame: bad magic, unknown version or impossible header."""


class TruncatedFrameError(FrameError):
    """The stream ended inside a frame."""


class OversizedFrameError(FrameError):
    """The payload is larger than the configured limit."""


class ChecksumMismatchError(FrameError):
    """The payload does not match the xxh64 checksum written with it."""


class PayloadDecodeError(FrameError):
    """The payload is not valid msgpack."""


class PayloadEncodeError(FrameError):
    """The record cannot be encoded as msgpack (e.g. an unsupported type)."""
