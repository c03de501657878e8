"""One dead letter per record, across shards.

A record dead-lettered again keeps one dead letter (docs/architecture.md, invariant 13). In
its own shard the script that dead-letters it finds the older entry through the shard's
dead-letter index (lineage id -> source id, lua/core/failures.lua ``dead_letter``) and joins
it. A record's ids pick their shard, and a re-run batch gives it new ids, so its second
dead letter may land in another shard, where no script can see the first (a script
touches one shard's keys: Redis Cluster). This pass joins those:

1. read each shard's dead-letter log after its merge cursor (``dlqlog:merged``): the
   lineage ids dead-lettered there since the last pass;
2. look each lineage up in every shard's index; a lineage held in two or more shards
   keeps the dead letter held first (its dead-letter time, then its shard);
3. join each other entry into it (lua/dlq_join.lua: idempotent, the joined entry names
   the id it took in), then drop that entry from its shard (lua/dlq_drop.lua: its
   dead-lettering recounted as ``dead_lettered_again``);
4. move the cursors.

A crash between the steps is harmless: the cursor has not moved, the next pass joins
nothing twice and drops what is left. Runs at the end of every batch that dead-lettered
rows (ftlayer.spark.report), with every timeout rotation (``FTLayer.expire_due``: the
sidecar's loop) and before the dead letters are listed, exported or re-driven, so those
never show a record twice. Until it runs, a record dead-lettered again in another shard
counts twice in ``dead_lettered`` and ``dead_letters``; the drop takes the count back (a
Prometheus scrape in between sees ``ftlayer_dead_lettered_total`` fall by one).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, cast

import msgpack

if TYPE_CHECKING:
    from ftpart.scripts import NamespacePart

__all__ = ["merge_dead_letters"]

PAGE = 1000
"""Log entries read per shard and round trip."""


def merge_dead_letters(part: NamespacePart) -> int:
    """Join the dead letters of a record held in several shards (module docstring).
    Returns how many entries were joined into another and dropped."""
    ks = part.keyspace
    if len(ks) < 2:
        return 0
    merged = 0
    while True:
        lineages, cursors, full = _new_lineages(part)
        for lin in lineages:
            merged += _merge(part, lin)
        with part.client.pipeline(transaction=False) as pipe:
            for k, cursor in cursors.items():
                pipe.set(ks[k].dlqlog_merged, cursor)
            pipe.execute()
        if not full:
            return merged


def _new_lineages(part: NamespacePart) -> tuple[set[bytes], dict[int, bytes], bool]:
    """(lineage ids logged after each shard's merge cursor, up to PAGE per shard; each
    shard's last entry read; whether any shard had PAGE entries, more may follow)."""
    ks, client = part.keyspace, part.client
    shards = range(len(ks))
    with client.pipeline(transaction=False) as pipe:
        for k in shards:
            pipe.get(ks[k].dlqlog_merged)
        after = [cast(bytes | None, c) for c in pipe.execute()]
    with client.pipeline(transaction=False) as pipe:
        for k, cursor in zip(shards, after, strict=True):
            pipe.xrange(ks[k].dlqlog, b"(" + cursor if cursor else "-", "+", count=PAGE)
        logs = cast(list[list[tuple[bytes, dict[bytes, bytes]]]], pipe.execute())
    lineages = {lin for entries in logs for _, f in entries if len(lin := f.get(b"lin", b"")) == 8}
    cursors = {k: entries[-1][0] for k, entries in zip(shards, logs, strict=True) if entries}
    return lineages, cursors, any(len(entries) == PAGE for entries in logs)


def _merge(part: NamespacePart, lin: bytes) -> int:
    """Keep one dead letter of lineage ``lin``: the others joined into it and dropped."""
    ks, client = part.keyspace, part.client
    with client.pipeline(transaction=False) as pipe:
        for shard in ks.shards:
            pipe.hget(shard.dlqlin, lin)
        held = [(k, cast(bytes, src)) for k, src in enumerate(pipe.execute()) if src]
    if len(held) < 2:
        return 0
    with client.pipeline(transaction=False) as pipe:
        for k, src in held:
            pipe.hget(ks[k].dlq, src)
        entries = [(k, src, cast(bytes, raw))
                   for (k, src), raw in zip(held, pipe.execute(), strict=True) if raw]  # fmt: skip
    if len(entries) < 2:
        return 0
    entries.sort(key=lambda e: (int(msgpack.unpackb(e[2], raw=True)[2]), e[0]))
    (keeper_k, keeper, _), others = entries[0], entries[1:]
    retried = part.retried
    scripts = part.scripts
    n = 0
    for k, src, raw in others:
        join = partial(scripts.dlq_join, keys=ks[keeper_k].script_keys, args=[keeper, src, raw])
        if not int(retried(join, "dlq join")):
            return n  # the keeper left (re-driven meanwhile): the next pass looks again
        n += int(retried(partial(scripts.dlq_drop, keys=ks[k].script_keys, args=[src]),
                         "dlq drop"))  # fmt: skip
    return n
