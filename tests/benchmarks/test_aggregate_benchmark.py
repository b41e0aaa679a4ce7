"""`benchmarks/performance/aggregate.py`: SparseLoCo's aggregate over whole payloads, its exact norms in
one pass per group of tensors against tensor by tensor."""

from __future__ import annotations

import json

import pytest

from benchmarks.performance import aggregate as benchmark


def test_it_times_both_ways_checks_they_agree_and_writes_the_figures(tmp_path, capsys) -> None:
    out = tmp_path / "aggregate.json"
    assert benchmark.main(["--cases", "micro", "--peers", "3", "--reps", "2", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["micro"]
    assert figures == json.loads(capsys.readouterr().out)
    assert figures["tensors"] == 21 and figures["peers"] == 3 and figures["bit_identical"]
    assert figures["aggregate_ms"] > 0 and figures["baseline_ms"] > 0
    assert figures["ratio"] == pytest.approx(figures["aggregate_ms"] / figures["baseline_ms"], rel=1e-3)
