"""serialization.stored: the form Redis keeps of a record, one by one and many at once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serialization.errors import (
    ChecksumMismatchError,
    CorruptFrameError,
    OversizedFrameError,
    TruncatedFrameError,
)
from serialization.stored import (
    decode_stored,
    decode_stored_many,
    encode_stored,
    encode_stored_many,
)

records = st.lists(
    st.tuples(st.binary(max_size=300), st.integers(-(2**31), 2**31 - 1),
              st.integers(-1, 2**31 - 1)),
    min_size=1, max_size=30,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(records, st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1), st.integers(1, 2**64 - 1))
def test_many_is_one_by_one_and_decodes_back(rows: list, source: int, budget: int, sid: int):
    """Catches: a field at the wrong place, width or byte order in either encoder, and a
    decoder that reads another field than the one written."""
    payloads = [r[0] for r in rows]
    hcs, parts = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    heads = encode_stored_many(payloads, hcs, source, partitions=parts, max_replays=budget)
    for head, (p, hc, part) in zip(heads.view(f"V{heads.itemsize}").tolist(), rows, strict=True):
        one = encode_stored(p, hc, source, partition=part, max_replays=budget)
        assert head + p == one
        f = decode_stored(one, sid, 7)
        assert (f.source_id, f.current_id, f.hash_code, f.partition) == (sid, 7, hc, part)
        assert (f.source, f.max_replays, f.payload) == (source, budget, p)


def test_bad_records_name_themselves() -> None:
    with pytest.raises(OversizedFrameError, match=r"record 1 \(11 bytes.*limit of 10"):
        encode_stored_many([b"a", b"b" * 11, b"c"], 0, 0, max_payload=10)
    with pytest.raises(CorruptFrameError, match=r"record 2 .*hash_code that is not int32"):
        encode_stored_many([b"a"] * 3, np.array([0, 0, 2**31]), 0)
    good = encode_stored(b"\x91\x01", 5, 1)
    with pytest.raises(TruncatedFrameError, match="src=000000000000002a"):
        decode_stored(good[:10], 42)
    with pytest.raises(CorruptFrameError, match="says its payload has 2"):
        decode_stored(good + b"x", 42)
    with pytest.raises(ChecksumMismatchError, match="src=000000000000002a"):
        decode_stored(good[:-1] + b"\x02", 42)
    with pytest.raises(OversizedFrameError):
        decode_stored(good, 42, max_payload=1)


_DAMAGE = st.sampled_from(["none", "checksum", "short", "trailing", "cut_header", "oversized"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=200), st.integers(-(2**31), 2**31 - 1), _DAMAGE),
                min_size=0, max_size=25))  # fmt: skip
def test_decoding_many_gives_what_decoding_each_gives_or_raises(rows: list) -> None:
    """decode_stored_many (a claim's records, end to end) against decode_stored one by one,
    damaged records among good ones. Catches: a header read at another record's offset, a
    payload cut at the wrong end, and a bad record that takes its neighbours with it."""
    stored = []
    for payload, hc, damage in rows:
        s = encode_stored(payload, hc, 3, partition=5, max_replays=2)
        s = {"none": s, "checksum": s[:-1] + bytes([s[-1] ^ 1]) if payload else s + b"x",
             "short": s[:-1], "trailing": s + b"zz", "cut_header": s[:10],
             "oversized": encode_stored(payload + b"o" * 301, hc, 3)}[damage]  # fmt: skip
        stored.append(s)
    ids = [(1000 + i, 7 + i) for i in range(len(stored))]
    got = decode_stored_many(b"".join(stored), [len(s) for s in stored],
                             [a for a, _ in ids], [b for _, b in ids], max_payload=300)  # fmt: skip
    assert len(got) == len(stored)
    for g, s, (src, cur) in zip(got, stored, ids, strict=True):
        try:
            want = decode_stored(s, src, cur, max_payload=300)
        except (ChecksumMismatchError, CorruptFrameError, OversizedFrameError,
                TruncatedFrameError) as e:  # fmt: skip
            assert type(g) is type(e) and str(g) == str(e)
        else:
            assert g == want and type(g) is type(want)


def test_decoding_many_refuses_lengths_that_do_not_add_up() -> None:
    s = encode_stored(b"abc", 1, 0)
    with pytest.raises(CorruptFrameError, match="bytes hold records of"):
        decode_stored_many(s + b"x", [len(s)], [1], [2])
