"""serialization.many against the per-record frame: the same bytes for every record."""

from __future__ import annotations

import os

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from serialization import decode_frame, encode_frame
from serialization.errors import CorruptFrameError, OversizedFrameError
from serialization.many import encode_frames, xxh32_28


def test_xxh32_of_rows_is_the_librarys() -> None:
    """Catches: a wrong prime, rotation or lane order, or big-endian words."""
    rows = np.frombuffer(os.urandom(28 * 2000), np.uint8).reshape(-1, 28)
    got = xxh32_28(rows).tolist()
    assert got == [xxhash.xxh32_intdigest(r.tobytes()) for r in rows]


records = st.lists(
    st.tuples(st.binary(max_size=300), st.integers(0, 2**64 - 1), st.integers(1, 2**64 - 1),
              st.integers(-(2**31), 2**31 - 1), st.integers(-1, 2**31 - 1)),
    min_size=1, max_size=30,
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(records, st.integers(0, 2**16 - 1), st.integers(0, 2**16 - 1))
def test_headers_are_the_per_record_headers(rows: list, source: int, budget: int) -> None:
    """Catches: any field at the wrong place, width or byte order, and a header check that
    the decoder would refuse."""
    payloads = [r[0] for r in rows]
    src = np.array([r[1] for r in rows], np.uint64)
    cur = np.array([r[2] for r in rows], np.uint64)
    hcs = np.array([r[3] for r in rows], np.int64)
    parts = np.array([r[4] for r in rows], np.int64)
    heads = encode_frames(payloads, src, cur, hcs, source, partitions=parts, max_replays=budget)
    for head, (p, s, c, h, part) in zip(heads.view("V48").tolist(), rows, strict=True):
        want = encode_frame(p, s, c, h, source, partition=part, max_replays=budget)
        assert head + p == want
        assert decode_frame(head + p).payload == p


def test_bad_fields_name_the_record() -> None:
    ids = np.arange(1, 4, dtype=np.uint64)
    with pytest.raises(OversizedFrameError, match="payload 1 of 11 bytes") as e:
        encode_frames([b"a", b"b" * 11, b"c"], ids, ids, 0, 0, max_payload=10)
    assert e.value.record and "src=0000000000000002" in e.value.record
    with pytest.raises(CorruptFrameError, match="record 2: hash_code 2147483648"):
        encode_frames([b"a"] * 3, ids, ids, np.array([0, 0, 2**31]), 0)
