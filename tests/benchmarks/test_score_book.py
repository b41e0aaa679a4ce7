"""`benchmarks/performance/score_book.py`: one window's scoring timed with and without μ's tie band."""

from __future__ import annotations

import json

import pytest

from benchmarks.performance import score_book


def test_it_times_a_window_with_and_without_the_band_and_writes_the_figures(tmp_path, capsys) -> None:
    out = tmp_path / "score_book.json"
    assert score_book.main(["--peers", "24", "--windows", "3", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures == json.loads(capsys.readouterr().out)
    assert figures["peers"] == 24 and figures["band_seconds"] > 0 and figures["no_band_seconds"] > 0
    # the ratio of the unrounded times, the figures rounded to 10 µs
    assert figures["ratio"] == pytest.approx(figures["band_seconds"] / figures["no_band_seconds"], rel=0.02)
