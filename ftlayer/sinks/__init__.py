"""Idempotent sinks: each keeps one row per source record, by its lineage id.

A record that reached the sink and comes back -- a replay after its sink write was not
confirmed, a micro-batch re-run after a driver crash, a retried task, a re-driven dead
letter -- carries the lineage id it had the first time (ftlayer.lineage), so a sink that
inserts only rows whose lineage id it does not hold yet writes every record once::

    pipeline = (ft.pipeline(source=0, reads=events)
                .map_batches(parse, "id long, amount double")
                .sink_batches(PostgresSink(url, "payments")))     # or DeltaSink(path)

Both are ``sink_batches`` functions (run on executors, one transaction per Arrow batch)
that ask for the lineage column themselves (``ft_lineage``). The key is the lineage
column, plus any columns ``key=`` adds (a stage that makes several rows of one record
adds their ordinal). Modules: ``keyed`` (what both share: the key, retries, counts),
``postgres`` (``INSERT ... ON CONFLICT DO NOTHING``), ``delta`` (first writes appended,
the rest merged, through delta-rs).
"""

from ftlayer.sinks.delta import DeltaSink
from ftlayer.sinks.postgres import PostgresSink

__all__ = ["DeltaSink", "PostgresSink"]
