"""ftlayer: record-level, Storm-style guaranteed processing for PySpark streaming.

Every source record gets a 64-bit RecordId and is persisted in Redis; every emit
and every ack XORs a current id into its source record's ack value, so a record is
complete exactly when that value returns to 0. What does not complete in time, or fails
explicitly, is replayed under a new id -- or dead-lettered, never silently acked.

docs/architecture.md is the map: the data model, the numbered invariants the code cites,
both ack paths, the replay paths, and every module of ``ftlayer``, ``partitioners`` and
``serialization`` (checked by tests/test_layout.py).
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
    "__version__",
]
