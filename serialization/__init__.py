"""Records as ftlayer stores and replays them: the user's record as opaque msgpack bytes
(never pickle) with the ids, hash code, source and budget the fault-tolerance logic needs.
:mod:`serialization.stored` is the form Redis keeps; :class:`Frame` is one decoded.
"""

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
    Frame,
    decode_payload,
    encode_payload,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD",
    "ChecksumMismatchError",
    "CorruptFrameError",
    "Frame",
    "FrameError",
    "OversizedFrameError",
    "PayloadDecodeError",
    "PayloadEncodeError",
    "TruncatedFrameError",
    "decode_payload",
    "encode_payload",
]
