"""Redis key names. Everything of one shard shares the hash tag ``{ns:k}`` so that one
script call touches one slot (Redis Cluster)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from redis.crc import key_slot

__all__ = ["LAYOUT_VERSION", "Keyspace", "ShardKeys", "shard_tag"]

_SLOTS = 16384
LAYOUT_VERSION = 4
"""The version of the storage layout (docs/storage-layout.md), kept in a namespace's
settings as ``frame_version``: 1 whole frames, 2 stored records (serialization.stored),
3 failure histories per bucket, 4 a lineage id in every stored record. A namespace
written by another layout is refused."""


@cache
def shard_tag(namespace: str, k: int, shards: int) -> str:
    """The hash tag of shard ``k``: ``<ns>:<k>``, with a suffix when needed so that its
    slot lies in the k-th of ``shards`` equal slices of the 16384 slots. Masters of a
    cluster own contiguous slot ranges, so shards spread evenly over them. Deterministic:
    every executor and sidecar of a namespace derives the same keys."""
    lo, hi = k * _SLOTS // shards, (k + 1) * _SLOTS // shards
    if shards <= 256:  # slices of >= 64 slots: a few dozen tries at most
        for j in range(100_000):
            tag = f"{namespace}:{k}" if j == 0 else f"{namespace}:{k}:{j}"
            if lo <= key_slot(f"{{{tag}}}".encode()) < hi:
                return tag
    return f"{namespace}:{k}"


@dataclass(frozen=True, slots=True)
class ShardKeys:
    prefix: str

    @property
    def script_keys(self) -> list[str]:
        """KEYS of every script, in the order lua/core/layout.lua expects."""
        p = self.prefix
        return [f"{p}:stats", f"{p}:tmoidx", f"{p}:dlq"]

    def bucket(self, source_id: int) -> tuple[str, str, int]:
        """(entries key, frames key, slot) of a source id: byte 6 of the id (bits 16..23)
        is its slot, the other 7 bytes name its bucket (docs/storage-layout.md)."""
        slot = (source_id >> 16) & 0xFF
        base = ((source_id >> 24) << 16) | (source_id & 0xFFFF)
        return f"{self.prefix}:b:{base:014x}", f"{self.prefix}:f:{base:014x}", slot

    def history(self, source_id: int) -> tuple[str, bytes]:
        """(histories key of its bucket, its field: the slot as one byte)."""
        slot = (source_id >> 16) & 0xFF
        base = ((source_id >> 24) << 16) | (source_id & 0xFFFF)
        return f"{self.prefix}:h:{base:014x}", bytes([slot])

    @property
    def buckets_pattern(self) -> str:
        """A SCAN pattern matching the shard's buckets (their entries)."""
        return f"{self.prefix}:b:*"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

    @property
    def tmoidx(self) -> str:
        return f"{self.prefix}:tmoidx"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}:dlq"

    @property
    def segidx(self) -> str:
        """Unsettled segments of vectorized batches (member -> deadline)."""
        return f"{self.prefix}:segidx"

    def tmo(self, deadline_ms: int) -> str:
        """The buckets holding entries due at ``deadline_ms``."""
        return f"{self.prefix}:t:{deadline_ms}"

    def replay(self, source: int) -> str:
        return f"{self.prefix}:replay:{source}"

    def replay_later(self, source: int) -> str:
        """The delayed replays of ``source``: a sorted set of queue entries by the time
        (ms) before which they are not claimed (lua/core/failures.lua, enqueue)."""
        return f"{self.prefix}:replay:{source}:later"

    def claim(self, token: str) -> str:
        """The queue entries a claim with ``token`` took (lua/claim.lua)."""
        return f"{self.prefix}:claim:{token}"

    @property
    def dlqlog(self) -> str:
        """The dead-letter log: a capped stream of (src, source), one per dead letter."""
        return f"{self.prefix}:dlqlog"

    @property
    def dlqlin(self) -> str:
        """The dead-letter index: lineage id -> the source id its dead letter is held
        under (lua/core/failures.lua ``dead_letter``: one dead letter per record)."""
        return f"{self.prefix}:dlqlin"

    @property
    def dlqlog_merged(self) -> str:
        """The last log entry ftlayer.dlq_merge has looked at for dead letters held in
        two shards."""
        return f"{self.prefix}:dlqlog:merged"

    def dlqlog_cursor(self, source: int) -> str:
        """The last log entry the ``on_dead_letter`` callback of ``source`` was given."""
        return f"{self.prefix}:dlqlog:cursor:{source}"


class Keyspace:
    """The keys of one namespace: ``ft:{<ns>:<k>}:…`` for shard k."""

    __slots__ = ("namespace", "shards")

    def __init__(self, namespace: str, shards: int) -> None:
        self.namespace = namespace
        self.shards = [
            ShardKeys(f"ft:{{{shard_tag(namespace, k, shards)}}}") for k in range(shards)
        ]

    def __len__(self) -> int:
        return len(self.shards)

    def __getitem__(self, k: int) -> ShardKeys:
        return self.shards[k]

    @property
    def lease(self) -> str:
        """The sidecar lease (one key of its own: only lease scripts touch it)."""
        return f"ft:{{{self.namespace}}}:lease"

    def stream_claims(self, source: int) -> str:
        """The replay stream's claim tokens of ``source`` not yet committed by Spark (a
        set): the batch running them keeps their records alive."""
        return f"ft:{{{self.namespace}}}:rs:{source}"

    @property
    def stream_claims_pattern(self) -> str:
        """A SCAN pattern matching every source's ``stream_claims``."""
        return f"ft:{{{self.namespace}}}:rs:*"

    def breakers(self, source: int) -> str:
        """The circuit breakers of ``source``'s stages (ftlayer.spark.breakers): one hash."""
        return f"ft:{{{self.namespace}}}:breakers:{source}"

    @property
    def breakers_pattern(self) -> str:
        """A SCAN pattern matching every source's ``breakers``."""
        return f"ft:{{{self.namespace}}}:breakers:*"

    @property
    def sources(self) -> str:
        """Which pipeline owns each source index (ftlayer.sources): one hash of its own."""
        return f"ft:{{{self.namespace}}}:sources"

    @property
    def unreplayed(self) -> str:
        """Sources whose streaming query's input lacks the replay stream
        (ftlayer.unreplayed): one hash, source -> what the driver saw."""
        return f"ft:{{{self.namespace}}}:unreplayed"

    @property
    def settings(self) -> str:
        """The namespace's stored settings (ftlayer.settings): one key of its own."""
        return f"ft:{{{self.namespace}}}:settings"

    @property
    def batches(self) -> str:
        """The pipelines' newest batch summaries (ftlayer.history): a capped list."""
        return f"ft:{{{self.namespace}}}:batches"

    @property
    def samples(self) -> str:
        """The leader sidecar's samples of the namespace's counters (ftlayer.history): a
        capped list, the status page's charts."""
        return f"ft:{{{self.namespace}}}:samples"

    @property
    def pattern(self) -> str:
        """A SCAN pattern matching every shard key of the namespace."""
        return f"ft:{{{self.namespace}:*"
