"""`benchmarks/performance/decode.py`: a strict read of one payload with the C kernels, with the numpy reader,
and with the numpy reader finding the indices' terminators in 0/1 bytes; all must decode the same payload."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.performance import decode as benchmark
from templar.compress import native
from templar.wire import codec


def test_it_times_both_ways_checks_they_agree_and_writes_the_figures(tmp_path, capsys) -> None:
    out = tmp_path / "decode.json"
    assert benchmark.main(["--cases", "micro", "--reps", "2", "--out", str(out)]) == 0
    figures = json.loads(out.read_text())["micro"]
    assert figures == json.loads(capsys.readouterr().out)
    assert figures["same_payload"] and figures["codec"] == "rice-q2" and figures["values_per_payload"] > 0
    assert figures["read_ms"] > 0 and figures["numpy_read_ms"] > 0 and figures["numpy_byte_scan_read_ms"] > 0
    assert figures["ratio"] == pytest.approx(figures["read_ms"] / figures["numpy_byte_scan_read_ms"], rel=1e-3)
    assert figures["numpy_ratio"] == pytest.approx(figures["numpy_read_ms"] / figures["numpy_byte_scan_read_ms"], rel=1e-3)
    assert figures["kernel"] == native.available() and figures["two_threads_speedup"] > 0
    assert figures["validator_reads_seconds"] == pytest.approx(79 * figures["read_ms"] / 1000, rel=1e-3)


def test_the_baseline_is_the_byte_scan_and_is_put_back() -> None:
    ours = codec._bits
    with benchmark.terminators_in_bytes():
        assert codec._bits is not ours
    assert codec._bits is ours
    stream = torch.tensor([0b10010001, 0], dtype=torch.uint8)
    assert ours(stream).dtype == np.bool_ and np.flatnonzero(ours(stream)).tolist() == [0, 4, 7]
