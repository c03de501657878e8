"""Dead letters for people: a decoded payload preview, JSON with every attempt, and the
newest ones first (for ``ftlayer dlq`` and the sidecar's status page).

The newest are read from the per-shard dead-letter log (the capped stream every
dead-lettering appends to, see lua/core/failures.lua ``log_dead_letter``): a few entries per
shard instead of the whole dead-letter hash.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, cast

from ftlayer.persistence import DeadLetter
from ftlayer.stage_rows import decode_for_people

if TYPE_CHECKING:
    from ftlayer.layer import FTLayer

__all__ = ["dead_letter_dict", "decoded", "iso_time", "newest_dead_letters", "preview"]


def decoded(d: DeadLetter) -> tuple[Any, str | None]:
    """(the decoded record -- a stage row as ftlayer.stage_rows.decode_for_people reads
    it --, None) or (None, why it does not decode)."""
    if d.frame is None:
        return None, d.frame_error or "no frame"
    try:
        return decode_for_people(d.frame), None
    except Exception as e:  # noqa: BLE001 -- shown to the operator, never raised
        return None, f"payload does not decode: {e}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def preview(d: DeadLetter, width: int = 60) -> str:
    """The decoded payload as one line of JSON, cut to ``width`` (or why it does not
    decode, in angle brackets)."""
    record, error = decoded(d)
    text = f"<{error}>" if error else json.dumps(_jsonable(record), default=repr)
    return text if len(text) <= width else text[: width - 1] + "…"


def iso_time(ms: int) -> str:
    """A Redis clock time in ms as ISO 8601 UTC, to the second."""
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="seconds")


def dead_letter_dict(d: DeadLetter, payload: bool = True) -> dict[str, Any]:
    """One dead letter as JSON: ids, source, placement, the decoded payload (or the raw
    bytes in hex and why they do not decode), and every attempt with time and error."""
    f = d.frame
    out: dict[str, Any] = {
        "id": f"{d.source_id:016x}",
        "source": f.source if f else None,
        "payload_bytes": len(f.payload) if f else len(d.raw),
        "hash_code": f.hash_code if f else None,
        "partition": f.partition if f else None,
        "frame_error": d.frame_error,
        "attempts": d.attempts,
        "dead_lettered_ms": d.time_ms,
        "dead_lettered": iso_time(d.time_ms),
        "reason": d.history[-1].reason if d.history else None,
        "error": d.history[-1].error if d.history else None,
        "history": [
            {"reason": h.reason, "time_ms": h.time_ms, "time": iso_time(h.time_ms),
             "attempt": h.attempt, "error": h.error}
            for h in d.history
        ],
    }  # fmt: skip
    if payload:
        record, error = decoded(d)
        out["payload"] = _jsonable(record)
        out["payload_error"] = error
        if error:
            out["raw_hex"] = (f.payload if f else d.raw).hex()
    return out


def newest_dead_letters(layer: FTLayer, limit: int) -> list[DeadLetter]:
    """Up to ``limit`` dead letters still held, newest first (re-driven or purged ones,
    still in the log, are skipped)."""
    entries: list[tuple[bytes, int]] = []
    for shard in layer.keyspace.shards:
        raw = layer.client.xrevrange(shard.dlqlog, "+", "-", count=limit * 2)
        for entry_id, fields in cast(list[tuple[bytes, dict[bytes, bytes]]], raw):
            entries.append((entry_id, int.from_bytes(fields[b"src"], "big")))
    entries.sort(key=lambda e: tuple(int(x) for x in e[0].split(b"-")), reverse=True)
    out: list[DeadLetter] = []
    seen: set[int] = set()
    for _, src in entries:
        if src in seen:
            continue
        seen.add(src)
        letter = layer.persistence.dead_letter(src)
        if letter is not None:
            out.append(letter)
            if len(out) == limit:
                break
    return out
