"""The limits of ftlayer's encodings, in one place.

Python validates every setting against them when it is built (``FTConfig``, ``pipeline``)
and the Lua scripts get the same values as constants: ``lua_constants()`` is prepended to
every shard script (ftlayer.scripts), so a script never spells a number that Python
checks elsewhere. A value that does not fit its encoding is refused up front, never
truncated when it is written.
"""

from __future__ import annotations

from ftlayer import wire

__all__ = [
    "BUCKET_MAX_BYTES",
    "BUCKET_SLOTS",
    "CLAIM_TOKEN_TTL_MS",
    "FLUSH_TOKEN_TTL_MS",
    "MAX_ARGUMENT_BYTES",
    "MAX_ERROR_BYTES",
    "MAX_RECORD_BYTES",
    "MAX_REPLAYS",
    "MAX_SHARDS",
    "MAX_SOURCE",
    "DEAD_NOW",
    "DLQ_LOG_MAX",
    "SEGMENT_DONE_TTL_MS",
    "UNKNOWN_SOURCE",
    "lua_constants",
]

MAX_REPLAYS = 0x7FFF
"""A record's replay budget travels in 16 bits (the frame header, segment residues); the
top bit of a residue's attempt count is DEAD_NOW."""
DEAD_NOW = 0x8000
"""Set in a residue's attempt count: dead-letter it at settlement whatever its budget
(an exception type of ``ErrorPolicy.dead_letter_on``, ``Outcome.dead_letter``)."""
DLQ_LOG_MAX = 100_000
"""Entries kept (about) in each shard's dead-letter log, the stream ``on_dead_letter``
callbacks read (the dead letters themselves are kept until purged or re-driven)."""
BUCKET_SLOTS = 128
"""Records per bucket of the storage layout: a source id's byte 6 (bits 16..23) is its slot
in its bucket (ftlayer/ids.py, lua/core/ids.lua). Redis keeps a hash of up to 128 small
fields as a listpack (``hash-max-listpack-entries``), a few bytes per field."""
BUCKET_MAX_BYTES = 1_000_000
"""A bucket takes no more records once its frames reach this size (a record larger than it
gets a bucket of its own): a bucket's frames are one Redis string, which cannot outgrow
the server's ``proto-max-bulk-len`` (1 MB at the least)."""
UNKNOWN_SOURCE = 0xFFFF
"""The source index of an acker entry made by an XOR before its init."""
MAX_SOURCE = UNKNOWN_SOURCE - 1
"""Source indices are 16 bits in the frame; the top value is reserved (UNKNOWN_SOURCE)."""
MAX_SHARDS = 0x10000
"""A RecordId picks its shard with its low 16 bits."""
MAX_ARGUMENT_BYTES = 512 << 20
"""Redis's default ``proto-max-bulk-len``: the largest argument of a command."""
MAX_RECORD_BYTES = MAX_ARGUMENT_BYTES - 1024
"""A record's payload, its frame header and its entry head must fit in one argument."""
MAX_ERROR_BYTES = 2000
"""Bytes of error text kept per entry of a record's failure history."""
FLUSH_TOKEN_TTL_MS = 600_000
"""How long Redis remembers a flush token: a retried flush within it is never re-applied."""
CLAIM_TOKEN_TTL_MS = 60_000
"""How long Redis keeps a claim's reply under its token: a retried claim (redis-py retries
a call whose reply was lost) gets the same records instead of popping more."""
STREAM_TOKEN_TTL_MS = 7 * 86_400_000
"""How long Redis keeps what one offset of the replay stream claimed (ftlayer.spark.
replay_stream): Spark commits it with its batch (then it is deleted); a query stopped for
longer restarts without it and those records replay once more after their timeout."""
SEGMENT_DONE_TTL_MS = 3_600_000
"""How long Redis remembers that a batch settled (a late attempt then stores nothing)."""

_LUA = ("MAX_REPLAYS", "UNKNOWN_SOURCE", "MAX_ERROR_BYTES", "FLUSH_TOKEN_TTL_MS",
        "CLAIM_TOKEN_TTL_MS", "SEGMENT_DONE_TTL_MS", "DEAD_NOW", "DLQ_LOG_MAX", "BUCKET_SLOTS",
        "BUCKET_MAX_BYTES")  # fmt: skip


LATENCY_BOUNDS_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000)
"""Upper bounds of the completion-latency histogram (its counters ``latency_le_<bound>``)."""


def _lua_list(values: tuple[object, ...]) -> str:
    return "{" + ", ".join(repr(v) for v in values) + "}"


def lua_constants() -> str:
    """``local NAME = value`` lines for the scripts' core: these limits and ftlayer.wire's
    layouts. The histogram's counter names are spelled out, so a script converts no
    number to a string to count a latency."""
    lines = [f"local {name} = {globals()[name]}" for name in _LUA] + wire.lua_constants()
    lines.append(f"local LATENCY_BOUNDS_MS = {_lua_list(LATENCY_BOUNDS_MS)}")
    names = tuple(f"latency_le_{b}" for b in LATENCY_BOUNDS_MS)
    lines.append(f"local LATENCY_NAMES = {_lua_list(names)}")
    return "\n".join(lines) + "\n"
