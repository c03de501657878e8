"""Smoke test of the throughput benchmark (tiny N, no speed assertions)."""

from __future__ import annotations

import json

import pytest

from benchmarks import partitioner_throughput


def test_benchmark_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert partitioner_throughput.main(["--json", "--keys", "50", "--repeat", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["keys"] == 50
    rates = result["keys_per_second"]
    assert "HashPartitioner.partition string" in rates
    assert "HashPartitioner.partition bigint" in rates
    assert all(rate > 0 for rate in rates.values())


def test_benchmark_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert partitioner_throughput.main(["--keys", "20", "--repeat", "1"]) == 0
    assert "keys/s" in capsys.readouterr().out
