"""Python's cyclic garbage collector held off while ftlayer's driver code builds and
settles a batch.

A batch with thousands of failed rows makes tens of thousands of short-lived tuples and
dicts (one per failed row: its identity, its error, its stage row). They live until the
batch settles, so they survive the young generations and make CPython run full
collections, each a pass over every object of the driver (PySpark's and py4j's among
them): about 40 ms each with 2,500 failed rows, 200-260 ms with 50,000
(benchmarks.dataframe_overhead, ``df_ft_on_failing_late``). None of those objects are in
cycles -- reference counting frees them when the batch ends -- so the collections find
nothing. Mercurial's ``util.nogc`` does the same for the same reason.

:func:`paused` holds collection off for a block of ftlayer's own code; :func:`resumed`
lets it run again inside such a block while code that is not ftlayer's runs (a sink's
function, which may make cycles of its own).

Invariants: collection runs whenever no thread is inside :func:`paused`, or some thread
is inside :func:`resumed` (a sink's function, a DataFrame stage's function and the wait
for a batch's Spark job run with it on, as does a wait for room under ``max_pending``);
the collector is left as it was found (a process that disabled it keeps it disabled).
Blocks nest and may run in several threads at once.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["paused", "resumed"]

_lock = threading.Lock()
_paused = 0
"""Blocks inside :func:`paused`, in every thread."""
_resumed = 0
"""Blocks inside :func:`resumed` within them."""
_was_enabled = False
"""Whether collection was on when the first of the current :func:`paused` blocks began."""


def _apply() -> None:
    """Collection on or off as the counts say (under ``_lock``; outside every
    :func:`paused` block the collector is not touched but when the last one ends)."""
    if not _was_enabled:
        return
    if _paused and not _resumed:
        gc.disable()
    else:
        gc.enable()


@contextmanager
def paused() -> Iterator[None]:
    """Hold off cyclic collection while the block runs (ftlayer's code only)."""
    global _paused, _was_enabled
    with _lock:
        if not _paused:
            _was_enabled = gc.isenabled()
        _paused += 1
        _apply()
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            _apply()


@contextmanager
def resumed() -> Iterator[None]:
    """Let cyclic collection run while the block runs, inside :func:`paused` or not."""
    global _resumed
    with _lock:
        _resumed += 1
        if _paused:
            _apply()
    try:
        yield
    finally:
        with _lock:
            _resumed -= 1
            if _paused:
                _apply()
