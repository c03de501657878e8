from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ftlayer import RotatingHashMap


def test_entries_expire_after_buckets_minus_one_to_buckets_rotations() -> None:
    expired: list[tuple[str, int]] = []
    m: RotatingHashMap[str, int] = RotatingHashMap(3, lambda k, v: expired.append((k, v)))
    m.put("a", 1)
    assert m.rotate() == {} and m.rotate() == {}
    assert "a" in m and m.get("a") == 1
    assert m.rotate() == {"a": 1} and expired == [("a", 1)]
    assert "a" not in m and len(m) == 0


def test_put_refreshes_and_remove_prevents_expiry() -> None:
    m: RotatingHashMap[str, int] = RotatingHashMap(2)
    m.put("a", 1)
    m.put("b", 2)
    m.rotate()
    m.put("a", 3)  # refreshed into the newest bucket
    assert m.remove("b") == 2
    assert m.rotate() == {}
    assert m.rotate() == {"a": 3}


@given(st.integers(2, 6), st.lists(st.integers(0, 20), max_size=30))
def test_lifetime_in_rotations(buckets: int, puts: list[int]) -> None:
    """An entry put at rotation r (never refreshed) expires at rotation r + buckets."""
    m: RotatingHashMap[int, int] = RotatingHashMap(buckets)
    first_put = {}
    for r in range(25):
        for key in [p for p in puts if p == r]:
            if key not in m and key not in first_put:
                m.put(key, r)
                first_put[key] = r
        for key in m.rotate():
            assert r + 1 - first_put[key] == buckets


def test_needs_two_buckets() -> None:
    with pytest.raises(ValueError):
        RotatingHashMap(1)
