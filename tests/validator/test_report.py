"""`templar.validator.report`: what a window leaves on disk, and what a restart trims of it."""

from __future__ import annotations

from templar.core.config import load_hparams
from templar.gauntlet import FastVerdict, PrimaryResult, ScoreBook, Status, score_window
from templar.runtime.records import drop_uncommitted_records, read_records
from templar.validator.evaluate import LossScores
from templar.validator.report import WINDOW_RECORDS, WindowSummary, record_window


def _record(state_dir, book: ScoreBook, window: int) -> None:
    rules = load_hparams().gauntlet
    verdicts = {"a": FastVerdict(Status.OK), "b": FastVerdict(Status.OK)}
    primaries = {hk: PrimaryResult(0.02, 0.01, (0.02,), (0.02,) * 8, random_units=(0.01,) * 8) for hk in verdicts}
    scores = score_window(book, rules, window, {"a": 0, "b": 1}, verdicts, primaries)
    losses = {hk: LossScores(3.0, 2.98, 3.0, 2.99) for hk in verdicts}
    summary = WindowSummary(global_step=window, learning_rate=1e-3, holdout_loss=3.0, peers_aggregated=2,
                            gathered=2, wall_seconds=1.0, weights_set=False, gather_seconds=0.5)
    record_window(state_dir, window, book, rules, verdicts, losses, scores, summary, primaries=primaries)


def test_a_restart_trims_every_record_a_window_wrote(tmp_path):
    """A validator killed after recording a window but before its state committed records that window
    again after the restart: every file `record_window` appends to (with `--record-evaluations` too)
    must be trimmed to the committed window, or its records repeat. `evaluations.jsonl` was not."""
    book = ScoreBook()
    for window in (1, 2, 3):
        _record(tmp_path, book, window)
    written = {p.name for p in tmp_path.glob("*.jsonl")}
    assert written == set(WINDOW_RECORDS)
    drop_uncommitted_records(tmp_path, list(WINDOW_RECORDS), 2)  # the state committed window 2, not 3
    _record(tmp_path, book, 3)
    for name in WINDOW_RECORDS:
        windows = [r["window"] for r in read_records(tmp_path / name)]
        assert windows == sorted(windows) and windows.count(3) == windows.count(1), name
