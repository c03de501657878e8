"""FTConfig: the one frozen settings object of ftlayer."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from ftlayer.errors import ConfigError
from ftlayer.limits import MAX_ARGUMENT_BYTES, MAX_RECORD_BYTES, MAX_REPLAYS, MAX_SHARDS

__all__ = ["Durability", "FTConfig", "FTStatus", "ScriptMode", "SegmentCodec"]

FTStatus = Literal["on", "off"]
Durability = Literal["local", "replicated"]
SegmentCodec = Literal["none", "lz4", "zstd"]
ScriptMode = Literal["auto", "functions", "eval"]
_NAMESPACE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True)
class FTConfig:
    """Settings shared by executors, the sidecar and the CLI.

    Timeouts: a record that is not complete fails between ``timeout_s`` and
    ``timeout_s * buckets / (buckets - 1)`` after it was persisted (the rotating-bucket
    bound of Storm's RotatingMap, which uses ``buckets=3``).
    """

    namespace: str = "ftlayer"
    """Prefix of every Redis key; pipelines with different namespaces never interact."""
    status: FTStatus = "on"
    """``"off"`` builds the no-op handler: same API, no Redis, no cost."""
    shards: int = 8
    """Hash-tagged key groups; ids pick their shard with their low 16 bits (<= 65536)."""
    timeout_s: float = 30.0
    """Seconds a persisted record has to complete (acked through every stage and the sink):
    one still incomplete fails and is replayed between ``timeout_s`` and ``timeout_s *
    buckets / (buckets - 1)`` after it was persisted, when the sidecar (or
    ``FaultTolerance(rotate=True)``) rotates the buckets. While a batch runs, a live driver
    keeps its records' deadlines a full timeout ahead (``ack_scope="batch"``)."""
    buckets: int = 3
    """Timeout buckets (>= 2): they rotate every ``timeout_s / (buckets - 1)`` seconds (at
    least 10 ms), so more buckets make a record fail closer to ``timeout_s`` for more
    rotations."""
    max_replays: int = 3
    """Failures replayed per record; the next failure dead-letters it."""
    max_record_bytes: int = 1 << 20
    """Largest msgpack payload accepted at the source, in bytes."""
    expire_batch: int = 1000
    """Timeout entries handled per Redis script call during rotation."""
    flush_retries: int = 5
    """Retries of an idempotent Redis call (a flush, a claim, a batch's settlement) after a
    lost connection or a timeout, before it raises ``RedisUnavailableError``: an executor's
    task then fails and Spark runs it again; the driver waits on, up to ``driver_wait_s``."""
    flush_backoff_s: float = 0.1
    """Base of the backoff between those retries, in seconds: the n-th wait is
    ``random() * flush_backoff_s * 2**n`` (full jitter), at most 5 s."""
    flush_chunk_bytes: int = 64 << 20
    """A flush sends each shard's records in script calls whose packed arguments stay
    under this many bytes (a larger record travels alone); keep it below the server's
    ``proto-max-bulk-len`` (512 MiB by default)."""
    max_pending: int | None = None
    """Backpressure, per source index: before each batch the driver waits while the source
    has more records than this in flight (pending and not waiting in the replay queue: the
    next batch claims those), up to ``FaultTolerance(backpressure_timeout_s=...)``, then runs
    the batch anyway (logged). A soft bound, not a cap; ``None``: no backpressure."""
    redis_url: str | None = None
    """The Redis the driver, the executors and the sidecar use: ``redis://`` (``rediss://``
    for TLS, ``unix://``) with ``user:password@`` if needed, or ``redis+cluster://`` naming
    one node or several for a Redis Cluster. ``None``: start an embedded redis-server (see
    ftlayer.embedded), which only a local Spark master's executors can reach."""
    embedded_data_dir: str | None = None
    """The embedded redis-server's directory: with one, it keeps an append-only file
    (``appendfsync everysec``: a crash loses at most the last second of writes) and a
    restart on the same directory finds every pending record; without one, FT state lives
    in memory only and ``FTLayer.open`` warns once."""
    allow_eviction: bool = False
    """Accept a Redis whose ``maxmemory-policy`` is not ``noeviction`` (warned, shown by
    the status page, ``/readyz`` and the stats command). Refused by default: an evicted
    key is a pending record lost with no error."""
    durability: Durability = "local"
    """``"replicated"``: a flush returns only after one replica acknowledged its writes
    (Redis ``WAIT``), so a failover cannot drop records the task counted as persisted.
    Redis replication is asynchronous: with ``"local"`` a master that dies right after a
    flush may take its last writes with it."""
    replica_wait_s: float = 2.0
    """Seconds a ``"replicated"`` flush waits for the replica before it fails."""
    driver_wait_s: float = 120.0
    """Seconds a write the driver makes (settling a batch, completing and failing
    replays, claiming, dead-lettering) waits out a Redis it cannot reach, or a master with
    no replica yet (``"replicated"``, a failover), before its batch fails. Retried with
    backoff, logged. Executors do not wait this long: their task fails after
    ``flush_retries`` and Spark runs it again; the driver has no one to run it again."""
    segment_codec: SegmentCodec = "none"
    """Compression of the vectorized path's segments (a source task's fresh rows, Arrow
    IPC, in Redis until their batch settles). ``"none"`` costs the least CPU (the rows'
    Arrow width in Redis memory); ``"lz4"`` keeps less memory per in-flight record for a
    little more CPU per row, ``"zstd"`` less memory again for more CPU
    (docs/architecture.md). Readers decode any of them."""
    max_kept_rows: int = 100_000
    """Failed rows a stage of DataFrame stages keeps, per batch, as the input of the
    segment they failed in, so that their replays enter there: the source is not read
    again and the stages before that segment do not run again. Their values reach the
    driver in Spark's observations (driver memory): a stage whose last batch failed more
    keeps about this many (a share chosen by a hash of their identity), the rest replay
    from their source. 0: none kept."""
    max_kept_bytes: int = 0
    """Bytes of those rows a stage keeps per batch, about: their values travel through
    the driver's heap (as Spark's JSON, in base64, several copies at once), so a stage
    whose rows could pass this (in its first segment: when every replay read back in the
    batch failed again) keeps a share, as for ``max_kept_rows``, sized by its last batch.
    A stage's first batch keeps at most this many bytes of rows, counted in the job at
    their width (exact for numbers, dates and timestamps; 2 KB where a row has a string
    or a nested column, and wider rows not kept) (Spark >= 4.2; before, it keeps every
    failed row).
    0: 1/64 of the driver's heap (16 MiB of 1 GiB). Python stages keep about this many
    bytes a task (0: 16 MiB), in its summary."""
    script_mode: ScriptMode = "auto"
    """How the Lua scripts run: ``"auto"`` as a Redis 7 function library where the server
    takes ``FUNCTION LOAD`` (a call then skips rebuilding the scripts' shared prelude:
    what a small flush costs most; ``benchmarks.call_overhead``), else by EVALSHA;
    ``"functions"`` refuses a server without functions; ``"eval"`` never loads the library
    (an ACL that denies ``FUNCTION``, or to compare)."""

    def __post_init__(self) -> None:
        if self.status not in ("on", "off"):
            raise ConfigError(f"status must be 'on' or 'off', not {self.status!r}")
        if not _NAMESPACE.match(self.namespace):
            raise ConfigError(
                f"namespace {self.namespace!r} must be 1-64 characters of [A-Za-z0-9_.-]"
            )
        if not 1 <= self.shards <= MAX_SHARDS:
            raise ConfigError(f"shards must be in 1..{MAX_SHARDS}, not {self.shards}")
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s must be > 0, not {self.timeout_s}")
        if self.max_kept_rows < 0:
            raise ConfigError(f"max_kept_rows must be >= 0, not {self.max_kept_rows}")
        if self.max_kept_bytes < 0:
            raise ConfigError(f"max_kept_bytes must be >= 0, not {self.max_kept_bytes}")
        if self.buckets < 2:
            raise ConfigError(f"buckets must be >= 2 (a rotation needs two), not {self.buckets}")
        if self.rotation_interval_s < 0.01:
            raise ConfigError(
                f"timeout_s/(buckets-1) = {self.rotation_interval_s:.4f}s is below 10 ms"
            )
        if not 0 <= self.max_replays <= MAX_REPLAYS:
            raise ConfigError(
                f"max_replays must be in 0..{MAX_REPLAYS} (16 bits in a record's frame), "
                f"not {self.max_replays}"
            )
        if not 1 <= self.max_record_bytes <= MAX_RECORD_BYTES:
            raise ConfigError(
                f"max_record_bytes must be in 1..{MAX_RECORD_BYTES} (a frame must fit in "
                f"Redis's largest argument), not {self.max_record_bytes}"
            )
        if self.expire_batch < 1:
            raise ConfigError(f"expire_batch must be >= 1, not {self.expire_batch}")
        if self.flush_retries < 0 or self.flush_backoff_s < 0:
            raise ConfigError("flush_retries and flush_backoff_s must be >= 0")
        if not 1024 <= self.flush_chunk_bytes <= MAX_ARGUMENT_BYTES:
            raise ConfigError(
                f"flush_chunk_bytes must be in 1024..{MAX_ARGUMENT_BYTES} (Redis's default "
                f"proto-max-bulk-len), not {self.flush_chunk_bytes}"
            )
        if self.durability not in ("local", "replicated"):
            raise ConfigError(
                f"durability must be 'local' or 'replicated', not {self.durability!r}"
            )
        if self.driver_wait_s < 0:
            raise ConfigError(f"driver_wait_s must be >= 0, not {self.driver_wait_s}")
        if not self.replica_wait_s > 0:
            raise ConfigError(f"replica_wait_s must be > 0, not {self.replica_wait_s}")
        if self.segment_codec not in ("none", "lz4", "zstd"):
            raise ConfigError(
                f"segment_codec must be 'none', 'lz4' or 'zstd', not {self.segment_codec!r}"
            )
        if self.script_mode not in ("auto", "functions", "eval"):
            raise ConfigError(
                f"script_mode must be 'auto', 'functions' or 'eval', not {self.script_mode!r}"
            )
        if self.max_pending is not None and self.max_pending < 1:
            raise ConfigError(f"max_pending must be >= 1 or None, not {self.max_pending}")

    @property
    def rotation_interval_s(self) -> float:
        """T/(B-1): how often the timeout buckets rotate."""
        return self.timeout_s / (self.buckets - 1)

    @property
    def interval_ms(self) -> int:
        return max(1, round(self.rotation_interval_s * 1000))

    @property
    def enabled(self) -> bool:
        return self.status == "on"

    def summary(self) -> str:
        """One line for the log at start (never contains a password)."""
        from ftlayer.connection import redact_url

        return (
            f"namespace={self.namespace} status={self.status} shards={self.shards} "
            f"timeout_s={self.timeout_s:g} buckets={self.buckets} "
            f"max_replays={self.max_replays} max_pending={self.max_pending} "
            f"durability={self.durability} "
            f"redis={redact_url(self.redis_url) if self.redis_url else 'embedded'}"
        )
