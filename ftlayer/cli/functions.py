"""``ftlayer functions``: the ftlayer function libraries loaded on a Redis 7 server.

Each ftlayer build loads its scripts as one library named by a hash of their text
(ftlayer.scripts), so an upgrade leaves the old build's library beside the new one.
``--prune`` deletes the libraries of other builds; a process of such a build that still
runs loads its own again on its next call, so pruning during a rolling upgrade is safe.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ftlayer.cli.common import UsageError, add_redis_url
from ftlayer.connection import redact_url


def add_functions_command(sub: Any) -> None:
    p = sub.add_parser(
        "functions",
        help="the ftlayer function libraries on a Redis 7 server; --prune deletes old builds'",
        description="Lists the ftlayer function libraries loaded on the server (every master "
        "of a cluster), marking this build's. --prune deletes the others (left by upgrades); "
        "a process of another build still running loads its library again on its next call.",
    )
    add_redis_url(p)
    p.add_argument("--prune", action="store_true", help="delete other builds' libraries")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=_cmd_functions)


def _cmd_functions(args: argparse.Namespace) -> int:
    from ftlayer.connection import connect
    from ftlayer.scripts import library_source, loaded_libraries, prune_libraries

    if not args.redis_url:
        raise UsageError("`ftlayer functions` reads a server: give --redis-url "
                          "(or FTLAYER_REDIS_URL)")  # fmt: skip
    client = connect(args.redis_url)
    try:
        pruned = prune_libraries(client) if args.prune else []
        libraries, without = loaded_libraries(client)
    finally:
        client.close()
    if args.json:
        print(json.dumps({
            "current": library_source()[0],
            "libraries": [lib._asdict() for lib in libraries],
            "pruned": [lib._asdict() for lib in pruned],
            "without_functions": without,
        }, sort_keys=True))  # fmt: skip
        return 0
    print(f"ftlayer function libraries on {redact_url(args.redis_url)} "
          f"(this build's: {library_source()[0]})")  # fmt: skip
    for lib in pruned:
        print(f"  deleted  {lib.node:<22} {lib.name}")
    for lib in libraries:
        whose = "this build's" if lib.current else "another build's"
        print(f"  {lib.node:<31} {lib.name}  {lib.functions:>2} functions  {whose}")
    for node in without:
        print(f"  {node:<31} no functions (Redis < 7): ftlayer runs its scripts by EVALSHA")
    old = sum(1 for lib in libraries if not lib.current)
    if old:
        print(f"{old} of another build: `ftlayer functions --prune` deletes "
              f"{'it' if old == 1 else 'them'}")  # fmt: skip
    elif not libraries and not without:
        print("  none loaded (the first ftlayer call loads this build's)")
    return 0
