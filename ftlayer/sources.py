"""Which pipeline owns each source of a namespace.

A source's replays are claimed by whatever runs a batch of that source index: two jobs on
one namespace with the same index (the defaults, ``namespace="ftlayer"`` and
``source=0``) would take each other's replays into their own stages and sink, and count
them complete. So the first pipeline that runs a source stores its identity -- its name
(or the Spark application's), its source schema and, for Kafka, its topics -- in
``ft:{<ns>}:sources`` (``HSETNX``: two first runs racing agree on one), and every later
one compares: another pipeline is refused with one line naming both, before it claims
anything.

Invariant: a source's replays only ever enter batches of the pipeline that persisted
them, unless an operator hands the source over (``ftlayer sources --forget N``, refused
while any of its records is pending).
"""

from __future__ import annotations

from typing import Any, cast

from ftlayer.errors import ConfigError
from ftlayer.keys import Keyspace

__all__ = ["claim_source", "forget_source", "source_identity", "sources"]


def source_identity(pipeline: str, schema: Any, reads: Any = None) -> str:
    """``<pipeline> @ <schema>``: the schema as Spark prints it (names and types); and
    `` @ <what it reads>`` for a source kept by reference that names it (``identity``: a
    KafkaSource's topics): a pipeline pointed at other topics is another pipeline, and
    its replays' references would name records it cannot read."""
    own = getattr(reads, "identity", None)
    return f"{pipeline} @ {schema.simpleString()}" + (f" @ {own}" if own else "")


def claim_source(client: Any, namespace: str, source: int, identity: str) -> None:
    """Record ``identity`` as the owner of ``source`` if it has none; ConfigError if
    another pipeline owns it."""
    key = Keyspace(namespace, 1).sources
    with client.pipeline(transaction=False) as pipe:
        pipe.hsetnx(key, str(source), identity)
        pipe.hget(key, str(source))
        owner = cast(bytes, pipe.execute()[-1]).decode()
    if owner != identity:
        raise ConfigError(
            f"source {source} of namespace {namespace!r} belongs to pipeline [{owner}]; "
            f"this is [{identity}]: its replays would go to the wrong job. Use another "
            f"source= or namespace, give both the same name=, or hand the source over with "
            f"'ftlayer sources --namespace {namespace} --forget {source}' once it is drained"
        )


def sources(client: Any, namespace: str) -> dict[int, str]:
    """Every source of ``namespace`` with the identity of the pipeline that owns it."""
    raw = client.hgetall(Keyspace(namespace, 1).sources)
    return {int(k): v.decode() for k, v in sorted(raw.items(), key=lambda kv: int(kv[0]))}


def forget_source(client: Any, namespace: str, source: int, pending: int) -> bool:
    """Drop the owner of ``source`` (the next pipeline to run it becomes its owner).
    Refused while ``pending`` of its records are in flight: they belong to the old
    owner. False if it had none."""
    if pending:
        raise ConfigError(
            f"source {source} of namespace {namespace!r} has {pending} pending records: "
            "drain its pipeline first (they would replay into the next owner's stages)"
        )
    return bool(client.hdel(Keyspace(namespace, 1).sources, str(source)))
