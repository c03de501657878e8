"""The Lua scripts of ``ftlayer/lua``, run as Redis 7 functions where the server has them
and as EVALSHA scripts elsewhere (Redis 6.2, the embedded server).

The core ``lua/core/*.lua`` (concatenated in the order of :data:`CORE`, each part's header
says what it owns) is shared by every shard script. As EVAL (redis-py's
Script: EVALSHA first, reloaded on NoScriptError) each call builds it anew, most of a
small flush's cost (benchmarks/call_overhead.py). As a function library (``FUNCTION LOAD``, one
library per ftlayer build, named by a hash of its text) it is built once, and a call only
resets its state (``begin`` in the core). A server that lost the library (a restart
without persistence, ``FUNCTION FLUSH``) gets it loaded again on the next call.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import re
import time
from collections.abc import Callable
from functools import cache
from importlib.resources import files
from typing import Any, NamedTuple, TypeVar

import redis

from ftlayer.backoff import jittered
from ftlayer.config import FTConfig, ScriptMode
from ftlayer.connection import is_cluster, masters, with_retries
from ftlayer.errors import ConfigError, FTLayerError, RedisUnavailableError
from ftlayer.keys import Keyspace
from ftlayer.limits import lua_constants
from ftlayer.version import __version__

__all__ = [
    "SCRIPTS", "LoadedLibrary", "NamespacePart", "Scripts", "library_source", "loaded_libraries",
    "prune_libraries", "script_source",
]  # fmt: skip

log = logging.getLogger(__name__)

T = TypeVar("T")

CORE = ("layout", "stats", "records", "buckets", "ids", "failures", "summaries", "call")
"""The parts of the core (lua/core/<part>.lua), in the order they are concatenated: a part
uses only what the parts before it define; ``call`` (begin) comes last."""
# scripts on one shard's keys: prefixed with the core
SHARD_SCRIPTS = (
    "flush", "expire", "claim", "fail", "reset_timeout", "dlq_replay", "dlq_join", "dlq_drop",
    "segment_put", "segment_batch", "segment_settle", "summary_put",
)  # fmt: skip
# scripts on one key of their own
PLAIN_SCRIPTS = ("lease_acquire", "lease_release")
SCRIPTS = SHARD_SCRIPTS + PLAIN_SCRIPTS


def _read(name: str) -> str:
    return (files("ftlayer") / "lua" / f"{name}.lua").read_text()


def core_source() -> str:
    """The core every shard script starts with: the constants of ftlayer.limits, then the
    parts of CORE."""
    return lua_constants() + "".join(_read(f"core/{part}") for part in CORE) + "\n"


@cache
def script_source(name: str) -> str:
    """The full text of a script run by EVAL: shard scripts get the constants of
    ftlayer.limits, the core and the call's ``begin`` first."""
    if name in PLAIN_SCRIPTS:
        return _read(name)
    return core_source() + "begin(KEYS)\n" + _read(name)


@cache
def library_source() -> tuple[str, str]:
    """(name, text) of the function library holding every script: the core once, then
    each script's body as a function ``<name>_<script>`` whose parameters are named KEYS
    and ARGV, so the same body runs in both modes. The name carries ftlayer's version
    (``FUNCTION LIST`` tells which release loaded it) and a hash of the text: two ftlayer
    builds on one server each use their own library."""
    body = [core_source()]
    for script in SCRIPTS:
        start = "begin(KEYS)\n" if script in SHARD_SCRIPTS else ""
        body.append(
            f"redis.register_function('@LIB@_{script}', function(KEYS, ARGV)\n"
            f"{start}{_read(script)}\nend)\n"
        )
    text = "".join(body)
    version = re.sub(r"[^0-9A-Za-z]", "_", __version__)
    name = f"ftlayer_{version}_" + hashlib.sha1(text.encode()).hexdigest()[:12]
    return name, f"#!lua name={name}\n" + text.replace("@LIB@", name)


class LoadedLibrary(NamedTuple):
    """An ftlayer function library loaded on one master: ``current`` if it is this
    build's (an upgrade loads its own next to the old one, which stays until pruned)."""

    node: str
    name: str
    functions: int
    current: bool


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def loaded_libraries(client: Any) -> tuple[list[LoadedLibrary], list[str]]:
    """The ftlayer libraries (``ftlayer_*``) on every master, and the masters without
    functions (Redis < 7: ftlayer runs EVALSHA there, nothing is loaded)."""
    current = library_source()[0]
    found, without = [], []
    for node, server in masters(client):
        try:
            libs = server.function_list(library="ftlayer_*")
        except redis.ResponseError:
            without.append(node)
            continue
        for lib in libs:
            pairs = lib.items() if isinstance(lib, dict) else zip(lib[::2], lib[1::2], strict=True)
            fields = {_text(k): v for k, v in pairs}  # RESP2 gives flat pairs, RESP3 a map
            name = _text(fields["library_name"])
            found.append(LoadedLibrary(node, name, len(fields["functions"]), name == current))
    return found, without


def prune_libraries(client: Any) -> list[LoadedLibrary]:
    """Delete the ftlayer libraries of other builds from every master (a replica follows
    its master). Safe while such a build still runs: its next call finds its function
    missing and loads its library again (Scripts.load_library)."""
    old = [lib for lib in loaded_libraries(client)[0] if not lib.current]
    servers = dict(masters(client))
    for lib in old:
        with contextlib.suppress(redis.ResponseError):  # deleted meanwhile by another prune
            servers[lib.node].function_delete(lib.name)
    return old


def _missing_function(e: redis.ResponseError) -> bool:
    return "function not found" in str(e).lower()


class _Function:
    """One script called as a function of the loaded library; the call signature of
    redis-py's Script (``keys``, ``args``, ``client``: a pipeline queues the call)."""

    def __init__(self, scripts: Scripts, name: str) -> None:
        self.scripts = scripts
        self.name = name

    def __call__(self, keys: list[Any], args: list[Any], client: Any = None) -> Any:
        target = self.scripts.client if client is None else client
        try:
            return target.fcall(self.name, len(keys), *keys, *args)
        except redis.ResponseError as e:
            if client is not None or not _missing_function(e):
                raise
        self.scripts.load_library(replace=True)  # the server lost it: load, call once more
        return target.fcall(self.name, len(keys), *keys, *args)


class Scripts:
    """The scripts of one client, as attributes: ``scripts.flush(keys, args)``, or
    ``scripts.flush(keys, args, client=pipe)`` to queue it in a pipeline (run pipelines
    holding scripts with ``scripts.execute``).

    ``mode``: ``"auto"`` uses functions when the server takes ``FUNCTION LOAD`` (Redis 7+)
    and EVALSHA otherwise; ``"functions"`` refuses a server without them (ConfigError);
    ``"eval"`` never uses them. ``self.functions`` says which was chosen.
    """

    def __init__(self, client: Any, mode: ScriptMode = "auto") -> None:
        self.client = client
        self.functions = mode != "eval" and self._try_load(required=mode == "functions")
        library = library_source()[0]
        for name in SCRIPTS:
            if self.functions:
                setattr(self, name, _Function(self, f"{library}_{name}"))
            else:
                setattr(self, name, client.register_script(script_source(name)))

    def _try_load(self, required: bool) -> bool:
        try:
            self.load_library()
        except redis.ResponseError as e:
            if required:
                raise ConfigError(f"this Redis server cannot load functions: {e}") from e
            return False
        return True

    def load_library(self, replace: bool = False) -> None:
        """``FUNCTION LOAD`` the library (on every master of a cluster); a library of the
        same name, loaded already, is the same text. ``replace`` after a call found it
        missing: a cluster's load stops at the first master that has it, so one that lost
        it would never get it back; REPLACE loads it on all (and costs a compile each)."""
        name, text = library_source()
        try:
            self.client.function_load(text, replace=replace)
        except redis.ResponseError as e:
            if replace or "already exists" not in str(e):
                raise

    def execute(self, fill: Callable[[Any], None], client: Any = None) -> list[Any]:
        """Run the commands ``fill(pipe)`` queues in one pipeline (of ``client``, by default
        this one's) and return the replies.
        A server that lost the library fails every function call of the pipeline: the
        library is loaded again and the pipeline built and sent once more (what it holds
        must be safe to send twice: ftlayer's scripts are idempotent by their tokens)."""
        for attempt in (0, 1):
            with (client or self.client).pipeline(transaction=False) as pipe:
                fill(pipe)
                try:
                    return list(pipe.execute())
                except redis.ResponseError as e:
                    if attempt or not self.functions or not _missing_function(e):
                        raise
            self.load_library(replace=True)
        raise AssertionError("unreachable")

    flush: Any
    expire: Any
    claim: Any
    fail: Any
    reset_timeout: Any
    dlq_replay: Any
    dlq_join: Any
    dlq_drop: Any
    segment_put: Any
    segment_batch: Any
    segment_settle: Any
    summary_put: Any
    lease_acquire: Any
    lease_release: Any


class NamespacePart:
    """Base of the layer's Redis-backed parts (acker table, persistence, timeouts): each
    works on one namespace's keys, through one client and its registered scripts."""

    def __init__(
        self, client: redis.Redis, keyspace: Keyspace, scripts: Scripts, config: FTConfig
    ) -> None:
        self.client = client
        self.keyspace = keyspace
        self.scripts = scripts
        self.config = config

    def each_shard(self, script: Any, calls: list[tuple[Any, list[Any]]]) -> list[Any]:
        """``script(keys=..., args=...)`` for each (keys, args), replies in order: one
        pipelined round trip on a single server, one call each on a cluster (scripts
        cannot be pipelined across its masters)."""
        if is_cluster(self.client) or len(calls) < 2:
            return [script(keys=k, args=a) for k, a in calls]

        def fill(pipe: Any) -> None:
            for keys, args in calls:
                script(keys=keys, args=args, client=pipe)

        return self.scripts.execute(fill)

    patience_s: float = 0.0
    """How long ``retried`` waits out an unavailable Redis beyond its quick retries: the
    driver's parts get ``driver_wait_s`` (FTLayer.be_patient); executors' none."""

    def retried(self, call: Callable[[], T], what: str) -> T:
        """``call`` retried with backoff on a lost connection (``flush_retries``,
        ``flush_backoff_s``); only for calls that are idempotent, by a token or by the
        state they retire. RedisUnavailableError naming ``what`` when Redis stays away
        (a FlushError: a replicated write no replica acknowledged). With ``patience_s``
        (the driver), such errors are waited out that long, with backoff, logged; past it
        an FTLayerError says what to check."""
        cfg = self.config
        if self.patience_s <= 0:
            return with_retries(call, retries=cfg.flush_retries, backoff_s=cfg.flush_backoff_s,
                                what=what)  # fmt: skip
        deadline = time.monotonic() + self.patience_s
        backoff = jittered(0.25, 5.0)
        for attempt in itertools.count():
            try:
                return with_retries(call, retries=cfg.flush_retries,
                                    backoff_s=cfg.flush_backoff_s, what=what)  # fmt: skip
            except RedisUnavailableError as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise FTLayerError(
                        f"{what}: the driver's write did not land within driver_wait_s="
                        f"{self.patience_s:g}s ({e}); check that every shard's master is up "
                        "and, with durability='replicated', has a replica attached (INFO "
                        "replication): the batch fails and runs again when the query restarts"
                    ) from e
                log.warning("driver write waiting for Redis what=%s attempt=%d left_s=%.1f "
                            "error=%s", what, attempt + 1, left, e)  # fmt: skip
                time.sleep(min(left, backoff.compute(attempt)))
        raise AssertionError("unreachable")
