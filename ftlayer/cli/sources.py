"""``ftlayer sources``: which pipeline owns each source of a namespace (ftlayer.sources).

The first pipeline that runs a source stores its identity; another one is refused, so two
jobs never take each other's replays. ``--forget N`` hands source N over to the next
pipeline that runs it (a renamed pipeline, a new schema): refused while any of its
records is pending, since those replay into whatever owns the source.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ftlayer.cli.common import add_common, open_existing
from ftlayer.sources import forget_source, sources

__all__ = ["add_sources_command"]


def add_sources_command(sub: Any) -> None:
    p = sub.add_parser(
        "sources",
        help="the pipeline that owns each source of a namespace; --forget N hands one over",
        description="Lists each source index of the namespace with the pipeline that owns "
        "it (its name, or its Spark application's, and its source schema). --forget N drops "
        "source N's owner so the next pipeline to run it owns it; refused while records of "
        "source N are pending.",
    )
    add_common(p)
    p.add_argument("--forget", type=int, metavar="N", help="hand source N over (drained)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.set_defaults(func=_cmd_sources)


def _cmd_sources(args: argparse.Namespace) -> int:
    with open_existing(args) as layer:
        forgot = None
        if args.forget is not None:
            pending = layer.stats().pending_by_source.get(args.forget, 0)
            forgot = forget_source(layer.client, args.namespace, args.forget, pending)
        owners = sources(layer.client, args.namespace)
    if args.json:
        print(json.dumps({"sources": {str(k): v for k, v in owners.items()},
                          "forgot": forgot}, sort_keys=True))  # fmt: skip
        return 0
    if forgot is not None:
        print(f"source {args.forget}: {'handed over' if forgot else 'had no owner'}")
    if not owners:
        print(f"namespace {args.namespace}: no source has run yet")
    for k, owner in owners.items():
        print(f"  source {k:<5} {owner}")
    return 0
