"""The XOR algebra as properties, through the real handler API into a real Redis.

A record tree is processed by several tasks; each task flushes once with its combined
deltas; the flushes land in any order. Invariants 2 and 3: the record completes exactly
when the last flush lands -- never before, whether an ack beats its init or a sibling's
emit -- and re-applying one task's delta (a Spark task retry) never completes it early.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftlayer import FTConfig, FTHandler, FTLayer, RecordId

SETTINGS = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@dataclass
class Node:
    children: list[Node]


def trees(max_depth: int = 3) -> st.SearchStrategy[Node]:
    leaf = st.just(None).map(lambda _: Node([]))
    return st.recursive(leaf, lambda inner: st.lists(inner, max_size=3).map(Node), max_leaves=8)


def count_nodes(node: Node) -> int:
    return 1 + sum(count_nodes(c) for c in node.children)


def run_tree(layer: FTLayer, tree: Node, assignment: list[int], n_tasks: int):
    """Handler calls for the whole tree. Node i (pre-order) is processed by task
    assignment[i]; task 0 is the source task and also persists the root. Returns the
    handlers (flushed by the caller) and the root's RecordId."""
    handlers = [layer.handler(partition=t) for t in range(n_tasks)]
    root = handlers[0].persist_record({"tree": "root"}, hash_code=1, source=0)
    order = iter(range(10_000))

    def process(node: Node, rid: RecordId) -> None:
        h = handlers[assignment[next(order)]]
        kids = [h.emit(rid) for _ in node.children]
        h.ack(rid)
        for child, kid in zip(node.children, kids, strict=True):
            process(child, kid)

    process(tree, root)
    return handlers, root


def fresh_layer(client: redis.Redis) -> FTLayer:
    return FTLayer(client, FTConfig(namespace=f"x{uuid.uuid4().hex[:12]}", shards=4))


@SETTINGS
@given(data=st.data(), tree=trees(), n_tasks=st.integers(1, 4))
def test_completes_exactly_when_the_last_flush_lands(redis_client, data, tree, n_tasks):
    layer = fresh_layer(redis_client)
    try:
        n = count_nodes(tree)
        assignment = data.draw(st.lists(st.integers(0, n_tasks - 1), min_size=n, max_size=n))
        handlers, root = run_tree(layer, tree, assignment, n_tasks)
        involved = set(assignment) | {0}  # tasks with work under this record
        order = data.draw(st.permutations(range(n_tasks)))
        landed: set[int] = set()
        for t in order:
            handlers[t].flush()
            landed.add(t)
            done = layer.stats().completed
            assert done == (1 if involved <= landed else 0), (
                f"completed={done} after flushes {sorted(landed)} of involved {sorted(involved)}"
            )
        s = layer.stats()
        assert s.completed == 1 and s.pending == 0 and s.persisted == 1
        assert layer.acker.size() == 0, "the acker table drains to empty"
        assert layer.persistence.get(root.source_id) is None
    finally:
        layer.clear()


@SETTINGS
@given(data=st.data(), tree=trees(), n_tasks=st.integers(2, 4))
def test_a_task_delta_applied_twice_never_completes_early(redis_client, data, tree, n_tasks):
    layer = fresh_layer(redis_client)
    try:
        n = count_nodes(tree)
        assignment = data.draw(st.lists(st.integers(0, n_tasks - 1), min_size=n, max_size=n))
        handlers, _root = run_tree(layer, tree, assignment, n_tasks)
        twice = data.draw(st.integers(1, n_tasks - 1))  # a non-source task, as a retry is
        src = _root.source_id
        contrib = [h.pending_deltas().get(src, 0) for h in handlers]  # each task's XOR for the root
        if contrib[0] == 0 or contrib[twice] == 0:
            return  # completed inside the source task, or that task had nothing under it
        batches = [h.pending_batches() for h in handlers]
        order = data.draw(st.permutations([*range(n_tasks), twice]))
        # the model: the record completes at the first moment its init (task 0) has landed
        # and the XOR of everything landed is 0; later deltas are orphans
        value, inited, done_at = 0, False, None
        for step, t in enumerate(order):
            value ^= contrib[t]
            inited = inited or t == 0
            if inited and value == 0:
                done_at = step
                break
        for step, t in enumerate(order):
            layer.acker.apply(batches[t], token=os.urandom(8).hex())  # each task its own work
            done = done_at is not None and step >= done_at
            stored = 0 in order[: step + 1]  # pending counts a record once its init landed
            s = layer.stats()
            want = (1, 0) if done else (0, int(stored))
            assert (s.completed, s.pending) == want, (step, done_at, order)
        # complete only if every task landed once before the duplicate; otherwise the
        # duplicate's delta stays in (never zero): pending, it will time out and replay
        involved = {t for t in range(n_tasks) if contrib[t]}
        if done_at is not None:
            assert involved <= set(order[: done_at + 1]), "completed before every delta"
    finally:
        layer.clear()


def test_ack_before_init_does_not_complete(layer: FTLayer) -> None:
    source, task = layer.handler(), layer.handler()
    rid = source.persist_record("r", source=0)
    task.ack(rid)  # the consumer acks and flushes before the source's init lands
    task.flush()
    entry = layer.acker.entry(rid.source_id)
    assert entry is not None and not entry.inited and entry.value == rid.current_id
    assert layer.stats().completed == 0
    source.flush()
    assert layer.stats().completed == 1 and layer.acker.size() == 0


def test_ack_before_sibling_emit_does_not_complete(layer: FTLayer) -> None:
    source, mapper, sink_a, sink_b = (layer.handler() for _ in range(4))
    root = source.persist_record("r", source=0)
    a, b = mapper.emit(root), mapper.emit(root)
    mapper.ack(root)
    sink_a.ack(a)
    sink_b.ack(b)
    source.flush()
    sink_a.flush()  # a's ack lands before the mapper's emit of its sibling b
    sink_b.flush()
    assert layer.stats().completed == 0
    mapper.flush()
    assert layer.stats().completed == 1


def test_one_delta_per_source_id_per_flush(layer: FTLayer) -> None:
    """Invariant 3: the flush carries one combined delta per source id."""
    source = layer.handler()
    roots = [source.persist_record(i, source=0) for i in range(50)]
    source.flush()
    task = layer.handler()
    assert isinstance(task, FTHandler)
    for r in roots:
        with task.processing(r):
            for _ in range(5):
                task.emit()
    batches = task.pending_batches()
    srcs = [int(s) for b in batches.values() for s in b.xor_srcs]
    assert sorted(srcs) == sorted(r.source_id for r in roots)
    assert sum(b.empty is False for b in batches.values()) == len(batches)
