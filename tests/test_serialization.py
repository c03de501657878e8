"""Frames: round trips, streaming in any chunking, and every bad-input case."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serialization import (
    HEADER_SIZE,
    ChecksumMismatchError,
    CorruptFrameError,
    FrameDecoder,
    OversizedFrameError,
    PayloadDecodeError,
    PayloadEncodeError,
    TruncatedFrameError,
    decode_frame,
    encode_frame,
    encode_payload,
    iter_frames,
)

u64 = st.integers(0, 2**64 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
records = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False)
    | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=4),
    max_leaves=12,
)  # fmt: skip
frames_args = st.tuples(records, u64, u64, i32, st.integers(0, 65535), i32)


def _frame(args) -> bytes:
    record, src, cur, hc, source, part = args
    return encode_frame(encode_payload(record), src, cur, hc, source, partition=part)


@settings(max_examples=300, deadline=None)
@given(frames_args, st.integers(0, 65535))
def test_round_trip(args, max_replays: int) -> None:
    """Every header field, the replay budget included, and the payload come back."""
    record, src, cur, hc, source, part = args
    raw = encode_frame(encode_payload(record), src, cur, hc, source, partition=part,
                       max_replays=max_replays)  # fmt: skip
    f = decode_frame(raw)
    assert (f.source_id, f.current_id, f.hash_code, f.source, f.partition, f.max_replays) == (
        src,
        cur,
        hc,
        source,
        part,
        max_replays,
    )
    assert f.decode() == record
    assert f.payload == encode_payload(record), "the payload bytes are carried untouched"


@settings(max_examples=200, deadline=None)
@given(frames_args, st.integers(0, 65535))
def test_a_decoded_frame_reencodes_to_the_same_bytes(args, max_replays: int) -> None:
    """Every header field survives decode -> encode (a re-encoded record once lost its
    replay budget)."""
    record, src, cur, hc, source, part = args
    raw = encode_frame(encode_payload(record), src, cur, hc, source, partition=part,
                       max_replays=max_replays)  # fmt: skip
    f = decode_frame(raw)
    assert f.max_replays == max_replays
    again = encode_frame(f.payload, f.source_id, f.current_id, f.hash_code, f.source,
                         partition=f.partition, max_replays=f.max_replays)  # fmt: skip
    assert again == raw


@settings(max_examples=150, deadline=None)
@given(st.lists(frames_args, max_size=8), st.lists(st.integers(1, 97), min_size=1))
def test_stream_decoder_handles_any_chunking(items, cuts) -> None:
    data = b"".join(_frame(a) for a in items)
    dec = FrameDecoder()
    got, pos, i = [], 0, 0
    while pos < len(data):
        step = cuts[i % len(cuts)]
        dec.feed(data[pos : pos + step])
        pos, i = pos + step, i + 1
        while (f := dec.next_frame()) is not None:
            got.append(f)
    dec.close()
    assert [f.decode() for f in got] == [a[0] for a in items]


def _three(middle: bytes) -> bytes:
    a = encode_frame(encode_payload("before"), 1, 2, 3, 0)
    c = encode_frame(encode_payload("after"), 7, 8, 9, 0)
    return a + middle + c


def _decoded(data: bytes, **kw):
    frames, errors = iter_frames(data, **kw)
    return [f.decode() for f in frames], errors


def test_checksum_mismatch_names_the_record_and_spares_the_rest() -> None:
    bad = bytearray(encode_frame(encode_payload("middle"), 0xAB, 0xCD, 5, 3))
    bad[-1] ^= 0xFF
    good, [err] = _decoded(_three(bytes(bad)))
    assert good == ["before", "after"]
    assert isinstance(err, ChecksumMismatchError)
    assert "src=00000000000000ab" in str(err) and "source=3" in str(err)


def test_corrupt_header_resyncs_at_the_next_frame() -> None:
    bad = bytearray(encode_frame(encode_payload("middle"), 5, 6, 7, 0))
    bad[5] ^= 0x40  # payload length: caught by the header check, not trusted
    good, errors = _decoded(_three(bytes(bad)))
    assert good == ["before", "after"]
    assert errors and all(isinstance(e, CorruptFrameError) for e in errors)


def test_garbage_between_frames() -> None:
    good, errors = _decoded(_three(b"\x00garbage FT nonsense"))
    assert good == ["before", "after"] and errors


def test_oversized_frame_is_skipped_by_its_length() -> None:
    big = encode_frame(b"\xc4\x10" + b"x" * 16 + b"FT" * 100, 11, 12, 13, 2)
    good, [err] = _decoded(_three(big), max_payload=100)
    assert good == ["before", "after"]
    assert isinstance(err, OversizedFrameError) and "src=000000000000000b" in str(err)


def test_oversized_payload_refused_when_framing() -> None:
    with pytest.raises(OversizedFrameError, match="exceeds the limit of 10 bytes"):
        encode_frame(b"x" * 11, 1, 2, 3, 0, max_payload=10)


def test_truncated_frame_names_the_record() -> None:
    f = encode_frame(encode_payload("x" * 50), 0x77, 1, 2, 4)
    good, [err] = _decoded(encode_frame(encode_payload("ok"), 1, 2, 3, 0) + f[:-10])
    assert good == ["ok"]
    assert isinstance(err, TruncatedFrameError) and "src=0000000000000077" in str(err)
    with pytest.raises(TruncatedFrameError, match="inside a frame header"):
        decode_frame(f[: HEADER_SIZE - 1])


def test_undecodable_payload_names_the_record() -> None:
    f = decode_frame(encode_frame(b"\xc1", 0x99, 1, 2, 0))  # 0xc1 is never valid msgpack
    with pytest.raises(PayloadDecodeError, match="src=0000000000000099"):
        f.decode()
    with pytest.raises(PayloadDecodeError):
        decode_frame(encode_frame(b"\x92\x01", 1, 2, 3, 0)).decode()  # truncated array


def test_unencodable_record() -> None:
    with pytest.raises(PayloadEncodeError, match="object"):
        encode_payload(object())


def test_bad_header_fields_are_refused() -> None:
    with pytest.raises(CorruptFrameError, match="int32"):
        encode_frame(b"\x01", 1, 2, 2**31, 0)
    with pytest.raises(CorruptFrameError, match="trailing"):
        decode_frame(encode_frame(b"\x01", 1, 2, 3, 0) + b"FT")
