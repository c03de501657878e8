"""Log output of the ``ftlayer`` command: text for people, JSON lines for collectors.

ftlayer's log messages are ``what happened key=value key=value``; the JSON format keeps
the sentence as ``message`` and lifts every ``key=value`` into a field of its own, so a
collector can filter on ``batch_id`` or ``error`` without parsing text.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import datetime, timezone

__all__ = ["JsonFormatter", "configure_logging"]

_PAIR = re.compile(r"(\w+)=('[^']*'|\"[^\"]*\"|\S+)")
_RESERVED = {"time", "level", "logger", "message", "exception"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the
    message's ``key=value`` pairs as fields, and the exception's text if any."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": text,
        }
        for key, value in _PAIR.findall(text):
            if key not in _RESERVED:
                out.setdefault(key, value.strip("'\""))
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(level: str = "INFO", fmt: str = "text") -> None:
    """Root logging to stderr at ``level`` in ``fmt`` ("text" or "json"), replacing any
    handler installed before (a second call reconfigures)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
