"""Retrying a flush must never complete a record early.

A flush that Redis applied but whose reply was lost (a dropped connection, a ``WAIT``
that timed out) raises FlushError with the work kept; calling ``flush()`` again must not
apply it twice (the init XOR would cancel itself: the record would count as complete
before anyone processed it). The token belongs to the buffered work, not to the call.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from ftlayer import FlushError, FTConfig, FTLayer
from tests.faults import ScriptCalls, TcpProxy
from tests.toolkit import replica_linked, until


def _config(**kw: object) -> FTConfig:
    return FTConfig(namespace=f"fr{uuid.uuid4().hex[:8]}", **kw)  # type: ignore[arg-type]


def test_a_flush_retried_after_its_reply_was_lost_completes_nothing(
    script_calls: ScriptCalls,
) -> None:
    """The reproduction of the issue, through a real proxy that swallows Redis's reply (to
    an EVALSHA, and to an FCALL)."""
    server = script_calls.server
    cfg = _config(flush_retries=1, flush_backoff_s=0.01, script_mode=script_calls.script_mode)
    truth = FTLayer(server.client(), cfg)
    with TcpProxy(server.port, marker=script_calls.marker) as proxy:
        layer = FTLayer(redis.Redis.from_url(proxy.url, socket_timeout=5), cfg)
        h = layer.handler()
        first = h.persist_record({"n": 1}, source=0)
        h.flush()
        second = h.persist_record({"n": 2}, source=0)
        proxy.mode = "swallow_replies"
        with pytest.raises(FlushError, match="unreachable"):
            h.flush()
        assert proxy.swallowed >= 1, "the proxy never dropped a reply"
        assert truth.stats().pending == 2, "Redis applied the lost flush"
        assert h.pending_sources == 1, "the work is kept for a retry"
        proxy.mode = "forward"
        retry = h.flush()
        st = truth.stats()
        assert (st.completed, st.pending) == (0, 2), "completed early"
        assert retry.duplicates == 1 and retry.completed == 0
        assert h.pending_sources == 0
        # and the records still complete when their work is done
        sink = layer.handler()
        sink.ack(first)
        sink.ack(second)
        assert sink.flush().completed == 2
        assert truth.stats().pending == 0


def test_work_buffered_after_a_failed_flush_gets_a_token_of_its_own(
    script_calls: ScriptCalls,
) -> None:
    """The frozen work is resent under its token; what was added since is applied too
    (a token reused for different work would skip it)."""
    server = script_calls.server
    cfg = _config(flush_retries=0, flush_backoff_s=0.01, script_mode=script_calls.script_mode)
    truth = FTLayer(server.client(), cfg)
    with TcpProxy(server.port, marker=script_calls.marker) as proxy:
        h = FTLayer(redis.Redis.from_url(proxy.url, socket_timeout=5), cfg).handler()
        a = h.persist_record("a", source=0)
        h.flush()  # registers the scripts through the proxy
        h.ack(a)
        proxy.mode = "swallow_replies"
        with pytest.raises(FlushError):
            h.flush()  # applied: a is complete
        proxy.mode = "forward"
        b = h.persist_record("b", source=0)
        h.emit(b)  # b's child stays pending
        result = h.flush()
        assert result.duplicates == 1
        st = truth.stats()
        assert (st.completed, st.pending) == (1, 1), st


def test_a_flush_retried_after_wait_timed_out_completes_nothing(make_redis) -> None:
    """``durability="replicated"``: the master applied the flush, no replica confirmed it
    in time (FlushError). A replica then attaches; the retry must not apply it again."""
    master = make_redis()
    cfg = _config(durability="replicated", replica_wait_s=0.2)
    layer = FTLayer(master.client(), cfg)
    h = layer.handler()
    h.persist_record({"n": 1}, source=0)
    with pytest.raises(FlushError, match="no replica acknowledged"):
        h.flush()
    assert layer.stats().pending == 1, "the master applied it"
    replica = make_redis(extra_args=("--replicaof", "127.0.0.1", str(master.port)))
    until(lambda: replica_linked(replica), "the replica to sync", 15, 0.05)
    retry = h.flush()
    st = layer.stats()
    assert (st.completed, st.pending) == (0, 1), "completed early"
    assert retry.duplicates == 1 and retry.completed == 0
