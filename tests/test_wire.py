"""ftlayer.wire is the one owner of the layouts Python and the scripts share: each Lua
spelling has its Python twin's width (measured by Redis' own Lua ``struct``), no script
spells one itself, and the batch scope's task summary decodes to what was encoded."""

from __future__ import annotations

import re
from importlib.resources import files

import numpy as np

from ftlayer import EmbeddedRedis, wire
from ftlayer.limits import lua_constants
from serialization.stored import encode_stored

ID8 = "'12345678'"  # an 8-byte string, for a c8 field
PAIRS = {  # Lua spelling -> (its Python twin's width, the Lua values of one record)
    "ENTRY_LUA": (wire.ENTRY_BYTES, "0, 0, 0, 0, 0, 0"),
    "ID_LUA": (8, "0, 0, 0"),
    "XOR_LUA": (wire.XOR_BYTES, "0, 0, 0, 0, 0"),
    "PERSIST_HEAD_LUA": (wire.PERSIST_HEAD.size, "0, 0, 0, 0, 0, 0"),
    "FAIL_HEAD_LUA": (wire.FAIL_HEAD.size, f"{ID8}, 0, 0"),
    "QUEUE_ENTRY_LUA": (wire.QUEUE_ENTRY.itemsize, "0, 0, 0, 0, 0, 0"),
}


def test_each_lua_layout_is_as_wide_as_its_python_twin(redis_server: EmbeddedRedis) -> None:
    client = redis_server.client()
    for name, (width, values) in PAIRS.items():
        fmt = getattr(wire, name)
        got = client.eval(f"return #struct.pack('{fmt}', {values})", 0)
        assert got == width, (name, fmt, got, width)


def test_no_script_spells_a_layout_of_its_own() -> None:
    lua = files("ftlayer") / "lua"
    texts = [p.read_text() for p in lua.iterdir() if p.name.endswith(".lua")]
    texts += [p.read_text() for p in (lua / "core").iterdir() if p.name.endswith(".lua")]
    spelled = [getattr(wire, n) for n in dir(wire) if n.endswith("_LUA")]
    for text in texts:
        code = re.sub(r"--.*$", "", text, flags=re.M)
        for fmt in spelled:
            assert f"'{fmt}'" not in code, fmt
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
