"""ftlayer.gc_pause: the cyclic collector held off for ftlayer's code, on for the user's,
left as it was found. (A batch's use of it: tests/spark/test_dataframe_stages.py.)"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from ftlayer import gc_pause


@pytest.fixture(autouse=True)
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    assert gc.isenabled(), "a test left the collector off"
    if not was:
        gc.disable()


def test_paused_blocks_nest_and_the_collector_comes_back_after_the_last() -> None:
    """Catches: the inner block's end turning collection back on under the outer one, or
    the outer one's end leaving it off."""
    with gc_pause.paused():
        assert not gc.isenabled()
        with gc_pause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_user_code_inside_a_paused_block_runs_with_the_collector_on() -> None:
    """Catches: a sink's function run with collection off (its cycles never freed), or
    the pause not coming back once it returns."""
    with gc_pause.paused():
        with gc_pause.resumed():
            assert gc.isenabled()
            with gc_pause.paused():  # ftlayer's code called from the user's
                assert gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_exception_leaves_the_collector_as_it_was() -> None:
    with pytest.raises(RuntimeError), gc_pause.paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
    with gc_pause.paused():
        with pytest.raises(RuntimeError), gc_pause.resumed():
            raise RuntimeError("boom")
        assert not gc.isenabled()


def test_a_process_that_disabled_the_collector_keeps_it_disabled() -> None:
    """Catches: ftlayer turning on what the application turned off."""
    gc.disable()
    try:
        with gc_pause.paused():
            with gc_pause.resumed():
                assert not gc.isenabled()
        assert not gc.isenabled()
        with gc_pause.resumed():  # outside any pause: not touched
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_blocks_in_two_threads_keep_it_off_until_both_ended() -> None:
    """Two batches at once (two queries in one driver): the first to end must not turn
    collection back on under the other."""
    entered, first_done, second_may_end = (threading.Event() for _ in range(3))
    seen: list[bool] = []

    def second() -> None:
        with gc_pause.paused():
            entered.set()
            first_done.wait(5)
            seen.append(gc.isenabled())
            second_may_end.wait(5)

    t = threading.Thread(target=second)
    t.start()
    entered.wait(5)
    with gc_pause.paused():
        pass
    first_done.set()
    while not seen:
        threading.Event().wait(0.01)
    assert seen == [False]
    assert not gc.isenabled()
    second_may_end.set()
    t.join(5)
    assert gc.isenabled()
