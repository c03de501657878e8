"""What one Spark ``Observation`` costs a micro-batch's job: the fixed price of the way
ftlayer learns, inside the sink's own job, which rows a stage failed.

A batch of DataFrame stages, or of Python stages ending in a DataFrame sink, is observed
once per stage that can fail a row (ftlayer.spark.frame_observations); with no such stage,
once at the sink's input. This measures that price alone, in one local[2] session, on the
job of ``stream_overhead``'s ``arrow`` pipeline over one micro-batch's input (a JSON file of
W-byte events, parsed and enriched by ``mapInArrow``, a keyed shuffle into 4 partitions, a
second ``mapInArrow``, appended as Parquet). Each ``mapInArrow`` answers as a Python stage
of ftlayer's does (its output and the outcome columns: identity, failed flag, error; no
row fails) and is filtered on the failed flag; three variants, each observed variant
beside a plain run of its own in every round (paired rounds, alternating which goes
first):

* ``plain``: not observed;
* ``count``: observed with one ``count(1)``;
* ``stage``: observed exactly as ftlayer observes a stage's failed rows
  (``frame_observations._observed_columns``: its row count, the failed rows' count, their
  identities and their distinct errors: a Python stage, or ``errors=`` a Column);
* ``stage_one_text``: as ftlayer observes a stage whose failed rows share one error text
  (``errors=`` a text, or none): no set of errors.

Per cadence (events per micro-batch): the median seconds of a job (``plain_s``,
``count_s``, ``stage_s``, ``stage_one_text_s``), ``ms_per_observation_<variant>``, the median of
the per-round extra times (variant minus its plain run) divided by the job's observations,
with quartiles; ``ratio_<variant>_vs_plain`` (plain time / variant time, the median of
the per-round ratios). A cost that does not grow with the events is paid per micro-batch:
what cutting observations out of a batch's plan would save. No goal rides on it.

    python -m benchmarks.observation_cost [--cadences 5000,50000] [--repeat 15] [--warmup 2]
        [--payload-bytes 1024] [--json] [--record | --results DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks._common import parse_args, provenance, save
from benchmarks._paired import PARTITIONS, PairedRounds, quartiles, spark_session
from benchmarks._wide import SCHEMA, write_events
from benchmarks.stream_overhead import ENRICHED, TAXED, arrow_enrich, arrow_vat
from ftlayer.spark.frame_tasks import outcome_fields

OBSERVED = 2
"""Observations per job in the ``count`` and ``stage`` variants: one per ``mapInArrow``."""
VARIANTS = ("count", "stage", "stage_one_text")
_DDL = {pa.int64(): "long", pa.bool_(): "boolean", pa.string(): "string", pa.int32(): "int"}


def observed(df: Any, variant: str) -> Any:
    """``df`` (a ``mapInArrow`` answer carrying ftlayer's outcome columns) observed as
    ``variant`` says, without the outcome columns (``plain``: not observed)."""
    from pyspark.sql import Observation
    from pyspark.sql import functions as F  # noqa: N812

    from ftlayer.spark.frame_observations import _observed_columns
    from ftlayer.spark.frame_tasks import ATTEMPTS_COL, DEAD_COL, ERROR_COL

    name = f"bench-{uuid.uuid4().hex[:12]}"
    outcome = [f.name for f in outcome_fields()]
    answer = "a stage's one error text" if variant == "stage_one_text" else \
        (F.col(ERROR_COL), F.col(DEAD_COL), F.col(ATTEMPTS_COL))
    aggregates, keep = _observed_columns(answer)
    if variant == "count":
        df = df.observe(Observation(name), F.count(F.lit(1)).alias("rows"))
    elif variant in ("stage", "stage_one_text"):
        df = df.observe(Observation(name), *aggregates)
    return df.filter(keep).drop(*outcome)


def answering(fn: Callable[[pa.RecordBatch], pa.RecordBatch]) -> Callable[..., Any]:
    """``fn`` as a ``mapInArrow`` function answering as a Python stage of ftlayer's does:
    its output and the outcome columns (``ftlayer.spark.frame_tasks.outcome_fields``; no row
    failed), in every variant alike."""
    fields = outcome_fields()

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            out, n = fn(b), b.num_rows
            ids = b.column(0)
            yield pa.RecordBatch.from_arrays(
                [*out.columns, ids, ids, pa.array(np.zeros(n, bool)), pa.nulls(n, pa.string()),
                 pa.array(np.zeros(n, bool)), pa.array(np.ones(n, np.int32))],
                schema=pa.schema([*out.schema, *fields]))  # fmt: skip

    return run


def _with_outcome(ddl: str) -> str:
    return ddl + ", " + ", ".join(f"{f.name} {_DDL[f.type]}" for f in outcome_fields())


def job(spark: Any, source: Path, out: Path, variant: str) -> Callable[[], None]:
    """The ``arrow`` pipeline's job over ``source``, observed as ``variant`` says."""

    def run() -> None:
        df = spark.read.schema(SCHEMA).json(str(source))
        first = observed(df.mapInArrow(answering(arrow_enrich), _with_outcome(ENRICHED)),
                         variant)  # fmt: skip
        staged = first.repartition(PARTITIONS, "key").mapInArrow(answering(arrow_vat),
                                                                 _with_outcome(TAXED))
        observed(staged, variant).write.mode("append").parquet(str(out))

    return run


def run(cadences: list[int], width: int, repeat: int, warmup: int) -> dict[str, Any]:
    spark = spark_session()
    work = Path(tempfile.mkdtemp(prefix="ft-observation-cost-"))
    figures: dict[str, Any] = {}
    try:
        for events in cadences:
            source = work / f"in-{events}"
            write_events(source, events, width, 1)
            rounds = PairedRounds({v: "plain" for v in VARIANTS}, warmup)
            for rnd in range(warmup + repeat):
                rounds.round(rnd, lambda v, s=source, o=work / f"out-{events}-{rnd}": job(
                    spark, s, o / v, v))  # fmt: skip
            fig: dict[str, Any] = {"plain_s": round(statistics.median(rounds.times["plain"]), 4)}
            for v in VARIANTS:
                per = [d / OBSERVED * 1e3 for d in rounds.diffs[v]]
                fig[f"{v}_s"] = round(statistics.median(rounds.times[v]), 4)
                fig[f"ms_per_observation_{v}"] = round(statistics.median(per), 1)
                fig[f"ms_per_observation_{v}_quartiles"] = [round(q, 1) for q in quartiles(per)]
                fig[f"ratio_{v}_vs_plain"] = round(statistics.median(rounds.ratios[v]), 3)
                fig[f"ratio_{v}_vs_plain_quartiles"] = [
                    round(q, 3) for q in quartiles(rounds.ratios[v])]
            figures[str(events)] = fig
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"cadences": figures, "payload_bytes": width, "partitions": PARTITIONS,
            "observations_per_job": OBSERVED, "repeat": repeat, "warmup": warmup,
            **provenance("observation_cost")}  # fmt: skip


def text(r: dict[str, Any]) -> str:
    lines = [f"{r['payload_bytes']} B events, {r['repeat']} rounds (+{r['warmup']} warmup), "
             f"{r['observations_per_job']} observations per job"]  # fmt: skip
    for events, f in r["cadences"].items():
        lines.append(f"  {int(events):,} events: plain {f['plain_s']:.3f} s")
        for v in VARIANTS:
            q = f[f"ms_per_observation_{v}_quartiles"]
            lines.append(f"    {v:14s}: +{f[f'ms_per_observation_{v}']:.1f} ms per observation "
                         f"(quartiles {q[0]:.1f} to {q[1]:.1f}), "
                         f"{f[f'ratio_{v}_vs_plain']:.3f}x plain")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cadences", default="5000,50000", help="events per job, comma-separated")
    ap.add_argument("--payload-bytes", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=15, help="counted rounds")
    ap.add_argument("--warmup", type=int, default=2, help="rounds run, not counted")
    args = parse_args(ap)
    r = run([int(x) for x in args.cadences.split(",")], args.payload_bytes, args.repeat,
            args.warmup)  # fmt: skip
    save("observation_cost", r)
    print(json.dumps(r) if args.json else text(r))


if __name__ == "__main__":
    main()
