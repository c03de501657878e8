"""The Lua scripts, loaded from ``ftlayer/lua`` and run through redis-py's Script
(EVALSHA first, reloaded on NoScriptError, usable inside pipelines)."""

from __future__ import annotations

from functools import cache
from importlib.resources import files
from typing import Any

__all__ = ["SCRIPTS", "Scripts", "script_source"]

SCRIPTS = ("flush", "expire", "claim", "fail", "reset_timeout")


@cache
def script_source(name: str) -> str:
    """The full text of a script: the shared prelude, then its own body."""
    lua = files("ftlayer") / "lua"
    return (lua / "_common.lua").read_text() + "\n" + (lua / f"{name}.lua").read_text()


class Scripts:
    """Registered scripts of one client, as attributes: ``scripts.flush(keys, args)``."""

    def __init__(self, client: Any) -> None:
        for name in SCRIPTS:
            setattr(self, name, client.register_script(script_source(name)))

    flush: Any
    expire: Any
    claim: Any
    fail: Any
    reset_timeout: Any
