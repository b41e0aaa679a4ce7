"""`benchmarks/performance/aggregate.py`: a payload's exact norm in one call (one pass per group of its
tensors) against the same function tensor by tensor, and the whole aggregate."""

from __future__ import annotations

import json

import pytest

from benchmarks.performance import aggregate as benchmark


def test_it_times_both_ways_checks_they_agree_and_writes_the_figures(tmp_path, capsys) -> None:
    out = tmp_path / "aggregate.json"
    assert benchmark.main(["--cases", "micro", "--peers", "3", "--reps", "2", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["micro"]
    assert figures == json.loads(capsys.readouterr().out)
    assert figures["tensors"] == 21 and figures["peers"] == 3 and figures["same_norm"]
    assert figures["norms_ms"] > 0 and figures["norms_tensor_by_tensor_ms"] > 0 and figures["aggregate_ms"] > 0
    assert figures["ratio"] == pytest.approx(figures["norms_ms"] / figures["norms_tensor_by_tensor_ms"], rel=1e-3)
