"""The checks a Spark application gets before its first batch (ftlayer.spark.preflight),
as a user meets them: each in a driver process of its own, against real Spark."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import psutil
import pytest

from ftlayer.spark.preflight import _local
from ftlayer.spark.standalone import StandaloneCluster

# A pipeline on files kept by reference, as the README's first example builds it: the
# checks run at pipeline.stream(spark), before the query starts.
_JOB = """
import sys, tempfile
from pyspark.sql import SparkSession
from ftlayer import FTConfig
from ftlayer.errors import ConfigError
from ftlayer.spark import FaultTolerance, FileSource

builder = SparkSession.builder.master(sys.argv[1]).config("spark.ui.enabled", "false")
for kv in sys.argv[2:]:
    builder = builder.config(*kv.split("=", 1))
spark = builder.getOrCreate()
spark.sparkContext.setLogLevel("OFF")
ft = FaultTolerance(FTConfig(namespace="preflight"))
pipeline = (ft.pipeline(reads=FileSource("json", tempfile.mkdtemp(), "id long"))
            .sink_batches(lambda batch, ctx: None))
try:
    pipeline.stream(spark)
    print("RESULT passed")
except ConfigError as e:
    print("RESULT refused:", e)
finally:
    ft.close()
"""


def _run(tmp_path: Path, master: str, *conf: str, env: dict[str, str] | None = None) -> str:
    job = tmp_path / "job.py"
    job.write_text(textwrap.dedent(_JOB))
    out = subprocess.run([sys.executable, str(job), master, *conf], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path, env=env)  # fmt: skip
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result (exit {out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return lines[-1].removeprefix("RESULT ")


@pytest.mark.slow
@pytest.mark.spark
def test_executors_without_ftlayer_are_refused_in_one_line(tmp_path: Path) -> None:
    """Executors started with an interpreter that lacks ftlayer (a venv's python run
    without activating it: Spark's workers then run ``python3`` from PATH)."""
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)  # the base interpreter: no ftlayer, no msgpack
    python = str(bare / "bin" / "python")
    said = _run(tmp_path, "local[1]", env={**os.environ, "PYSPARK_PYTHON": python})
    assert said.startswith("refused: executors cannot import ftlayer"), said
    assert python in said and "PYSPARK_PYTHON" in said and "--archives" in said, said
    assert "\n" not in said
    mine = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    assert _run(tmp_path, "local[1]", env=mine) == "passed"  # the same, with the driver's


def _outside_address() -> str:
    """An IPv4 address of this machine that is not loopback."""
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family.name == "AF_INET" and not a.address.startswith("127."):
                return str(a.address)
    pytest.fail("this machine has no IPv4 address besides loopback for a non-local master")


@pytest.mark.slow
@pytest.mark.spark
def test_embedded_redis_under_a_master_elsewhere_is_refused(tmp_path: Path) -> None:
    host = _outside_address()
    with StandaloneCluster(workers=0, master_host=host) as cluster:
        said = _run(tmp_path, cluster.url, f"spark.driver.host={host}",
                    f"spark.driver.bindAddress={host}", env=cluster.env(host))  # fmt: skip
    assert said.startswith("refused: ftlayer started an embedded Redis"), said
    assert cluster.url in said and "redis_url" in said, said


def test_which_masters_are_local() -> None:
    assert _local("local[2]") and _local("local") and _local("local-cluster[2,1,1024]")
    assert _local("spark://127.0.0.1:7077") and _local("spark://localhost:7077")
    assert not _local("spark://10.0.0.5:7077") and not _local("yarn")
    assert not _local("k8s://https://10.0.0.1:6443") and not _local("spark://a:7077,b:7077")
