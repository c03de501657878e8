"""Segments: batch-scope persistence of the vectorized path.

A source task of a vectorized batch persists its fresh rows as ONE segment (Arrow IPC,
one Redis call with its task summary) instead of one entry per record. The segment is
tied to its batch: ``<source>:<batch id>:<partition>`` in shard ``partition % shards``.
When the batch ends, the driver *settles* each segment: its residues (rows that failed,
or whose writes were not confirmed) become per-record entries -- replay queue, dead
letters, or pending with a live timeout -- and the segment is deleted, in one script call
per shard. A segment its batch never settles times out as a whole: the sidecar settles it
with every row failed (reason ``timeout``), so they replay. A batch re-run under the same
batch id drops the segments its earlier run left before it writes its own.

Invariants: a segment is indexed until settled, and settling checks the index, so the
segment is the idempotency token of its settlement (a retry, or the sidecar racing the
driver, settles it once). Residues are written in the same call that deletes the segment.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from ftlayer.connection import is_cluster
from ftlayer.ids import local_ids, new_ids, persisted_ids
from ftlayer.limits import MAX_ERROR_BYTES as _MAX_ERROR
from ftlayer.lineage import LINEAGE_META, copy_lineage, reference_lineage
from ftlayer.payloads import arrow_codecs, encode_record
from ftlayer.scripts import NamespacePart
from ftlayer.tally import Tally
from ftlayer.wire import SegmentEntry, pack_segments
from serialization.stored import STORED_DTYPE, STORED_HEADER_SIZE, encode_stored_many

__all__ = ["Residues", "SegmentStore", "frames_of_rows", "unit_source_id"]

log = logging.getLogger(__name__)

SUMMARY_TTL_MS = 86_400_000
"""Task summaries of a batch live until it settles; this bounds those of batches that die."""


def frames_of_rows(
    table: Any,
    rows: np.ndarray,
    *,
    shard: int,
    source: int,
    partition: int,
    max_replays: int,
    max_payload: int,
    kept: Sequence[bytes | None] = (),
) -> list[bytes]:
    """Stored records for ``rows`` of a segment (an Arrow table of source ``partition``),
    each as a unit (its new source id then its stored form, serialization.stored): the
    row as a msgpack map -- or, where ``kept`` has one for it, that payload (a stage row:
    ftlayer.stage_rows) --, the id in ``shard`` (low 16 bits; the rows share
    buckets), the lineage id its batch gave it (the segment's LINEAGE_META says how)."""
    codecs = arrow_codecs(table.schema)
    payloads: list[bytes | None] = list(kept) or [None] * len(rows)
    own = [i for i, payload in enumerate(payloads) if payload is None]  # the source rows
    if own:  # (a row with a kept payload is not read: most of a late stage's failures)
        picked = rows if len(own) == len(rows) else np.asarray(rows)[own]
        for i, rec in zip(own, table.take(picked).to_pylist(), strict=True):
            payloads[i] = encode_record(rec, codecs)
    done = cast("list[bytes]", payloads)  # every one filled in
    lineages = segment_lineage(table, rows, source, partition)
    heads = encode_stored_many(done, 0, source, partitions=partition,
                               max_replays=max_replays, max_payload=max_payload,
                               lineages=lineages)  # fmt: skip
    ids = persisted_ids(heads["payload_len"].astype(np.int64) + STORED_HEADER_SIZE, shard)
    unit = np.empty(len(done), [("id", ">u8"), ("head", STORED_DTYPE)])
    unit["id"], unit["head"] = ids, heads
    return [u + p for u, p in zip(unit.view(f"V{unit.itemsize}").tolist(), done,
                                  strict=True)]  # fmt: skip


def unit_source_id(unit: bytes) -> int:
    """The source id a unit (as frames_of_rows makes it) starts with."""
    return int.from_bytes(unit[:8], "big")


def segment_lineage(table: Any, rows: np.ndarray, source: int, partition: int) -> np.ndarray:
    """The lineage ids of ``rows`` of a segment of source ``partition`` (ftlayer.lineage),
    as its schema's LINEAGE_META says they were made."""
    meta = (table.schema.metadata or {}).get(LINEAGE_META, b"")
    if meta.startswith(b"key:"):  # a null key (dead-lettered, never written) reads -1
        keys = table.column(meta[4:].decode()).take(rows).fill_null(-1)
        return np.asarray(keys, np.int64)
    if meta == b"ref":  # a segment of references holds (location, position) first
        loc, pos = (np.asarray(table.column(i).take(rows).cast("int64")) for i in (0, 1))
        return reference_lineage(source, loc, pos)
    if meta.startswith(b"seed:"):
        return copy_lineage(int(meta[5:]), local_ids(partition, np.asarray(rows)))
    raise ValueError(f"segment without {LINEAGE_META.decode()} metadata: {meta!r}")


@dataclass
class Residues:
    """The residues of one segment: row indices that failed (with an error each) and
    row indices left pending (their current ids as the ack value)."""

    failed: list[tuple[int, str]] = field(default_factory=list)
    pending: list[tuple[int, int]] = field(default_factory=list)


class SegmentStore(NamespacePart):
    """The segments and task summaries of one namespace (see the module docstring)."""

    def shard_of_partition(self, partition: int) -> int:
        return partition % len(self.keyspace)

    @staticmethod
    def batch_prefix(source: int, batch_key: str) -> str:
        return f"{source}:{batch_key}:"

    @classmethod
    def member(cls, source: int, batch_key: str, partition: int, token: int) -> str:
        """A segment's name: one per task attempt (attempts may order rows differently)."""
        return f"{cls.batch_prefix(source, batch_key)}{partition}:{token:x}"

    def new_token(self, shard: int) -> int:
        """A random 40-bit id naming one task attempt's summary (it rides in a marker
        row's id, see ftlayer.ids.marker_id), chosen so that it falls in ``shard``."""
        n = len(self.keyspace)
        return int(new_ids(1)[0] & np.uint64((1 << 40) - 1)) // n * n + shard

    def token_shard(self, token: int) -> int:
        return token % len(self.keyspace)

    def put(
        self,
        partition: int,
        member: str,
        segment: bytes | memoryview,
        token: int,
        summary: bytes,
        salt: int,
        batch: str,
    ) -> int:
        """Store a source task's segment and summary in one round trip (two calls on a
        cluster, where scripts cannot be pipelined). 0: no segment was indexed (no fresh
        rows, or this run settled the batch already: a late attempt)."""
        cfg = self.config
        shard = self.keyspace[self.shard_of_partition(partition)]
        args = [member, "1" if segment else "", f"{token:x}", summary, cfg.interval_ms,
                cfg.buckets, SUMMARY_TTL_MS, str(salt), batch]  # fmt: skip
        key = f"{shard.prefix}:seg:{member}"
        if is_cluster(self.client):
            if segment:
                self.client.set(key, segment, px=SUMMARY_TTL_MS)
            return int(self.scripts.segment_put(keys=shard.script_keys, args=args))

        def fill(pipe: Any) -> None:
            if segment:  # the TTL holds until the script indexes it
                pipe.set(key, segment, px=SUMMARY_TTL_MS)
            self.scripts.segment_put(keys=shard.script_keys, args=args, client=pipe)

        return int(self.scripts.execute(fill)[-1])

    def put_many(self, puts: list[tuple[int, str, bytes | memoryview]], salt: int,
                 batch: str) -> int:
        """Store segments without summaries, (partition, member, segment) each, as
        :meth:`put` does, all in one round trip on a single server (one call each on a
        cluster); returns the round trips it made."""
        if is_cluster(self.client) or len(puts) < 2:
            for p, m, seg in puts:
                self.put(p, m, seg, 0, b"", salt, batch)
            return len(puts)
        cfg = self.config

        def fill(pipe: Any) -> None:
            for partition, member, segment in puts:
                shard = self.keyspace[self.shard_of_partition(partition)]
                pipe.set(f"{shard.prefix}:seg:{member}", segment, px=SUMMARY_TTL_MS)
                self.scripts.segment_put(keys=shard.script_keys, args=[
                    member, "1", "0", b"", cfg.interval_ms, cfg.buckets, SUMMARY_TTL_MS,
                    str(salt), batch], client=pipe)  # fmt: skip

        self.scripts.execute(fill)
        return 1

    def put_summary(self, token: int, summary: bytes, salt: int, batch: str) -> int:
        """Store the summary of a task behind a shuffle (lua/summary_put.lua). 0: this run
        settled the batch already (a late attempt), nothing stored."""
        shard = self.keyspace[self.token_shard(token)]
        args = [f"{token:x}", summary, SUMMARY_TTL_MS, str(salt), batch]
        return int(self.scripts.summary_put(keys=shard.script_keys, args=args))

    def summaries(self, tokens: Iterable[int]) -> dict[int, bytes | None]:
        """The summaries of task attempts by token, one MGET per shard."""
        by_shard: dict[int, list[int]] = {}
        for t in tokens:
            by_shard.setdefault(self.token_shard(t), []).append(t)
        out: dict[int, bytes | None] = {}
        for k, ts in by_shard.items():
            prefix = self.keyspace[k].prefix
            got = cast(list[bytes | None], self.client.mget([f"{prefix}:sum:{t:x}" for t in ts]))
            out.update(zip(ts, got, strict=True))
        return out

    def batch_summaries(self, source: int, batch_key: str) -> list[bytes]:
        """The summaries the tasks of one batch stored under its prefix (every attempt's:
        the index set is per shard), one SMEMBERS and one MGET per shard."""
        batch = self.batch_prefix(source, batch_key)
        out: list[bytes] = []
        for shard in self.keyspace.shards:
            tokens = cast(set[bytes], self.client.smembers(f"{shard.prefix}:sumidx:{batch}"))
            if tokens:
                keys = [f"{shard.prefix}:sum:{t.decode()}" for t in sorted(tokens)]
                out += [x for x in cast(list[bytes | None], self.client.mget(keys)) if x]
        return out

    def get(self, partition: int, member: str) -> bytes | None:
        prefix = self.keyspace[self.shard_of_partition(partition)].prefix
        return self.client.get(f"{prefix}:seg:{member}")  # type: ignore[return-value]

    def run_again(self, source: int, batch_key: str) -> bool:
        """Note that a batch of ``source`` begins; True when the last batch that began was
        this one (Spark running it again after its driver died: its rows may have reached
        the sink already). Spark re-runs only the last batch it began, so one key per
        source holds all that is needed."""
        key = f"{self.keyspace.shards[0].prefix}:lastbatch:{source}"
        before = self.retried(lambda: self.client.set(key, batch_key, get=True), "last batch")
        return isinstance(before, bytes) and before.decode() == batch_key

    def drop_batch(self, source: int, batch_key: str) -> int:
        """Drop segments an earlier run of this batch id left."""
        return self._each_shard(self.batch_prefix(source, batch_key), "drop")

    def touch_batch(self, source: int, batch_key: str) -> int:
        """Push the deadlines of this batch's segments a full timeout ahead."""
        return self._each_shard(self.batch_prefix(source, batch_key), "touch")

    def _each_shard(self, prefix: str, action: str) -> int:
        """lua/segment_batch.lua on every shard (one round trip on a single server)."""
        args = [prefix, action, self.config.interval_ms, self.config.buckets]
        if is_cluster(self.client):
            return sum(
                int(self.scripts.segment_batch(keys=s.script_keys, args=args))
                for s in self.keyspace.shards
            )

        def fill(pipe: Any) -> None:
            for s in self.keyspace.shards:
                self.scripts.segment_batch(keys=s.script_keys, args=args, client=pipe)

        return sum(int(n) for n in self.scripts.execute(fill))

    def settle(
        self,
        shard: int,
        segments: list[SegmentEntry],
        summary_tokens: list[int],
        *,
        salt: int,
        reason: str = "explicit",
        batch: str = "",
    ) -> Tally:
        """Settle segments of one shard: (member, rows, failed frames with errors,
        pending frames with their ack values). See lua/segment_settle.lua."""
        jobs = {shard: (segments, summary_tokens)}
        return self.settle_shards(jobs, salt=salt, reason=reason, batch=batch)[shard]

    def settle_shards(
        self,
        jobs: dict[int, tuple[list[SegmentEntry], list[int]]],
        *,
        salt: int,
        reason: str = "explicit",
        batch: str = "",
        elapsed_ms: int = 0,
        hold_until: float = 0.0,
    ) -> dict[int, Tally]:
        """``settle`` for several shards (shard -> (segments, summary tokens)): one round
        trip on a single server, one call per shard on a cluster. Each call is idempotent
        (it settles only segments still indexed), so a retried one does its work once.
        ``elapsed_ms``: the batch's time so far, observed as the completion latency of
        every row the segments complete (0: none observed, as at a segment's timeout).
        ``hold_until`` (epoch seconds): when its held rows (0 attempts) may be claimed."""
        cfg = self.config

        def call(shard: int, client: Any = None) -> Any:
            segments, tokens = jobs[shard]
            return self.scripts.segment_settle(
                keys=self.keyspace[shard].script_keys,
                args=[
                    cfg.interval_ms, cfg.buckets, cfg.max_replays, reason, str(salt),
                    pack_segments(segments, _MAX_ERROR), ",".join(f"{t:x}" for t in tokens), batch,
                    str(int(elapsed_ms)), str(int(hold_until * 1000)),
                ],
                client=client,
            )  # fmt: skip

        shards = sorted(jobs)

        def run() -> list[Any]:
            if is_cluster(self.client) or len(shards) == 1:
                return [call(k) for k in shards]

            def fill(pipe: Any) -> None:
                for k in shards:
                    call(k, pipe)

            return self.scripts.execute(fill)

        replies = self.retried(run, "segment settle")
        out: dict[int, Tally] = {}
        for k, reply in zip(shards, replies, strict=True):
            out[k] = Tally()
            out[k].add_settle(reply)
        return out

    def indexed(self) -> list[tuple[int, str, float]]:
        """(shard, member, deadline_ms) of every segment not yet settled."""
        out: list[tuple[int, str, float]] = []
        for k, s in enumerate(self.keyspace.shards):
            got = cast(
                list[tuple[bytes, float]], self.client.zrange(s.segidx, 0, -1, withscores=True)
            )
            out.extend((k, member.decode(), float(score)) for member, score in got)
        return out

    def expire_due(self, now_ms: float | None = None) -> Tally:
        """Settle every segment past its deadline with all of its rows failed (reason
        ``timeout``): its batch never settled it. Returns what was done."""
        import pyarrow as pa

        if now_ms is None:
            sec, usec = self.client.time()
            now_ms = sec * 1000 + usec / 1000
        res = Tally()
        for shard, member, deadline in self.indexed():
            if deadline > now_ms:
                continue
            source, partition = int(member.split(":", 1)[0]), int(member.rsplit(":", 2)[1])
            blob = self.get(partition, member)
            frames: list[tuple[bytes, str, int]] = []
            rows = 0
            if blob:
                table = pa.ipc.open_stream(blob).read_all()
                rows = table.num_rows
                made = frames_of_rows(
                    table, np.arange(rows), shard=shard, source=source,
                    partition=partition, max_replays=self.config.max_replays,
                    max_payload=self.config.max_record_bytes,
                )  # fmt: skip
                frames = [(f, "segment timed out: its batch never settled", 1) for f in made]
            res.merge(self.settle(shard, [(member, rows, frames, [], 0)], [], salt=0,
                                  reason="timeout"))  # fmt: skip
            log.warning("segment timed out member=%s rows=%d", member, rows)
        return res
