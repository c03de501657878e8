"""Streaming frame decoder: split a byte stream into frames, surviving bad ones.

Invariant: a bad frame costs exactly that frame. ``next_frame()`` raises a FrameError for
it *after* moving past it, so the caller reports the error and calls again to get the
frames that follow. A corrupt header (bad magic or header check) resyncs at the next
magic; a frame with a valid header is skipped by its own length.
"""

from __future__ import annotations

from serialization.errors import (
    CorruptFrameError,
    FrameError,
    OversizedFrameError,
    TruncatedFrameError,
)
from serialization.frame import (
    DEFAULT_MAX_PAYLOAD,
    HEADER_SIZE,
    MAGIC,
    Frame,
    check_payload,
    describe_record,
    parse_header,
)

__all__ = ["FrameDecoder", "decode_frame", "iter_frames"]


class FrameDecoder:
    """Incremental decoder; feed it chunks of any size, frames may span chunks."""

    __slots__ = ("_buf", "_pos", "_offset", "_skip", "max_payload")

    def __init__(self, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> None:
        self._buf = bytearray()
        self._pos = 0  # read position inside _buf
        self._offset = 0  # stream offset of _buf[0]
        self._skip = 0  # bytes of an oversized frame still to discard
        self.max_payload = max_payload

    @property
    def buffered(self) -> int:
        """Bytes received and not yet consumed."""
        return len(self._buf) - self._pos

    def feed(self, data: bytes) -> None:
        if self._pos > 65536 and self._pos * 2 > len(self._buf):
            del self._buf[: self._pos]
            self._offset += self._pos
            self._pos = 0
        self._buf += data

    def next_frame(self) -> Frame | None:
        """The next complete frame, ``None`` if more bytes are needed, or raise FrameError
        for a bad frame (already skipped: call again for the rest)."""
        buf = self._buf
        if self._skip and self._consume_skip():
            return None
        start = self._pos
        if len(buf) - start < HEADER_SIZE:
            if len(buf) - start >= 2 and buf[start : start + 2] != MAGIC:
                self._resync(start)
                raise CorruptFrameError("bad magic", offset=self._offset + start)
            return None
        try:
            header = parse_header(buf, start, self._offset)
        except CorruptFrameError:
            self._resync(start)
            raise
        n, src, cur, _hc, source, _ck, _part, _mr = header
        if n > self.max_payload:
            self._pos = start + HEADER_SIZE
            self._skip = n
            self._consume_skip()
            raise OversizedFrameError(
                f"payload of {n} bytes exceeds the limit of {self.max_payload} bytes",
                record=describe_record(src, cur, source),
                offset=self._offset + start,
            )
        end = start + HEADER_SIZE + n
        if len(buf) < end:
            return None
        self._pos = end
        payload = bytes(buf[start + HEADER_SIZE : end])
        return check_payload(payload, header, offset=self._offset + start)

    def _consume_skip(self) -> bool:
        """Discard what is buffered of an oversized frame; True while some is still due."""
        take = min(self._skip, len(self._buf) - self._pos)
        self._pos += take
        self._skip -= take
        return self._skip > 0

    def _resync(self, start: int) -> None:
        nxt = self._buf.find(MAGIC, start + 1)
        self._pos = nxt if nxt >= 0 else max(start + 1, len(self._buf) - 1)

    def close(self) -> None:
        """End of stream: raise TruncatedFrameError if it ended inside a frame."""
        left = self.buffered
        if self._skip:
            raise TruncatedFrameError(f"stream ended {self._skip} bytes into a skipped frame")
        if not left:
            return
        start = self._pos
        self._pos = len(self._buf)
        record = None
        if left >= HEADER_SIZE:
            try:
                n, src, cur, _hc, source, _ck, _part, _mr = parse_header(self._buf, start)
                record = describe_record(src, cur, source)
                msg = f"stream ended after {left} of {HEADER_SIZE + n} frame bytes"
            except CorruptFrameError:
                msg = f"stream ended with {left} bytes that are not a frame"
        else:
            msg = f"stream ended inside a frame header ({left} of {HEADER_SIZE} bytes)"
        raise TruncatedFrameError(msg, record=record, offset=self._offset + start)

    def drain(self) -> tuple[list[Frame], list[FrameError]]:
        """Every complete frame buffered so far, and the errors met on the way."""
        frames: list[Frame] = []
        errors: list[FrameError] = []
        while True:
            try:
                frame = self.next_frame()
            except FrameError as e:
                errors.append(e)
                continue
            if frame is None:
                return frames, errors
            frames.append(frame)


def iter_frames(
    data: bytes, *, max_payload: int = DEFAULT_MAX_PAYLOAD
) -> tuple[list[Frame], list[FrameError]]:
    """Decode a whole byte string: (good frames, errors); truncation counts as an error."""
    dec = FrameDecoder(max_payload=max_payload)
    dec.feed(data)
    frames, errors = dec.drain()
    try:
        dec.close()
    except FrameError as e:
        errors.append(e)
    return frames, errors


def decode_frame(data: bytes, *, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Frame:
    """Decode exactly one frame (e.g. a value stored in Redis). A whole, well-formed frame
    takes a direct path (one header parse, one checksum); anything else goes through the
    streaming decoder, whose errors name what is wrong and where."""
    if len(data) >= HEADER_SIZE:
        try:
            header = parse_header(data)
        except CorruptFrameError:
            header = None
        if header and header[0] <= max_payload and len(data) == HEADER_SIZE + header[0]:
            return check_payload(bytes(data[HEADER_SIZE:]), header, offset=0)
    dec = FrameDecoder(max_payload=max_payload)
    dec.feed(data)
    frame = dec.next_frame()
    if frame is None:
        dec.close()  # raises TruncatedFrameError naming the record, or CorruptFrameError if empty
        raise CorruptFrameError("empty input: no frame")
    if dec.buffered:
        raise CorruptFrameError(
            f"{dec.buffered} trailing bytes after the frame", record=frame.describe()
        )
    return frame
