"""A node's state file is its commit point: the previous state survives a torn newest one, and
records of windows the state never committed are dropped at the restart."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import torch

from templar.core.model import build_model
from templar.runtime import records
from templar.runtime.records import read_records, trim_records
from templar.runtime.state import (
    NodeState,
    load_node_state_or_previous,
    previous_path,
    save_node_state,
    write_state_file,
)


def test_a_torn_state_falls_back_to_the_previous_one(hp, tmp_path):
    model = build_model(hp)
    path = tmp_path / "state.safetensors"
    for window in (1, 2, 3):
        with torch.no_grad():
            next(model.parameters()).fill_(float(window))
        save_node_state(path, model, {}, NodeState(window=window, global_step=window))
    (state, _), source = load_node_state_or_previous(path, model)
    assert (state.window, source) == (3, "state")

    path.write_bytes(path.read_bytes()[:1000])  # truncated by a failing disk
    fresh = build_model(hp)
    (state, _), source = load_node_state_or_previous(path, fresh)
    assert state.window == 2 and source.startswith("previous state")
    assert float(next(fresh.parameters()).detach().flatten()[0]) == 2.0  # the model of that same window

    previous_path(path).write_bytes(b"garbage")
    with pytest.raises(ValueError, match="unreadable too"):
        load_node_state_or_previous(path, fresh)


@pytest.mark.parametrize("meta", [{"window": "three", "global_step": "3"}, {"global_step": "3"},
                                  {"window": "3", "global_step": "3", "extra": "{torn"},
                                  {"window": "3", "global_step": "3", "extra": "[]"}])
def test_a_state_file_with_unreadable_metadata_is_refused_before_it_touches_the_model(hp, tmp_path, meta):
    """Its tensors were loaded into the model before its metadata was read: refused, it left its θ in
    the model, and a node with nothing else to fall back on started "at θ_0" holding it."""
    from safetensors.torch import load_file, save_file

    from templar.runtime.state import load_node_state

    model = build_model(hp)
    path = tmp_path / "state.safetensors"
    with torch.no_grad():
        next(model.parameters()).fill_(7.0)
    save_node_state(path, model, {}, NodeState(window=3, global_step=3))
    save_file(load_file(str(path)), str(path), metadata=meta)
    fresh = build_model(hp)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match="unreadable state metadata"):
        load_node_state(path, fresh)
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())


def test_a_save_killed_midway_leaves_no_temporary_file_behind_the_next_save(tmp_path):
    """`kill -9` during a save skips `atomic_write`'s cleanup: each crash left a temporary file the
    size of the whole state (GBs) that nothing ever removed. The next save removes it."""
    path = tmp_path / "state.safetensors"
    write_state_file(path, lambda tmp: tmp.write_bytes(b"old"))
    killed_midway = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from templar.core.atomic import atomic_write\n"
        "def write(tmp):\n"
        "    tmp.write_bytes(b'x' * 4096)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic_write(Path(sys.argv[1]), write)\n"
    )
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", killed_midway, str(path)], timeout=60)
        assert done.returncode == -signal.SIGKILL
    assert len(list(tmp_path.glob(".state.safetensors.*.tmp"))) == 2
    write_state_file(path, lambda tmp: tmp.write_bytes(b"new"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.safetensors", "state.safetensors.prev"]
    assert path.read_bytes() == b"new" and previous_path(path).read_bytes() == b"old"


def test_trim_records_drops_uncommitted_windows_and_torn_lines(tmp_path):
    path = tmp_path / "scores.jsonl"
    lines = [json.dumps({"window": w, "hotkey": h}) + "\n" for w in (1, 2, 3, 4) for h in ("a", "b")]
    path.write_text("".join(lines) + '{"window": 5, "hot')
    assert trim_records(path, 3) == 3  # window 4 twice, plus the torn line
    assert [json.loads(x)["window"] for x in path.read_text().splitlines()] == [1, 1, 2, 2, 3, 3]
    assert trim_records(path, 3) == 0
    assert trim_records(tmp_path / "absent.jsonl", 3) == 0


def test_a_restarted_miner_reads_its_last_pace_from_the_tail_of_its_records(tmp_path):
    """The pace of the newest window it trained (`pace_seconds` > 0): windows not trained (0), a torn
    last line, a line that is not JSON and values that are no pace are passed over; only the file's
    last 64 lines are read, and no pace there (or no file) is an unknown pace."""
    from templar.miner.window import recorded_pace

    path = tmp_path / "miner_windows.jsonl"
    assert recorded_pace(path) is None
    rows = [{"window": 1, "pace_seconds": 19.5}, {"window": 2, "pace_seconds": 21.25}, {"window": 3, "pace_seconds": 0.0},
            {"window": 4, "pace_seconds": True}, {"window": 5, "pace_seconds": "9"}, {"window": 6}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n" + '{"window": 7, "pace_seconds": 5')
    assert recorded_pace(path) == 21.25
    path.write_text(json.dumps({"window": 1, "pace_seconds": 19.5}) + "\n"
                    + "".join(json.dumps({"window": w, "pace_seconds": 0.0}) + "\n" for w in range(2, 66)))
    assert recorded_pace(path) is None  # 64 windows untrained since: a pace that old says nothing
    path.write_text(json.dumps({"window": 1, "pace_seconds": float("inf")}).replace("Infinity", "1e999") + "\n")
    assert recorded_pace(path) is None


def test_trim_records_reads_the_uncommitted_tail_not_the_history(tmp_path, monkeypatch):
    """A restart trimmed its record files by parsing every line and rewriting the file: a 256-peer
    validator's `scores.jsonl` grows about 85 MB a day, and one day's history took ~5 s and ~100 MiB
    (~260 MiB when a torn line made it rewrite), a month's a minute or more and gigabytes. Records
    are appended in window order, so the restart reads the tail back to the last committed record
    and cuts the file there."""
    path = tmp_path / "scores.jsonl"
    history = "".join(json.dumps({"window": w, "hotkey": h}) + "\n" for w in range(2000) for h in ("a", "b", "c"))
    path.write_text(history + json.dumps({"window": 2000, "hotkey": "a"}) + "\n" + '{"window": 2000, "hot')
    parsed = []
    real_loads = json.loads
    monkeypatch.setattr(json, "loads", lambda text, *a, **kw: parsed.append(text) or real_loads(text, *a, **kw))
    assert trim_records(path, 1999) == 2  # window 2000's record and the torn line
    assert len(parsed) <= 2, f"parsed {len(parsed)} lines of a 6,002-line file to drop its last two"
    assert path.read_text() == history
    parsed.clear()
    assert trim_records(path, 1999) == 0 and len(parsed) == 1  # a clean restart reads one line
    path.write_text("not a record\n" + history[:30])  # a line that never parsed, before the committed records
    assert trim_records(path, 1999) == 1  # only the torn tail: the readers skip the line before it
    assert path.read_text() == "not a record\n" + history[:history.index("\n", 1) + 1]


FULL_DISK = """
import resource, signal, sys
from pathlib import Path
from templar.runtime.records import append_record
path = Path(sys.argv[1])
record = lambda w, hk: {"window": w, "hotkey": hk, "pad": "x" * 40}
for hk in "abc":
    append_record(path, record(1, hk))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 30, resource.RLIM_INFINITY))  # full mid-record
print(append_record(path, record(2, "a")))
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))  # space again
print(append_record(path, record(2, "b")), append_record(path, record(3, "a")))
"""


def test_a_record_the_disk_cut_short_is_cut_off_and_the_next_one_is_whole(tmp_path):
    """A full disk mid-record (a file-size limit here, errno 27 as ENOSPC is 28): that record is lost
    and said so, and the file is as it was. Before, its fragment stayed and the next record was glued to it,
    lost to every reader although its append said it was written."""
    path = tmp_path / "scores.jsonl"
    done = subprocess.run([sys.executable, "-c", FULL_DISK, str(path)], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True", "True"], done.stdout + done.stderr
    assert "this record is lost" in done.stderr
    assert [(r["window"], r["hotkey"]) for r in read_records(path)] == [(1, "a"), (1, "b"), (1, "c"), (2, "b"), (3, "a")]


def test_a_record_file_that_cannot_be_trimmed_at_start_is_said_and_the_node_goes_on(tmp_path, monkeypatch):
    """An unwritable record file (a log-rotation rule with the wrong owner) stopped the node at every
    start with a traceback, though appends to it are one line each at run time."""
    said = []
    monkeypatch.setattr(records, "trim_records", lambda path, window: (_ for _ in ()).throw(PermissionError(1, "no")))
    from loguru import logger

    sink = logger.add(lambda message: said.append(str(message)), level="ERROR")
    try:
        records.drop_uncommitted_records(tmp_path, ["scores.jsonl", "weights.jsonl"], 3)
    finally:
        logger.remove(sink)
    assert len(said) == 2 and all("cannot drop the uncommitted records" in line and "errno 1" in line for line in said)
