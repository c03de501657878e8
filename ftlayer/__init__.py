"""ftlayer: record-level, Storm-style guaranteed processing for PySpark streaming.

Every source record gets a 64-bit RecordId and is persisted in Redis; every emit
and every ack XORs a current id into its source record's ack value, so a record is
complete exactly when that value returns to 0. What does not complete in time, or fails
explicitly, is replayed under a new id -- or dead-lettered, never silently acked.

Where each concept of the design lives (``serialization/`` frames records,
``partitioners/`` mirrors Spark's placement; both are used by ``ftlayer``, never the reverse):

* RecordId, id generation (source ids in buckets), the shard rule, batch-local ids and
  edge hashes: ``ids.py``; the storage layout (buckets of entries and frames, timeout
  sets of buckets): ``lua/_common.lua``, ``docs/storage-layout.md``
* Anchoring, emit, ack, fail, the per-flush XOR fold (the handler a task uses):
  ``handler.py``; the AckerTable in Redis and its flush: ``acker.py``, ``lua/flush.lua``
* Persister / PersistenceLayer (records, replay queues, claims, dead letters):
  ``persistence.py``, ``lua/claim.lua``, ``lua/fail.lua``, ``lua/dlq_replay.lua``
* RotatingHashMap (in-process) and the timeout buckets in Redis (rotate, expire,
  resetTimeout): ``rotating.py``, ``timeouts.py``, ``lua/expire.lua``,
  ``lua/reset_timeout.lua``
* Fail and replay with a new source id, the replay budget, dead-lettering:
  ``lua/_common.lua`` (``fail_records``)
* Batch-scope acking of the vectorized path (segments, summaries, settlement):
  ``segments.py``, ``lua/segment_*.lua``, ``spark/batch_scope.py``, ``spark/vector_tasks.py``
* Replays as a Spark streaming source (offsets in the checkpoint, claims by token):
  ``spark/replay_stream.py``; sources kept by reference (file and row hash, read back):
  ``spark/references.py``; which pipeline owns a source: ``sources.py``
* DataFrame stages and ``df.write`` sinks (the batch as the user's Spark plan, failed rows
  collected by Spark's observations): ``spark/frame_run.py``, ``spark/frame_tasks.py``
* Lineage ids (one per source record, the same through every replay and re-drive):
  ``lineage.py``; idempotent sinks keeping one row per lineage id (Delta Lake,
  PostgreSQL): ``sinks/``
* What a run of scripts did: ``tally.py``; retries and their backoff: ``backoff.py``,
  ``connection.py``, ``scripts.py``; a Redis Cluster client that waits out failovers:
  ``cluster.py``
* ReplayPartitioner: ``partitioners/`` (used by ``spark/row_tasks.py``)
* FT status on/off and every setting: ``config.py``; limits shared with the Lua:
  ``limits.py``; per-namespace settings kept in Redis and the eviction policy it needs:
  ``settings.py``; keys: ``keys.py``; the version: ``version.py``; what PySpark ftlayer
  needs (the user's own): ``requirements.py``
* The FT layer as one object (handlers, stats, drain): ``layer.py``
* The Spark wrapper (pipelines, stages, outcomes, error policy, contexts,
  ``on_dead_letter``): ``spark/`` (see its package docstring); the checks an application
  gets before its first batch (executors import ftlayer, Redis reachable): ``spark/preflight.py``
* The sidecar (rotation lease, metrics, health, status page): ``service/``; dead
  letters for people (previews, newest first): ``deadletters.py``
* The command line (``ftlayer demo|serve|stats|status|dlq|...``): ``cli/``; the demo:
  ``demo.py`` (its screen: ``cli/demo_view.py``)
* An embedded ``redis-server`` for tests and the demo: ``embedded.py``
* Record payloads (msgpack, Arrow types): ``payloads.py``; errors: ``errors.py``; log
  format (text or JSON): ``logs.py``
"""

from ftlayer.config import FTConfig, FTStatus
from ftlayer.embedded import EmbeddedRedis
from ftlayer.errors import (
    ConfigError,
    EmbeddedRedisError,
    FailRecord,
    FlushError,
    FTLayerError,
    RecordError,
    RedisUnavailableError,
)
from ftlayer.handler import AbstractFTHandler, FTHandler, NonFTHandler
from ftlayer.ids import RecordId
from ftlayer.layer import FTLayer, FTStats
from ftlayer.persistence import ClaimedRecord, DeadLetter, Failure
from ftlayer.rotating import RotatingHashMap
from ftlayer.version import __version__

__all__ = [
    "AbstractFTHandler",
    "ClaimedRecord",
    "ConfigError",
    "DeadLetter",
    "EmbeddedRedis",
    "EmbeddedRedisError",
    "FTConfig",
    "FTHandler",
    "FTLayer",
    "FTLayerError",
    "FTStats",
    "FTStatus",
    "FailRecord",
    "Failure",
    "FlushError",
    "NonFTHandler",
    "RecordError",
    "RecordId",
    "RedisUnavailableError",
    "RotatingHashMap",
    "__version__",
]
