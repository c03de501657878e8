"""One owner of every binary and msgpack layout that crosses between processes: Python and
the Lua scripts, executors and the driver.

* Layouts the scripts read or write are spelled here twice, once for Python (``struct`` or
  a numpy dtype) and once in the Lua ``struct`` library's syntax (``*_LUA``), side by side;
  :func:`lua_constants` hands the Lua spellings to every script (no script spells them),
  and ``tests/test_wire.py`` checks that each pair has the same width.
* The batch scope's task summary is :class:`BatchSummary`, encoded by the executor task
  that ran it and decoded by the driver with the same class.

The stored record itself (what a bucket's frames hold) is ``serialization.stored``'s; the
offsets and formats the scripts read it with are generated here from its dtype.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from serialization.stored import STORED_DTYPE, STORED_HEADER_SIZE

__all__ = [
    "ACK_VALUE_LUA", "ENTRY_BYTES", "ENTRY_LUA", "FAIL_HEAD", "FAIL_HEAD_LUA", "ID_LUA",
    "NOFRAME", "PERSIST_DTYPE", "PERSIST_HEAD", "PERSIST_HEAD_LUA", "QUEUE_ENTRY",
    "QUEUE_ENTRY_LUA", "REASON_CODES", "SEGMENT_ERROR_LUA", "SEGMENT_FAILED_LUA", "SEGMENT_LUA",
    "SEGMENT_PENDING_LUA", "STORED_HEAD_LUA", "STORED_LEN_LUA", "STORED_QUEUE_LUA",
    "STORED_U16_LUA", "XOR_BYTES", "XOR_LUA", "BatchSummary", "SegmentEntry", "lua_constants",
    "pack_segments",
]  # fmt: skip

# -- ack entries (one per pending record, 26 bytes in its bucket's entries string) ---------
ENTRY_LUA = ">i4i4I6I6I4H"
"""ack value hi, lo | deadline ms | inited ms | 1 + frame offset (0: none) | source index."""
ENTRY_BYTES = 26
NOFRAME = 0xFFFF_FFFF
"""The frame offset of an entry without a stored record (made by an XOR before its init)."""

ACK_VALUE_LUA = ">i4i4"
"""An 8-byte ack value (or current id) as an entry holds it: its hi and lo halves."""

# -- ids as the scripts split them, without making strings -------------------------------
ID_LUA = ">I5BI2"
"""A source id: bucket hi (bytes 1..5), slot (byte 6), bucket lo (bytes 7..8)."""

# -- a flush's xors argument: per source id touched, its delta -----------------------------
XOR_BYTES = 16
XOR_LUA = ">I5BI2i4i4"
"""Source id (as ID_LUA), then the delta's hi and lo halves."""

# -- a flush's persists argument: per record, then its stored record --------------------
PERSIST_HEAD = struct.Struct(">QQI")
PERSIST_DTYPE = np.dtype([("delta", ">u8"), ("source_id", ">u8"), ("stored_len", ">u4")])
"""Its delta, source id and stored length (the same as PERSIST_HEAD, for numpy)."""

PERSIST_HEAD_LUA = ">i4i4I5BI2I4"
"""PERSIST_HEAD as the scripts read it: the delta's halves, the id split (ID_LUA), the length."""

# -- failures: a flush's or a fail call's fails argument --------------------------------
FAIL_HEAD = struct.Struct(">QBH")
FAIL_HEAD_LUA = ">c8BI2"
"""Source id, reason code, error length; then the error's bytes."""
REASON_CODES = {"explicit": 1, "timeout": 2, "dead_letter": 3, "held": 4}
"""``dead_letter``: an explicit failure that no replay can fix (dead-lettered now);
``held``: not attempted (its stage's breaker was open): queued again, no attempt spent."""
NEW_PAYLOAD = 0x80
"""Set in a reason code: the error is followed by FAIL_PAYLOAD and a new payload that the
record is stored with from now on (its header and lineage id kept): a replay read back
from its source that failed again, kept as the input of the stage it failed in
(ftlayer.stage_rows)."""
FAIL_PAYLOAD = struct.Struct(">II")
FAIL_PAYLOAD_LUA = ">I4I4"
"""The new payload's length and checksum (xxh32, as serialization/stored.py)."""

# -- a replay queue entry ----------------------------------------------------------------
QUEUE_ENTRY = np.dtype([("source_id", ">u8"), ("hash_code", ">i4"), ("partition", ">i4"),
                        ("attempts", ">u2")])  # fmt: skip
QUEUE_ENTRY_LUA = ">I5BI2i4i4I2"
"""New id (as ID_LUA), hash code, original partition, failed attempts."""


# -- the stored record as the scripts read it in place (serialization.stored owns it) ---------
def _lua_fields(dtype: np.dtype, names: tuple[str, ...]) -> str:
    """The Lua ``struct`` format of consecutive fields ``names`` of a big-endian dtype."""
    kinds = {"u": "I", "i": "i"}
    return ">" + "".join(kinds[dtype[n].kind] + str(dtype[n].itemsize) for n in names)


def _lua_at(dtype: np.dtype, name: str) -> int:
    """The 1-based position of field ``name`` (Lua's string positions)."""
    fields = dtype.fields
    assert fields is not None
    return 1 + int(fields[name][1])


STORED_HEAD_LUA = _lua_fields(
    STORED_DTYPE, ("payload_len", "hash_code", "partition", "source", "max_replays")
)
"""Its length, hash code, partition, source index and replay budget, read from its start."""
STORED_LEN_LUA = _lua_fields(STORED_DTYPE, ("payload_len",))
"""Its payload length alone, read from its start."""
STORED_QUEUE_LUA = _lua_fields(STORED_DTYPE, ("hash_code", "partition", "source"))
"""What its replay queue entry carries (and which queue), read at STORED_QUEUE_AT."""
STORED_U16_LUA = _lua_fields(STORED_DTYPE, ("source",))
"""A u16 field of it (source, max_replays), read at STORED_SOURCE_AT / STORED_BUDGET_AT."""
assert STORED_U16_LUA == _lua_fields(STORED_DTYPE, ("max_replays",))


def _stored_constants() -> list[str]:
    at = {"QUEUE": "hash_code", "SOURCE": "source", "BUDGET": "max_replays",
          "CHECKSUM": "checksum"}
    return [
        f"local STORED_HEAD = {STORED_HEADER_SIZE}",
        f"local STORED_HEAD_FIELDS = '{STORED_HEAD_LUA}'",
        f"local STORED_LEN = '{STORED_LEN_LUA}'",
        f"local STORED_QUEUE_FIELDS = '{STORED_QUEUE_LUA}'",
        f"local STORED_U16 = '{STORED_U16_LUA}'",
    ] + [f"local STORED_{k}_AT = {_lua_at(STORED_DTYPE, f)}" for k, f in at.items()]


# -- a settlement's segments argument (lua/segment_settle.lua) ------------------------------
SegmentEntry = tuple[str, int, list[tuple[bytes, str, int]], list[tuple[bytes, bytes]], int]
"""(member, rows, failed rows as (unit, error, attempts used), pending rows as (unit, ack
value), failed attempts its task replayed at once); a unit is a source id then a stored
record."""
SEGMENT_LUA = ">Hc0I4I4I4I4I4"
"""A segment: its member (u16 length, bytes), rows, failed, pending, replayed at once, and
how many distinct error texts its failed rows have."""
SEGMENT_ERROR_LUA = ">Hc0"
"""Each distinct error text of a segment's failed rows (u16 length), once: rows that fail
alike (a downstream that is down) send their text once, not once a row."""
SEGMENT_FAILED_LUA = ">I4c0I2I4"
"""Each failed row: its unit (u32 length, bytes), attempts used, its error's index among
the segment's error texts (from 0)."""
SEGMENT_PENDING_LUA = ">I4c0c8"
"""Each pending row: its unit (u32 length, bytes), its ack value (8 bytes)."""
_U32, _U16 = struct.Struct(">I"), struct.Struct(">H")
_SEGMENT_COUNTS, _FAILED_TAIL = struct.Struct(">IIIII"), struct.Struct(">HI")


def pack_segments(segments: list[SegmentEntry], max_error: int) -> bytes:
    """The segments argument of lua/segment_settle.lua (errors cut to ``max_error`` bytes,
    each distinct text of a segment sent once)."""
    out: list[bytes] = []
    for member, rows, failed, pending, immediate in segments:
        m = member.encode()
        texts: dict[str, int] = {}  # each distinct text encoded once, not once a row
        index = [texts.setdefault(err, len(texts)) for _, err, _ in failed]
        counts = _SEGMENT_COUNTS.pack(rows, len(failed), len(pending), immediate, len(texts))
        out.append(_U16.pack(len(m)) + m + counts)
        for text in texts:
            e = text.encode("utf-8", "replace")[:max_error]
            out += (_U16.pack(len(e)), e)
        for (unit, _, attempts), i in zip(failed, index, strict=True):
            out += (_U32.pack(len(unit)), unit, _FAILED_TAIL.pack(attempts, i))
        for unit, value in pending:
            out += (_U32.pack(len(unit)), unit, value)
    return b"".join(out)


def lua_constants() -> list[str]:
    """``local NAME = value`` lines of these layouts for the scripts' core."""
    zeros = "\\0" * ENTRY_BYTES
    reasons = ", ".join(f"[{code}] = '{'explicit' if name == 'dead_letter' else name}'"
                        for name, code in REASON_CODES.items())  # fmt: skip
    return [
        f"local ENTRY = '{ENTRY_LUA}'",
        f"local ACK_VALUE = '{ACK_VALUE_LUA}'",
        f"local ENTRY_BYTES = {ENTRY_BYTES}",
        f"local NO_ENTRY = '{zeros}'",
        f"local NOFRAME = {NOFRAME}",
        f"local ID = '{ID_LUA}'",
        f"local XOR = '{XOR_LUA}'",
        f"local FAIL_HEAD = '{FAIL_HEAD_LUA}'",
        f"local REASONS = {{{reasons}}}",
        f"local DEAD_LETTER_CODE = {REASON_CODES['dead_letter']}",
        f"local NEW_PAYLOAD = {NEW_PAYLOAD}",
        f"local FAIL_PAYLOAD = '{FAIL_PAYLOAD_LUA}'",
        f"local QUEUE_ENTRY = '{QUEUE_ENTRY_LUA}'",
        f"local PERSIST_HEAD = '{PERSIST_HEAD_LUA}'",
        f"local SEGMENT = '{SEGMENT_LUA}'",
        f"local SEGMENT_ERROR = '{SEGMENT_ERROR_LUA}'",
        f"local SEGMENT_FAILED = '{SEGMENT_FAILED_LUA}'",
        f"local SEGMENT_PENDING = '{SEGMENT_PENDING_LUA}'",
        *_stored_constants(),
    ]


# -- the batch scope's task summary --------------------------------------------------------
_U8 = ">u8"


def _ids() -> np.ndarray:
    return np.zeros(0, np.uint64)


@dataclass
class BatchSummary:
    """What one task attempt of a batch-scope job did (ftlayer.spark.vector_tasks writes it,
    ftlayer.spark.batch_scope reads it): its place, its fold, its counts, its residues.

    ``failed_*`` are aligned: each failed row's source id (a record key past a shuffle with
    ``record_key``), its error text, the attempts it used (with the DEAD_NOW bit: dead-letter
    it now) and the label of the stage it failed in. ``counts``: stage label -> rows in,
    rows out, failed, unconfirmed, extra calls, microseconds, failed rows replayed at once
    (ftlayer.spark.results.StageCounts). ``upstream``: the tokens of the summaries of the
    tasks before a shuffle whose rows this task consumed. ``rep_src``/``rep_cur``: the
    replays a source task ran (their current ids); past a shuffle, the stored ids it
    received (current ids 0: the driver knows those of the replays that entered there).
    """

    stage: int
    partition: int
    attempt: int = 0
    token: int = 0
    fold: int = 0
    fresh: int = 0
    replayed: int = 0
    written: int = 0
    segment: str | None = None
    segment_rows: int = 0
    immediate_replays: int = 0
    failed_src: np.ndarray = field(default_factory=_ids)
    failed_err: list[str] = field(default_factory=list)
    failed_att: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint16))
    failed_stage: list[str] = field(default_factory=list)
    unc_src: np.ndarray = field(default_factory=_ids)
    rep_src: np.ndarray = field(default_factory=_ids)
    rep_cur: np.ndarray = field(default_factory=_ids)
    rep_key: np.ndarray = field(default_factory=_ids)
    upstream: list[int] = field(default_factory=list)
    counts: dict[str, list[int]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    kept_src: np.ndarray = field(default_factory=_ids)
    kept_body: list[bytes] = field(default_factory=list)
    """Failed rows kept as this task's segment input (aligned: their source ids, their
    rows as msgpack maps): their replays enter there (ftlayer.stage_rows)."""

    @property
    def key(self) -> tuple[int, int]:
        """(stage, partition): one attempt of each task may count."""
        return self.stage, self.partition

    def encode(self) -> bytes:
        """msgpack: ids as big-endian byte strings, texts and labels once each."""
        texts: dict[str, int] = {}
        labels: dict[str, int] = {}
        err = [texts.setdefault(e, len(texts)) for e in self.failed_err]
        lbl = [labels.setdefault(e, len(labels)) for e in self.failed_stage]
        return msgpack.packb({
            "stage": self.stage, "partition": self.partition, "attempt": self.attempt,
            "token": self.token, "fold": self.fold % (1 << 64), "fresh": self.fresh,
            "replayed": self.replayed, "written": self.written, "segment": self.segment,
            "segment_rows": self.segment_rows, "immediate_replays": self.immediate_replays,
            "failed_src": _pack_ids(self.failed_src),
            "failed_err": np.asarray(err, ">u4").tobytes(), "texts": list(texts),
            "failed_att": np.asarray(self.failed_att, ">u2").tobytes(),
            "failed_stage": np.asarray(lbl, ">u2").tobytes(), "labels": list(labels),
            "unc_src": _pack_ids(self.unc_src), "rep_src": _pack_ids(self.rep_src),
            "rep_cur": _pack_ids(self.rep_cur), "rep_key": _pack_ids(self.rep_key),
            "upstream": self.upstream, "counts": self.counts, "errors": self.errors,
            "kept_src": _pack_ids(self.kept_src), "kept_body": self.kept_body,
        }, use_bin_type=True)  # fmt: skip

    @classmethod
    def decode(cls, raw: bytes) -> BatchSummary:
        d: dict[str, Any] = msgpack.unpackb(raw, raw=False)
        texts, labels = d["texts"], d["labels"]
        return cls(
            stage=d["stage"], partition=d["partition"], attempt=d["attempt"],
            token=d["token"], fold=d["fold"], fresh=d["fresh"], replayed=d["replayed"],
            written=d["written"], segment=d["segment"], segment_rows=d["segment_rows"],
            immediate_replays=d["immediate_replays"],
            failed_src=_unpack_ids(d["failed_src"]),
            failed_err=[texts[i] for i in np.frombuffer(d["failed_err"], ">u4").tolist()],
            failed_att=np.frombuffer(d["failed_att"], ">u2").astype(np.uint16),
            failed_stage=[labels[i] for i in np.frombuffer(d["failed_stage"], ">u2").tolist()],
            unc_src=_unpack_ids(d["unc_src"]), rep_src=_unpack_ids(d["rep_src"]),
            rep_cur=_unpack_ids(d["rep_cur"]), rep_key=_unpack_ids(d["rep_key"]),
            upstream=d["upstream"], counts=d["counts"], errors=d["errors"],
            kept_src=_unpack_ids(d.get("kept_src", b"")), kept_body=d.get("kept_body", []),
        )  # fmt: skip


def _pack_ids(ids: np.ndarray) -> bytes:
    return np.asarray(ids, np.uint64).astype(_U8).tobytes()


def _unpack_ids(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, _U8).astype(np.uint64)
