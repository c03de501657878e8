"""ftlayer's exceptions: one root, domain subclasses, Redis errors wrapped with ``from``."""

from __future__ import annotations

from serialization.errors import FrameError

__all__ = [
    "ConfigError",
    "EmbeddedRedisError",
    "FTLayerError",
    "FailRecord",
    "FlushError",
    "FrameError",
    "RecordError",
    "RedisUnavailableError",
]


class FTLayerError(Exception):
    """Root of every error ftlayer raises on purpose."""


class ConfigError(FTLayerError, ValueError):
    """An inconsistent or invalid FTConfig / command-line setting."""


class RecordError(FTLayerError, ValueError):
    """One record cannot be taken in (too large, wrong key type, unknown source, ...).

    The message names the record; nothing else in its batch is affected.
    """


class FailRecord(FTLayerError):  # noqa: N818 -- the seed's name (FailException)
    """Raised from a record function to fail that record explicitly.

    It is replayed later under a new source id, or dead-lettered after ``max_replays``.
    """


class RedisUnavailableError(FTLayerError, ConnectionError):
    """Redis could not be reached after the configured retries."""


class FlushError(RedisUnavailableError):
    """A task's flush did not reach Redis; the task must fail (Spark re-runs it)."""


class EmbeddedRedisError(FTLayerError, RuntimeError):
    """The embedded redis-server could not be found or started."""


def interrupted(exc: BaseException) -> bool:
    """True when ``exc`` is, or was raised while handling, a Ctrl-C.

    A ``KeyboardInterrupt`` that lands inside a py4j call is re-raised by py4j as a
    ``Py4JError`` ("Gateway must be connected ...") with the interrupt as its context: the
    user still pressed Ctrl-C, and a command reports it as such (exit 130), not as a crash.
    """
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ if e.__cause__ is not None else (
            None if e.__suppress_context__ else e.__context__)  # fmt: skip
    return False
