"""The JSONL tail and record parsing: torn, invalid, rotated and hostile lines never break a read."""

from __future__ import annotations

import json
import os

from templar.dashboard.jsonl import MAX_LINE_BYTES, JsonlTail
from templar.dashboard.sources import RecordFile, parse_record
from templar.runtime.records import PeerScoreRecord, ValidatorWindowRecord, append_record

WINDOW = ValidatorWindowRecord(window=3, global_step=2, learning_rate=1e-3, holdout_loss=7.5, peers_aggregated=4,
                               gathered=6, evaluated=3, wall_seconds=6.2, weights_set=True)


def test_tail_returns_only_complete_new_lines_and_counts_bad_ones(tmp_path):
    path = tmp_path / "validator_windows.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == ([], False) and not tail.status.exists
    append_record(path, WINDOW)
    with open(path, "a") as f:
        f.write("not json\n[1, 2]\n" + json.dumps({"window": 4})[:7])  # garbage, a list, a torn line
    records, reset = tail.poll()
    assert [r["window"] for r in records] == [3] and not reset
    assert tail.status.skipped == 2 and tail.status.pending_bytes == 7
    with open(path, "a") as f:
        f.write(json.dumps({"window": 4})[7:] + "\n")  # the writer finishes its line
    assert [r["window"] for r in tail.poll()[0]] == [4]
    assert tail.poll() == ([], False)


def test_tail_starts_over_when_the_file_is_truncated_or_replaced(tmp_path):
    path = tmp_path / "scores.jsonl"
    tail = JsonlTail(path)
    for _ in range(3):
        append_record(path, WINDOW)
    assert len(tail.poll()[0]) == 3
    path.write_text(json.dumps({"window": 9}) + "\n")  # truncated and rewritten (a rotation)
    records, reset = tail.poll()
    assert reset and [r["window"] for r in records] == [9]
    moved = tmp_path / "new.jsonl"
    moved.write_text(json.dumps({"window": 10}) + "\n" + json.dumps({"window": 11}) + "\n")
    os.replace(moved, path)  # replaced by another file (another inode)
    records, reset = tail.poll()
    assert reset and [r["window"] for r in records] == [10, 11]
    path.unlink()
    assert tail.poll() == ([], True) and not tail.status.exists


def test_an_endless_line_is_skipped_not_buffered(tmp_path):
    path = tmp_path / "scores.jsonl"
    path.write_bytes(b"x" * (MAX_LINE_BYTES + 10))
    tail = JsonlTail(path)
    assert tail.poll() == ([], False)
    assert tail.status.skipped == 1 and "longer" in tail.status.last_skip_reason
    with open(path, "ab") as f:
        f.write(b"xx\n")  # the junk line ends
    append_record(path, WINDOW)  # and the next real record still arrives
    assert [r["window"] for r in tail.poll()[0]] == [3]


def test_records_are_checked_field_by_field(tmp_path):
    good = {"window": 1, "hotkey": "5F", "uid": 2, "status": "ok", "evaluated": True, "sync_steps": None,
            "delta_assigned": 0.1, "delta_rand": 0, "mu": 0.5, "rating": 25, "score": 1.0, "weight": 0.2,
            "in_top_g": False, "new_field": "ignored"}
    rec = parse_record(PeerScoreRecord, good)
    assert isinstance(rec, PeerScoreRecord) and rec.delta_rand == 0.0 and isinstance(rec.rating, float)
    for field, bad in (("window", "1"), ("window", 1.5), ("uid", True), ("evaluated", 1), ("mu", None),
                       ("status", "x" * 500), ("weight", "0.2")):
        assert parse_record(PeerScoreRecord, good | {field: bad}) is None, field
    assert parse_record(PeerScoreRecord, {k: v for k, v in good.items() if k != "mu"}) is None
    path = tmp_path / "scores.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(good | {"uid": "two"}) + "\n")
    rf = RecordFile(path, PeerScoreRecord)
    assert len(rf.poll()[0]) == 1 and rf.invalid == 1
    assert any("without the expected fields" in p for p in rf.problems())


def test_a_long_history_is_read_from_its_tail_at_a_line_boundary(tmp_path):
    path = tmp_path / "scores.jsonl"
    with open(path, "w") as f:
        for window in range(2000):
            f.write(json.dumps({"window": window, "pad": "x" * 40}) + "\n")
    tail = JsonlTail(path, start_bytes=10_000)
    records, _ = tail.poll()
    windows = [r["window"] for r in records]
    assert 100 < len(windows) < 250 and windows == list(range(windows[0], 2000))  # whole lines only
    assert tail.status.truncated_start and tail.status.skipped == 0
    append_record(path, WINDOW)
    assert [r["window"] for r in tail.poll()[0]] == [3]


def test_records_of_older_versions_still_parse():
    """A field added later (with a default) may be absent; a present one must have its type."""
    from templar.dashboard.sources import parse_record
    from templar.runtime.records import ValidatorWindowRecord

    old = {"window": 3, "global_step": 2, "learning_rate": 1e-3, "holdout_loss": 7.5, "peers_aggregated": 2,
           "gathered": 3, "evaluated": 2, "wall_seconds": 6.5, "weights_set": True}
    parsed = parse_record(ValidatorWindowRecord, old)
    assert parsed is not None and parsed.gather_seconds is None
    assert parse_record(ValidatorWindowRecord, {**old, "gather_seconds": 1.25}).gather_seconds == 1.25
    assert parse_record(ValidatorWindowRecord, {**old, "gather_seconds": "slow"}) is None
