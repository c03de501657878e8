"""The payload codec (msgpack, never pickle) through the stored form: every record comes
back, and bad input names its record."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serialization import Frame, PayloadDecodeError, PayloadEncodeError, encode_payload
from serialization.stored import decode_stored, encode_stored

u64 = st.integers(0, 2**64 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
records = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(records, u64, u64, i32, st.integers(0, 65535), i32, st.integers(0, 65535))
def test_round_trip(record, src: int, cur: int, hc: int, source: int, part: int,
                    budget: int) -> None:  # fmt: skip
    """Every field, the replay budget included, and the payload come back; the payload
    bytes are carried untouched."""
    stored = encode_stored(encode_payload(record), hc, source, partition=part,
                           max_replays=budget)  # fmt: skip
    f = decode_stored(stored, src, cur)
    assert f == Frame(src, cur, hc, source, encode_payload(record), part, budget)
    assert f.decode() == record


def test_undecodable_payload_names_the_record() -> None:
    f = decode_stored(encode_stored(b"\xc1", 2, 0), 0x99, 1)  # 0xc1 is never valid msgpack
    with pytest.raises(PayloadDecodeError, match="src=0000000000000099"):
        f.decode()
    with pytest.raises(PayloadDecodeError):
        decode_stored(encode_stored(b"\x92\x01", 3, 0), 1).decode()  # truncated array


def test_unencodable_record() -> None:
    with pytest.raises(PayloadEncodeError, match="object"):
        encode_payload(object())
