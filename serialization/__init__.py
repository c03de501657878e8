"""Record framing for the FT layer (the seed's SemiDeserializedStreamRecord).

The FT layer stores and replays the user's record as opaque msgpack bytes; a frame adds
the RecordId, the key's int32 hash code, the source index and an xxh64 payload checksum.
Only msgpack is ever decoded here -- never pickle.
"""

from serialization.decoder import FrameDecoder, decode_frame, iter_frames
from serialization.errors import (
    ChecksumMismatchError,
    CorruptFrameError,
    FrameError,
    OversizedFrameError,
    PayloadDecodeError,
    PayloadEncodeError,
    TruncatedFrameError,
)
from serialization.frame import (
    DEFAULT_MAX_PAYLOAD,
    HEADER_SIZE,
    Frame,
    decode_payload,
    encode_frame,
    encode_payload,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "HEADER_SIZE",
    "ChecksumMismatchError",
    "CorruptFrameError",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "OversizedFrameError",
    "PayloadDecodeError",
    "PayloadEncodeError",
    "TruncatedFrameError",
    "decode_frame",
    "decode_payload",
    "encode_frame",
    "encode_payload",
    "iter_frames",
]
