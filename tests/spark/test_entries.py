"""Entries of a batch plan (ftlayer.spark.entries): one before every segment, each with a
fingerprint of the pipeline up to it. Every pipeline's batches run through ``walk`` (the
whole Spark suite); here, what the plan says about them.

Each test names, in its docstring, the product breaks it catches.
"""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa

from ftlayer.spark.entries import plan_entries
from ftlayer.spark.plan import BatchStage, FrameStage, Segment

IN = pa.schema([pa.field("id", pa.int64()), pa.field("key", pa.int64())])
MID = pa.schema([pa.field("id", pa.int64()), pa.field("key", pa.int64()),
                 pa.field("x", pa.float64())])  # fmt: skip


def price(b: pa.RecordBatch) -> pa.RecordBatch:
    return b


def tax(b: pa.RecordBatch) -> pa.RecordBatch:
    return b


def segments(first: object = price, schema: str = "id long, key long, x double") -> tuple:
    return (
        Segment((("batches", BatchStage(first, schema)),), ("key",), 4),
        Segment((("batches", BatchStage(tax, schema)),), ("id",), 2),
        Segment((), sink=print, sink_per="batch"),
    )


def test_an_entry_before_every_segment_says_how_its_rows_are_named() -> None:
    """Three segments (two shuffles): three entries, in order, with the user columns
    entering each and how the rows are named there (source ids; a record key past a
    shuffle; identity columns through DataFrame stages). Catches: a segment without an
    entry (a row kept for it would have nowhere to enter), an entry given another
    segment's schema."""
    entries = plan_entries(segments(), (IN, MID, MID), False, None)
    assert [e.segment for e in entries] == [0, 1, 2]
    assert [e.schema for e in entries] == [IN, MID, MID]
    assert {e.identity for e in entries} == {"ids"} and {e.kind for e in entries} == {"python"}
    keyed = plan_entries(segments(), (IN, MID, MID), False, "id")
    assert [e.identity for e in keyed] == ["ids", "key", "key"]
    frames = plan_entries(segments(), (IN,), True, None)
    assert [e.schema for e in frames] == [IN, None, None]
    assert {e.identity for e in frames} == {"columns"} and {e.kind for e in frames} == {"frame"}


def test_a_fingerprint_names_the_pipeline_up_to_its_entry() -> None:
    """An entry's fingerprint is the same for the same pipeline, and changes when a stage
    before it changes (another function, another declared output), when a shuffle before
    it changes, or when its input schema does; a change after it leaves it alone. Catches:
    a row kept by another version of the pipeline entering where it no longer fits, or a
    row refused after a change that does not concern it."""

    def prints(plan: tuple) -> list[int]:
        return [e.fingerprint() for e in plan_entries(plan, (IN, MID, MID), False, None)]

    base = prints(segments())
    assert base == prints(segments()) and len(set(base)) == 3
    other_fn = prints(segments(first=tax))
    assert other_fn[0] == base[0] and other_fn[1] != base[1] and other_fn[2] != base[2]
    other_out = prints(segments(schema="id long, key long, x float"))
    assert other_out[0] == base[0] and other_out[1] != base[1]
    reshuffled = list(segments())
    reshuffled[0] = Segment(reshuffled[0].ops, ("key",), 8)
    assert prints(tuple(reshuffled))[1] != base[1]
    wider = pa.schema([*MID, pa.field("y", pa.string())])
    moved = [e.fingerprint() for e in plan_entries(segments(), (IN, wider, MID), False, None)]
    assert moved[1] != base[1] and moved[0] == base[0]
    # DataFrame stages: the schema Spark's analysis gives completes the fingerprint
    frame = (Segment((("frame", FrameStage(price)),), ("key",), 4), Segment((), sink=print))
    entry = plan_entries(frame, (IN,), True, None)[1]
    assert entry.fingerprint(MID) == entry.fingerprint(MID) != entry.fingerprint(wider)


def test_a_fingerprint_is_the_same_in_every_process() -> None:
    """The fingerprint computed in another Python process (another hash seed) is the same.
    Catches: a fingerprint made with Python's salted ``hash`` -- every row kept by one
    driver refused by the next."""
    code = (
        "from tests.spark.test_entries import IN, MID, segments\n"
        "from ftlayer.spark.entries import plan_entries\n"
        "print([e.fingerprint() for e in plan_entries(segments(), (IN, MID, MID), False, None)])"
    )
    here = [e.fingerprint() for e in plan_entries(segments(), (IN, MID, MID), False, None)]
    for seed in ("1", "2"):
        got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, env={"PYTHONHASHSEED": seed, "PATH": ""})  # fmt: skip
        assert got.stdout.strip() == str(here)
