"""ftlayer.wire is the one owner of the layouts Python and the scripts share: every Lua
spelling it hands to the scripts is as wide as its Python twin (computed from its format
letters, and measured by Redis' own Lua ``struct``), no script spells a layout itself,
and the batch scope's task summary decodes to what was encoded."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ftlayer import EmbeddedRedis, wire
from ftlayer.limits import lua_constants
from serialization.stored import STORED_DTYPE, encode_stored

LUA_DIR = Path(wire.__file__).parent / "lua"
FIXED = {"b": 1, "B": 1, "h": 2, "H": 2, "l": 8, "L": 8, "T": 8, "f": 4, "d": 8, "x": 1}
"""Widths of the Lua struct library's fixed-size letters (Redis' build: 64-bit longs)."""


def lua_runs(fmt: str) -> list[int]:
    """The widths of a Lua struct format's fixed-size runs, cut at each variable-length
    field (``c0``: a string as long as the number before it): ``>Hc0I4`` -> [2, 4].
    ``i``/``I`` take their width (4 without one), ``c`` its length (1 without one); a
    letter or option this does not know fails, so a new one is taught here, not guessed."""
    assert fmt[:1] in ("<", ">"), f"{fmt!r}: no byte order first"
    tokens = re.findall(r"([A-Za-z])(\d*)", fmt[1:])
    assert "".join(a + n for a, n in tokens) == fmt[1:], f"{fmt!r}: not struct letters"
    runs = [0]
    for letter, digits in tokens:
        if letter in "iI":
            width = int(digits or 4)
            assert 1 <= width <= 8, f"{fmt!r}: {letter}{digits}"
        elif letter == "c":
            width = int(digits or 1)
            if width == 0:
                runs.append(0)
                continue
        else:
            assert letter in FIXED and not digits, f"{fmt!r}: {letter}{digits} unknown here"
            width = FIXED[letter]
        runs[-1] += width
    return runs


def lua_args(fmt: str) -> str:
    """Lua values packing one record of ``fmt``: 0 for numbers, a string of its length
    for ``c`` (the empty string for ``c0``)."""
    vals = [
        repr("x" * int(n or 1)) if a == "c" else "0"
        for a, n in re.findall(r"([A-Za-z])(\d*)", fmt[1:])
        if a != "x"
    ]
    return ", ".join(vals)


def span(dtype: np.dtype, first: str, last: str) -> int:
    """Bytes of ``dtype`` from field ``first``'s start to field ``last``'s end."""
    fields = dtype.fields
    assert fields is not None
    return int(fields[last][1]) + dtype[last].itemsize - int(fields[first][1])


def segment_bytes(failed: list[tuple[bytes, str, int]], pending: list[tuple[bytes, bytes]]) -> int:
    return len(wire.pack_segments([("m", 1, failed, pending, 0)], 1 << 10))


UNIT, ERR = b"u" * 9, "error"
HEAD = segment_bytes([], []) - len("m")
TWINS = {  # the name a script knows a layout by -> (its Python twin's width per fixed run)
    "ENTRY": [wire.ENTRY_BYTES],
    "ACK_VALUE": [np.dtype(">u8").itemsize],  # ack values and current ids: >u8 in Python
    "ID": [wire.PERSIST_DTYPE["source_id"].itemsize],
    "XOR": [wire.XOR_BYTES],
    "PERSIST_HEAD": [wire.PERSIST_HEAD.size],
    "FAIL_HEAD": [wire.FAIL_HEAD.size],
    "FAIL_PAYLOAD": [wire.FAIL_PAYLOAD.size],
    "QUEUE_ENTRY": [wire.QUEUE_ENTRY.itemsize],
    # what pack_segments writes: a member, then each distinct error text once, per failed
    # row a unit and its text's index, per pending row a unit; the fixed runs' widths are
    # its bytes less those strings'
    "SEGMENT": [HEAD],
    "SEGMENT_ERROR": [segment_bytes([(UNIT, ERR, 1), (UNIT, ERR.upper(), 1)], [])
                      - segment_bytes([(UNIT, ERR, 1), (UNIT, ERR, 1)], []) - len(ERR)],
    "SEGMENT_FAILED": [segment_bytes([(UNIT, ERR, 1), (UNIT, ERR, 1)], [])
                       - segment_bytes([(UNIT, ERR, 1)], []) - len(UNIT)],
    "SEGMENT_PENDING": [segment_bytes([], [(UNIT, b"v" * 8)]) - HEAD - 1 - len(UNIT)],
    "STORED_HEAD_FIELDS": [span(STORED_DTYPE, "payload_len", "max_replays")],
    "STORED_LEN": [STORED_DTYPE["payload_len"].itemsize,  # and the checksum (with_payload)
                   STORED_DTYPE["checksum"].itemsize],
    "STORED_QUEUE_FIELDS": [span(STORED_DTYPE, "hash_code", "source")],
    "STORED_U16": [STORED_DTYPE["source"].itemsize, STORED_DTYPE["max_replays"].itemsize],
}
"""A twin with several widths: a layout read at more than one place (each the same width)."""
VARIABLE = {"SEGMENT": 1, "SEGMENT_ERROR": 1, "SEGMENT_FAILED": 1, "SEGMENT_PENDING": 1}
"""Variable-length fields (c0) of a layout: its member; a text; a row's unit; its unit."""


def handed_to_lua() -> dict[str, str]:
    """Name -> format of every ``local NAME = '<format>'`` the scripts are given."""
    lines = re.findall(r"^local (\w+) = '([<>][^']*)'$", lua_constants(), flags=re.M)
    return dict(lines)


def test_each_lua_layout_is_as_wide_as_its_python_twin(redis_server: EmbeddedRedis) -> None:
    """Every layout the scripts are given, ACK_VALUE and the segment settlement's
    included, has a Python twin here, and its format letters make the twin's width in
    each fixed-size run (a c0 in a segment layout cuts a run): a width changed on one side
    only, a field added or dropped, a new layout without a twin all fail. Redis' struct
    measures each format too, so the letters' widths here are Redis' own."""
    handed = handed_to_lua()
    assert set(handed) == set(TWINS), "a layout given to the scripts without a twin here"
    client = redis_server.client()
    for name, fmt in handed.items():
        runs = lua_runs(fmt)
        assert len(runs) - 1 == VARIABLE.get(name, 0), (name, fmt, "variable fields")
        twin = TWINS[name]
        assert sum(runs) in twin and len(set(twin)) == 1, (name, fmt, runs, twin)
        measured = client.eval(f"return #struct.pack('{fmt}', {lua_args(fmt)})", 0)
        assert measured == sum(runs), (name, fmt, measured, runs)
    no_entry = client.eval(lua_constants() + "\nreturn #NO_ENTRY", 0)
    assert no_entry == wire.ENTRY_BYTES


PACKERS = ("struct.pack", "struct.unpack", "struct.size", "string.pack", "string.unpack",
           "string.packsize")  # fmt: skip
LOOKS_LIKE_A_FORMAT = re.compile(r"[<>!=]\d*(?:[bBhHlLTfdxsciIjJn]\d*)+")


def lua_strings(text: str) -> tuple[str, list[tuple[int, str]]]:
    """``text`` without its comments, and its string literals ('', "" and [[ ]] of any
    level) as (offset in that text, contents)."""
    out: list[str] = []
    found: list[tuple[int, str]] = []
    i = 0
    while i < len(text):
        long = re.compile(r"\[(=*)\[").match(text, i + 2 if text.startswith("--", i) else i)
        if text.startswith("--", i):
            if long:
                end = text.find(f"]{long.group(1)}]", long.end())
                i = len(text) if end < 0 else end + len(long.group(0))
            else:
                end = text.find("\n", i)
                i = len(text) if end < 0 else end
            out.append(" ")
        elif long:
            end = text.find(f"]{long.group(1)}]", long.end())
            end = len(text) if end < 0 else end
            found.append((len("".join(out)), text[long.end() : end]))
            out.append(text[i : end + len(long.group(0))])
            i = end + len(long.group(0))
        elif text[i] in "'\"":
            m = re.compile(rf"{text[i]}((?:\\.|[^\\{text[i]}\n])*){text[i]}").match(text, i)
            assert m, f"an unterminated string at {text[i : i + 40]!r}"
            found.append((len("".join(out)), m.group(1)))
            out.append(m.group(0))
            i = m.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out), found


def test_no_script_spells_a_layout_of_its_own() -> None:
    """No .lua file (the scripts and their core) holds a layout's format in a string of
    any quote style, nor a string that reads as a struct format, nor hands a literal
    format to a pack or unpack call (struct's, string's or a local alias of them): every
    format is one of wire's, given to every script by the prelude."""
    scripts = sorted(LUA_DIR.rglob("*.lua"))
    assert {p.parent.name for p in scripts} == {"lua", "core"}
    sources = {p.relative_to(LUA_DIR).as_posix(): lua_strings(p.read_text()) for p in scripts}
    packers = set(PACKERS)
    for code, _ in sources.values():  # aliases: sunpack, spack = struct.unpack, struct.pack
        for names, values in re.findall(r"([\w, ]+?)\s*=\s*([\w., ]+)", code):
            pairs = zip(names.split(","), values.split(","), strict=False)
            packers |= {n.strip().removeprefix("local ") for n, v in pairs if v.strip() in PACKERS}
    call = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, packers)) + r")\s*\(?\s*$")
    spelled = set(handed_to_lua().values())
    for name, (code, strings) in sources.items():
        for at, s in strings:
            line = code.count("\n", 0, at) + 1
            assert s not in spelled, f"{name}:{line} spells wire's layout {s!r}"
            assert not LOOKS_LIKE_A_FORMAT.fullmatch(s), f"{name}:{line} spells a layout {s!r}"
            caller = call.search(code, 0, at)
            assert caller is None, f"{name}:{line} {caller and caller.group(1)}({s!r}, ...)"
    prelude = lua_constants()
    for fmt in spelled:
        assert f"'{fmt}'" in prelude, fmt


def test_a_task_summary_decodes_to_what_was_encoded() -> None:
    s = wire.BatchSummary(
        stage=1, partition=3, attempt=2, token=0xABCDEF, fold=-5, fresh=10, replayed=2,
        written=9, segment="0:b:3:ab", segment_rows=10, immediate_replays=1,
        failed_src=np.array([1, 2**64 - 1], np.uint64), failed_err=["e1", "e1"],
        failed_att=np.array([1, 3], np.uint16), failed_stage=["map[0.0] f", "sink[1.0] g"],
        unc_src=np.array([7], np.uint64), rep_src=np.array([8, 9], np.uint64),
        rep_cur=np.array([10, 11], np.uint64), rep_key=np.array([12, 13], np.uint64),
        upstream=[4, 5], counts={"map[0.0] f": [10, 9, 1, 0, 0, 5, 1]}, errors=["e1"],
    )  # fmt: skip
    back = wire.BatchSummary.decode(s.encode())
    assert back.fold == (-5) % (1 << 64)
    for name in ("failed_src", "failed_att", "unc_src", "rep_src", "rep_cur", "rep_key"):
        assert np.array_equal(getattr(back, name), getattr(s, name)), name
    for name in ("stage", "partition", "attempt", "token", "fresh", "replayed", "written",
                 "segment", "segment_rows", "immediate_replays", "failed_err", "failed_stage",
                 "upstream", "counts", "errors"):  # fmt: skip
        assert getattr(back, name) == getattr(s, name), name
    assert back.key == (1, 3)
    empty = wire.BatchSummary.decode(wire.BatchSummary(stage=0, partition=0).encode())
    assert len(empty.failed_src) == 0 and empty.failed_err == [] and empty.segment is None


def test_the_scripts_read_a_stored_record_where_python_wrote_it(
    redis_server: EmbeddedRedis,
) -> None:
    """The STORED_* constants the scripts read a stored record with are generated from
    serialization.stored's layout: every field reads back as encoded (a shifted offset or
    a wrong width reads another field's bytes)."""
    stored = encode_stored(b"payload", -123456, 513, partition=7, max_replays=300)
    script = lua_constants() + (
        "local s = ARGV[1]\n"
        "local n, hc, part, src, budget = struct.unpack(STORED_HEAD_FIELDS, s, 1)\n"
        "local qhc, qpart, qsrc = struct.unpack(STORED_QUEUE_FIELDS, s, STORED_QUEUE_AT)\n"
        "return {STORED_HEAD + n, hc, part, src, budget, qhc, qpart, qsrc,\n"
        "        (struct.unpack(STORED_U16, s, STORED_SOURCE_AT)),\n"
        "        (struct.unpack(STORED_U16, s, STORED_BUDGET_AT)),\n"
        "        STORED_HEAD + (struct.unpack(STORED_LEN, s, 1))}\n"
    )
    got = redis_server.client().eval(script, 0, stored)
    assert got == [len(stored), -123456, 7, 513, 300, -123456, 7, 513, 513, 300, len(stored)]
