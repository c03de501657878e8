"""Fault-tolerant PySpark ``foreachBatch`` pipelines: Storm-style guaranteed processing.

::

    ft = FaultTolerance(FTConfig(namespace="orders", redis_url=url))
    pipeline = (ft.pipeline(source=0)
                .map_batches(price, "id long, customer long, total double")
                .partition_by(["customer"], 8)
                .sink_batches(write))
    query = stream.writeStream.foreachBatch(pipeline).start()
    ...
    report = ft.drain(timeout_s=60, query=query)

Invariants:

* A batch function returns only after every task of its Spark job finished and the batch
  was settled, so Spark commits the batch's offsets only when each of its records is
  complete or persisted with a live timeout (invariant 1).
* Every record is acked only after its stages returned and the sink's write returned (a
  ``sink_dataframe``'s write: its function returned). A
  failing record (an ``Outcome``'s ``failed`` rows, a row that makes a stage raise,
  ``FailRecord`` in a row stage) is failed with its error text in its failure history and
  replayed in a later batch under a new id, or dead-lettered after ``max_replays``; it is
  never acked to make a problem go away.
* Of Spark's attempts of a task, exactly one counts (invariant 11): the vectorized path
  reads the summaries of the attempts whose rows were consumed (ftlayer.spark.vector_tasks).
* Only msgpack (and Arrow IPC segments) reach Redis; executors rebuild their Redis client
  from the config (ftlayer.spark.worker); no live client is pickled.

Modules: ``driver`` (FaultTolerance), ``pipeline`` (the builder), ``replay_stream``
(replays as a Spark streaming source), ``references`` (sources kept by reference:
FileSource, ReplayableSource), ``kafka`` (KafkaSource: Kafka kept by reference, and
ftlayer's own Kafka streaming source), ``replay_rows`` (claimed replays as Arrow rows), ``plan``
(what tasks run), ``outcome`` (per-row outcomes, bisection), ``vector_tasks`` / ``batch_scope`` (the
vectorized path: executors / driver), ``frame_run`` / ``frame_tasks`` (DataFrame stages and
``sink_dataframe``: the batch as the user's Spark plan, failures observed; Python stages and
copies among them), ``row_stages`` (row stages compiled to batch stages),
``row_tasks`` (``ack_scope="task"``: row stages over ``df.rdd``), ``policy``
(ErrorPolicy: retries, backoff, dead-letter types; stage contexts), ``dead_letter_feed``
(``on_dead_letter`` callbacks), ``preflight`` (once per application: executors import
ftlayer, an embedded Redis only under a local master), ``progress`` (a
StreamingQueryListener joining Spark's progress with the batch results), ``standalone``
(a Spark standalone cluster on loopback, for tests and benchmarks), ``results``.
"""

from ftlayer.requirements import require_pyspark

require_pyspark()  # before anything imports pyspark: one line, not an ImportError's trace

from typing import TYPE_CHECKING, Any  # noqa: E402

_PUBLIC = {
    "FaultTolerance": "driver", "Outcome": "outcome", "StageContractError": "outcome",
    "OnError": "pipeline", "Pipeline": "pipeline", "UNCONFIRMED": "plan",
    "Unconfirmed": "plan", "BatchContext": "policy", "ErrorPolicy": "policy",
    "RecordContext": "policy", "BatchProgress": "progress", "FileSource": "references",
    "RateMicroBatchSource": "references", "ReplayableSource": "references",
    "KafkaSource": "kafka", "BatchResult": "results", "DrainResult": "results",
    "StageCounts": "results",
}  # fmt: skip
"""The public names, each imported from its module when first used: a process that needs
one part (the replay stream's reader, started by Spark for every query) does not import
the rest."""


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        import importlib

        value = getattr(importlib.import_module(f"ftlayer.spark.{_PUBLIC[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ftlayer.spark' has no attribute {name!r}")


if TYPE_CHECKING:
    from ftlayer.spark.driver import FaultTolerance
    from ftlayer.spark.kafka import KafkaSource
    from ftlayer.spark.outcome import Outcome, StageContractError
    from ftlayer.spark.pipeline import OnError, Pipeline
    from ftlayer.spark.plan import UNCONFIRMED, Unconfirmed
    from ftlayer.spark.policy import BatchContext, ErrorPolicy, RecordContext
    from ftlayer.spark.progress import BatchProgress
    from ftlayer.spark.references import FileSource, RateMicroBatchSource, ReplayableSource
    from ftlayer.spark.results import BatchResult, DrainResult, StageCounts

__all__ = [
    "UNCONFIRMED",
    "BatchContext",
    "BatchProgress",
    "BatchResult",
    "DrainResult",
    "ErrorPolicy",
    "FaultTolerance",
    "FileSource",
    "KafkaSource",
    "OnError",
    "Outcome",
    "Pipeline",
    "RateMicroBatchSource",
    "RecordContext",
    "ReplayableSource",
    "StageContractError",
    "StageCounts",
    "Unconfirmed",
]
