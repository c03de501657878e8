"""The standalone cluster helper (ftlayer.spark.standalone): a real master JVM started by
Spark's own ``spark-class``."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftlayer.spark.standalone import QUICK_JVM, StandaloneCluster

pytestmark = pytest.mark.slow


def test_the_environments_daemon_options_reach_the_master_after_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller's ``SPARK_DAEMON_JAVA_OPTS`` (a system property here) is on the master's
    command line, after the cluster's quick-start options. Catches: the cluster replacing
    the caller's options (what it did), or dropping its own."""
    monkeypatch.setenv("SPARK_DAEMON_JAVA_OPTS", "-Dftlayer.test.marker=daemon")
    with StandaloneCluster(workers=0) as cluster:
        assert cluster.master is not None
        # spark-class execs the JVM: the process started is the master's JVM by now
        cmdline = Path(f"/proc/{cluster.master.pid}/cmdline").read_bytes()
        java = [a.decode() for a in cmdline.split(b"\0")]
        assert "org.apache.spark.deploy.master.Master" in java, java
        assert "-Dftlayer.test.marker=daemon" in java, java
        quick = [java.index(flag) for flag in QUICK_JVM.split()]
        assert max(quick) < java.index("-Dftlayer.test.marker=daemon"), java
