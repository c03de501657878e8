"""A model-based test of the whole protocol: a hypothesis state machine drives
real handlers against a real Redis -- record trees of random shape, explicit fails,
dropped work, flushes whose reply is lost and retried (through a loopback proxy that
swallows it), a task's flush re-sent under its token, a task re-run with fresh ids after
its first attempt's flush landed, expiry, claims of replays, dead letters and their
re-drive -- and checks after every step that each source record is exactly one of:
pending (queued for replay or not), complete, dead-lettered. Never gone, never complete
while any of its work is unacked.

The model keeps, per record (its payload ``{"k": key}``), the children still unacked and
whether a re-run task doubled an ack (then only a timeout ends it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ftlayer import EmbeddedRedis, FTConfig, FTLayer, RecordId
from ftlayer.handler import AbstractFTHandler
from tests.faults import ScriptCalls, TcpProxy, stored_ids

pytestmark = pytest.mark.slow

T = 0.05  # record timeout
MAX_REPLAYS = 2


@dataclass
class Rec:
    status: str = "pending"  # pending | queued | complete | dead
    open: list[RecordId] = field(default_factory=list)  # emitted, not yet acked
    stuck: bool = False  # an ack landed twice: only a timeout ends this attempt
    failures: int = 0  # since the last re-drive


def machine(server: EmbeddedRedis, proxy: TcpProxy,
            script_mode: str = "auto") -> type[RuleBasedStateMachine]:  # fmt: skip
    class Protocol(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            config = FTConfig(
                namespace=f"m{uuid.uuid4().hex[:10]}",
                shards=2,
                timeout_s=T,
                max_replays=MAX_REPLAYS,
                flush_retries=3,
                flush_backoff_s=0.01,
                script_mode=script_mode,  # type: ignore[arg-type]
            )
            self.layer = FTLayer(server.client(), config)
            self.lossy = FTLayer(proxy_client(proxy), config)  # replies may be swallowed
            self.recs: dict[int, Rec] = {}
            self.next_key = 0

        def teardown(self) -> None:
            self.layer.clear()
            self.lossy.client.close()

        # -- helpers ------------------------------------------------------------------
        def _open(self) -> list[int]:
            return [k for k, r in self.recs.items() if r.status == "pending" and r.open]

        def _start(self, h: AbstractFTHandler, key: int, rid: RecordId) -> None:
            """A source task emits one child of ``rid`` and acks it."""
            with h.processing(rid):
                self.recs[key].open = [h.emit()]
            self.recs[key].stuck = False

        def _retire(self, key: int) -> None:
            r = self.recs[key]
            r.failures += 1
            r.open, r.stuck = [], False
            r.status = "dead" if r.failures > MAX_REPLAYS else "queued"

        # -- rules ---------------------------------------------------------------------
        @rule(n=st.integers(1, 4))
        def persist(self, n: int) -> None:
            h = self.layer.handler()
            for _ in range(n):
                key, self.next_key = self.next_key, self.next_key + 1
                self.recs[key] = Rec()
                self._start(h, key, h.persist_record({"k": key}, source=0))
            h.flush()

        @precondition(lambda self: self._open())
        @rule(data=st.data(), fanout=st.integers(0, 2), how=st.sampled_from(
            ["ack", "ack", "fail", "lost_reply", "resent", "rerun"]))  # fmt: skip
        def process(self, data: st.DataObject, fanout: int, how: str) -> None:
            key = data.draw(st.sampled_from(self._open()))
            r = self.recs[key]
            child = r.open.pop(data.draw(st.integers(0, len(r.open) - 1)))
            h = (self.lossy if how == "lost_reply" else self.layer).handler()
            if how == "fail":
                h.fail(child, "boom")
                h.flush()
                self._retire(key)
                return
            with h.processing(child):
                kids = [h.emit() for _ in range(fanout)]
            if how == "lost_reply":  # Redis runs the flush, the reply is lost, it retries
                proxy.swallowed, proxy.mode = 0, "swallow_replies"
                try:
                    h.flush()
                finally:
                    proxy.mode = "forward"
                assert proxy.swallowed == 1
            elif how == "resent":  # the same work sent again under its token: no change
                batches = h.pending_batches()  # (what flush() would freeze)
                token = uuid.uuid4().hex
                self.layer.acker.apply(batches, token=token)
                self.layer.acker.apply(batches, token=token)
            else:
                h.flush()
            if how == "rerun":  # its output was lost; Spark's retry acks the input again
                done_by_first = not kids and not r.open and not r.stuck
                again = self.layer.handler()
                with again.processing(child):
                    kids = [again.emit() for _ in range(fanout)]
                again.flush()
                if done_by_first:  # the first attempt completed it: the retry is orphans
                    r.status = "complete"
                    return
                r.stuck = True  # the first attempt's children never arrive
            r.open.extend(kids)
            if not r.open and not r.stuck:
                r.status = "complete"

        @precondition(lambda self: self._open())
        @rule(data=st.data())
        def drop(self, data: st.DataObject) -> None:
            """A child is lost (its task's output never arrives): only a timeout helps."""
            key = data.draw(st.sampled_from(self._open()))
            r = self.recs[key]
            r.open.pop(data.draw(st.integers(0, len(r.open) - 1)))
            r.stuck = True

        @rule()
        def time_passes_and_expiry_runs(self) -> None:
            time.sleep(2.5 * T)
            due = [k for k, r in self.recs.items() if r.status == "pending"]
            res = self.layer.expire_due()
            assert res.timed_out == len(due)
            for k in due:
                self._retire(k)

        @precondition(lambda self: any(r.status == "queued" for r in self.recs.values()))
        @rule()
        def claim(self) -> None:
            h = self.layer.handler()
            claimed = self.layer.claim_replays(0, 1000)
            assert len(claimed) == sum(r.status == "queued" for r in self.recs.values())
            for c in claimed:
                key = c.frame.decode()["k"]
                assert self.recs[key].status == "queued"
                self.recs[key].status = "pending"
                self._start(h, key, c.record_id)
            h.flush()

        @precondition(lambda self: any(r.status == "dead" for r in self.recs.values()))
        @rule()
        def redrive(self) -> None:
            dead = [k for k, r in self.recs.items() if r.status == "dead"]
            assert self.layer.dlq_replay() == len(dead)
            for k in dead:
                self.recs[k].status, self.recs[k].failures = "queued", 0

        # -- the invariant ---------------------------------------------------------------
        @invariant()
        def every_record_is_exactly_one_thing(self) -> None:
            by = {s: {k for k, r in self.recs.items() if r.status == s}
                  for s in ("pending", "queued", "complete", "dead")}  # fmt: skip
            st_ = self.layer.stats()
            p = self.layer.persistence
            stored = {p.get(src).decode()["k"] for src in stored_ids(self.layer)}  # type: ignore[union-attr]
            dead = {d.frame.decode()["k"] for d in p.dead_letters() if d.frame}
            assert stored == by["pending"] | by["queued"], "a record vanished or reappeared"
            assert dead == by["dead"]
            assert st_.completed == len(by["complete"]), "completed early or never"
            assert (st_.pending, st_.queued_replays, st_.dead_letters) == (
                len(stored), len(by["queued"]), len(dead))  # fmt: skip
            for r in self.recs.values():  # Storm's ledger: the value is the XOR of what is open
                if r.status == "pending" and r.open and not r.stuck:
                    entry = self.layer.acker.entry(r.open[0].source_id)
                    want = 0
                    for c in r.open:
                        want ^= c.current_id
                    assert entry is not None and entry.value == want, "a delta landed twice"

    return Protocol


def proxy_client(proxy: TcpProxy):  # noqa: ANN201
    import redis

    return redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=2)


def test_the_protocol_never_loses_or_completes_early(script_calls: ScriptCalls) -> None:
    """Replies to EVALSHA, then to FCALL, swallowed at random moments."""
    from hypothesis.stateful import run_state_machine_as_test

    server = script_calls.server
    with TcpProxy(server.port, marker=script_calls.marker, limit=1) as proxy:
        run_state_machine_as_test(
            machine(server, proxy, script_calls.script_mode),
            settings=settings(
                max_examples=30,
                stateful_step_count=14,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
