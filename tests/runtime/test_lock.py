"""One node per state directory (`templar.runtime.lock`), across processes, and a state file that
cannot be written is one line naming the path and the errno."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from templar.runtime.lock import StateDirLocked, StateLock, lock_holder
from templar.runtime.state import NodeState, StateWriteError, save_node_state


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path):
    lock = StateLock(tmp_path)
    with pytest.raises(StateDirLocked, match=r"in use by another node \(pid \d+\)"):
        StateLock(tmp_path)
    probe = (f"import sys; from templar.runtime.lock import StateLock, StateDirLocked\n"
             f"try:\n    StateLock(__import__('pathlib').Path({str(tmp_path)!r}))\n"
             f"except StateDirLocked as e:\n    print(e); sys.exit(6)\n")
    other = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert other.returncode == 6 and "in use by another node" in other.stdout
    lock.release()
    StateLock(tmp_path).release()  # free again


def test_asking_who_holds_a_directory_names_the_holder_and_holds_nothing(tmp_path):
    """`lock_holder`, the entry points' question before torch loads: None for a directory no node
    holds (or has ever held), the holder's pid while one does, and asking leaves the lock free."""
    assert lock_holder(tmp_path / "never") is None and not (tmp_path / "never").exists()
    assert lock_holder(tmp_path) is None
    lock = StateLock(tmp_path)
    assert lock_holder(tmp_path) == str(os.getpid())
    lock.release()
    assert lock_holder(tmp_path) is None
    StateLock(tmp_path).release()  # the question took nothing


def test_a_state_write_that_fails_is_one_line_with_the_errno(tmp_path):
    """A directory that cannot hold the file (here: a plain file where the directory should be,
    which refuses even root); the disk-full and file-size-limit cases run on real nodes in
    tests/integration/test_history.py."""
    import torch

    model = torch.nn.Linear(4, 4)
    (tmp_path / "not-a-dir").write_text("x")
    with pytest.raises(StateWriteError) as info:
        save_node_state(tmp_path / "not-a-dir" / "state.safetensors", model, {}, NodeState(1, 0))
    message = str(info.value)
    assert "\n" not in message and "not-a-dir/state.safetensors" in message
    assert info.value.errno in (17, 20) and ("EEXIST" in message or "ENOTDIR" in message), message
