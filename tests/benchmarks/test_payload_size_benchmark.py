"""`benchmarks/performance/payload_size.py`: a validator's size of a payload (float32 norms summed in
float64) against the float64 copy it replaced, and the lead's ceiling over F_t at that price."""

from __future__ import annotations

import json

import pytest

from benchmarks.performance import payload_size as benchmark


def test_it_times_both_ways_checks_they_agree_and_writes_the_figures(tmp_path, capsys) -> None:
    out = tmp_path / "payload_size.json"
    assert benchmark.main(["--cases", "micro", "--reps", "2", "--drawn", "8", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["micro"]
    assert figures == json.loads(capsys.readouterr().out)
    assert figures["values_per_payload"] > 0 and figures["drawn"] == 8 and figures["relative_difference"] < 1e-6
    assert figures["norm_ms"] > 0 and figures["norm_float64_copy_ms"] > 0 and figures["step_ceiling_ms"] > 0
    assert figures["ratio"] == pytest.approx(figures["norm_ms"] / figures["norm_float64_copy_ms"], rel=1e-3)
