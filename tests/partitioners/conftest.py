"""Session-scoped local[2] SparkSession for the partitioner mirror tests.

PySpark starts its Python workers with ``PYTHONHASHSEED`` = the driver's value, or ``"0"``
when the driver has none, and that overrides ``spark.executorEnv.PYTHONHASHSEED``. So when
the caller did not set it, we set a fixed non-zero seed in ``os.environ`` only while the
SparkContext is built (it captures the value then) and restore the environment afterwards.
Tests read the workers' seed from ``sc.environment``. Workers run this interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

WORKER_HASH_SEED = "2718"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    saved = {k: os.environ.get(k) for k in ("PYTHONHASHSEED", "PYSPARK_PYTHON")}
    os.environ.setdefault("PYTHONHASHSEED", WORKER_HASH_SEED)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        session = (
            SparkSession.builder.master("local[2]")
            .appName("ftlayer-partitioners-tests")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "8")
            .config("spark.executorEnv.PYTHONHASHSEED", os.environ["PYTHONHASHSEED"])
            .config("spark.pyspark.python", sys.executable)
            .getOrCreate()
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield session
    session.stop()


@pytest.fixture()
def worker_hash_seed(spark: SparkSession, monkeypatch: pytest.MonkeyPatch) -> str:
    """Set this process's PYTHONHASHSEED variable to the seed Spark's workers use."""
    seed = spark.sparkContext.environment["PYTHONHASHSEED"]
    monkeypatch.setenv("PYTHONHASHSEED", seed)
    return seed
