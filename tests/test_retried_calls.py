"""``claim``, ``fail`` and ``dlq replay`` carry no idempotency token,
so a call retried after its reply was lost applies twice. ftlayer now retries each of
them on a lost connection (as it does flushes), so each is tested through a real TCP proxy
that lets Redis run the call and drops its one reply.

* ``claim``: confirmed and fixed. A retry popped the next records while the first ones
  stayed claimed by nobody until their timeout (burning an attempt each); without a
  retry, a lost reply failed the batch the same way. Now a claim carries a token and a
  retry gets the same records back (breaking the token check in claim.lua fails the first
  test).
* ``fail`` and ``dlq replay``: refuted. Both retire what they act on (the failed source
  id, the dead letter), so a retry finds nothing left to apply twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from ftlayer import FTConfig, FTLayer
from ftlayer.scripts import script_source
from tests.faults import ScriptCalls, TcpProxy


@pytest.fixture
def pair(script_calls: ScriptCalls) -> Iterator[tuple[FTLayer, FTLayer, TcpProxy]]:
    """(truth: a direct layer, flaky: the same namespace through the proxy, the proxy);
    the scripts called by EVALSHA, then by FCALL."""
    server = script_calls.server
    cfg = FTConfig(namespace=f"rc{uuid.uuid4().hex[:8]}", shards=1, max_replays=3,
                   script_mode=script_calls.script_mode)  # type: ignore[arg-type]
    truth = FTLayer(server.client(), cfg)  # functions: the library is loaded now
    for name in ("claim", "fail", "dlq_replay"):  # loaded: the swallowed reply is a result
        truth.client.script_load(script_source(name))
    with TcpProxy(server.port, marker=script_calls.marker, limit=1) as proxy:
        flaky = FTLayer(redis.Redis.from_url(proxy.url), cfg)
        yield truth, flaky, proxy
    truth.clear()


def _queued(truth: FTLayer, n: int) -> list[int]:
    h = truth.handler()
    rids = [h.persist_record({"i": i}, source=0) for i in range(n)]
    h.flush()
    truth.fail(rids, error="first")
    return [r.source_id for r in rids]


def test_a_claim_retried_after_a_lost_reply_hands_out_the_same_records(pair) -> None:
    truth, flaky, proxy = pair
    _queued(truth, 20)
    proxy.mode = "swallow_replies"
    claimed = flaky.claim_replays(source=0, limit=8)
    assert proxy.swallowed == 1, "no reply was lost"
    st = truth.stats()
    assert st.queued_replays == 12, "a retried claim popped more records than it handed out"
    assert len(claimed) == 8 and st.pending == 20
    again = truth.claim_replays(source=0, limit=100)
    assert {c.record_id.source_id for c in claimed}.isdisjoint(
        {c.record_id.source_id for c in again})  # fmt: skip
    assert len(again) == 12


def test_a_fail_retried_after_a_lost_reply_is_applied_once(pair) -> None:
    truth, flaky, proxy = pair
    h = truth.handler()
    rid = h.persist_record({"i": 1}, source=0)
    h.flush()
    proxy.mode = "swallow_replies"
    flaky.fail([rid], error="once")
    assert proxy.swallowed == 1
    st = truth.stats()
    assert (st.failed_explicit, st.queued_replays, st.pending) == (1, 1, 1), st
    [replay] = truth.claim_replays(source=0, limit=10)
    assert len(truth.persistence.history(replay.record_id.source_id)) == 1


def test_a_dlq_replay_retried_after_a_lost_reply_redrives_once(pair) -> None:
    truth, flaky, proxy = pair
    srcs = _queued(truth, 3)
    for _ in range(3):  # budget 3: the fourth failure dead-letters them
        for c in truth.claim_replays(source=0, limit=10):
            truth.fail([c.record_id], error="again")
    assert truth.stats().dead_letters == 3 and srcs
    proxy.mode = "swallow_replies"
    assert flaky.dlq_replay([d.source_id for d in truth.persistence.dead_letters()]) in (0, 3)
    assert proxy.swallowed == 1
    st = truth.stats()
    assert (st.dead_letters, st.queued_replays, st.redriven) == (0, 3, 3), st
