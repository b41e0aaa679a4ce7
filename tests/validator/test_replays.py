"""The replay memory: an upload whose gradient repeats an earlier window's (its own or another
hotkey's) is found, honest windows and empty updates never are, and the memory survives a restart
inside the validator's state file."""

from __future__ import annotations

import pytest
import torch
from loguru import logger

from templar.comms import GatherResult, GatherStatus
from templar.compress import Compressed, DCTCompressor
from templar.core.config import load_hparams
from templar.gauntlet import ScoreBook
from templar.runtime.state import NodeState, load_node_state, save_node_state
from templar.validator.replays import ReplayMemory, ReplayMemoryError, Sighting
from templar.validator.state import load_replays, with_book
from templar.wire import Gradient

REPLAY_WINDOWS = load_hparams().gauntlet.replay_windows
"""Production's span (64 windows)."""


def _upload(tensors: dict[str, Compressed], hotkey: str, digest: bytes) -> GatherResult[Gradient]:
    g = Gradient(window=0, global_step=0, hotkey=hotkey, warmup=False, tensors=tensors, probes={}, digest=digest,
                 nbytes=0)
    return GatherResult(GatherStatus.OK, value=g, timestamp=100.0)


@pytest.fixture(scope="module")
def work(hp, small_shapes) -> dict[str, Compressed]:
    """One compressed update (what the memory sees of it is its content digest and whether it is zero)."""
    gen = torch.Generator().manual_seed(0)
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    return {n: compressor.compress(torch.randn(s, generator=gen)) for n, s in small_shapes.items()}


@pytest.fixture
def warnings():
    lines: list[str] = []
    handler = logger.add(lambda m: lines.append(m.record["message"]), level="WARNING")
    yield lines
    logger.remove(handler)


def test_a_miner_re_posting_its_own_earlier_upload_is_found(work, warnings):
    memory = ReplayMemory(REPLAY_WINDOWS)
    assert memory.observe(10, {"m": _upload(work, "m", b"a" * 32), "n": _upload(work, "n", b"b" * 32)}) == {}
    assert memory.observe(11, {"m": _upload(work, "m", b"c" * 32)}) == {}
    assert memory.observe(12, {"m": _upload(work, "m", b"a" * 32), "n": _upload(work, "n", b"d" * 32)}) == {
        "m": Sighting("m", 10)}
    assert warnings == ["peer m: replay: its gradient is byte-identical to its own upload of window 10 (2 windows ago)"]


def test_another_hotkey_re_posting_an_old_public_upload_is_found(work, warnings):
    memory = ReplayMemory(REPLAY_WINDOWS)
    memory.observe(10, {"victim": _upload(work, "victim", b"a" * 32)})
    assert memory.observe(13, {"thief": _upload(work, "thief", b"a" * 32)}) == {"thief": Sighting("victim", 10)}
    assert "victim's upload of window 10" in warnings[0]
    # the thief's re-post is remembered too, but the first sighting is what a later replay names
    assert memory.observe(14, {"other": _upload(work, "other", b"a" * 32)}) == {"other": Sighting("victim", 10)}


def test_a_window_never_matches_itself(work):
    """Same-window equality is the copy check's; a window redone after a restart finds nothing."""
    memory = ReplayMemory(REPLAY_WINDOWS)
    both = {"a": _upload(work, "a", b"a" * 32), "b": _upload(work, "b", b"a" * 32)}
    assert memory.observe(10, both) == {}
    assert memory.observe(10, both) == {}


def test_failed_and_empty_uploads_are_neither_judged_nor_remembered(work):
    """An all-zero update encodes to the same bytes every window: an honest miner with nothing to
    send twice is not a replay (it earns nothing anyway). A failed gather has no digest."""
    zero = {k: Compressed(c.indices, torch.zeros_like(c.values), c.shape, c.chunk) for k, c in work.items()}
    memory = ReplayMemory(REPLAY_WINDOWS)
    assert memory.observe(10, {"idle": _upload(zero, "idle", b"z" * 32),
                               "gone": GatherResult(GatherStatus.MISSING)}) == {}
    assert memory.observe(11, {"idle": _upload(zero, "idle", b"z" * 32)}) == {}
    assert len(memory) == 0


def test_the_memory_spans_the_last_windows_only(work):
    memory = ReplayMemory(REPLAY_WINDOWS)
    memory.observe(10, {"m": _upload(work, "m", b"a" * 32)})
    assert memory.observe(10 + REPLAY_WINDOWS - 1, {"x": _upload(work, "x", b"a" * 32)}) == {"x": Sighting("m", 10)}
    memory.observe(10 + REPLAY_WINDOWS, {"m": _upload(work, "m", b"b" * 32)})
    assert 10 not in memory.seen  # now out of the span: forgotten
    assert memory.first_sighting(b"a" * 32, 10 + REPLAY_WINDOWS + 1) == Sighting("x", 10 + REPLAY_WINDOWS - 1)
    for w in range(100, 100 + 3 * REPLAY_WINDOWS):
        memory.observe(w, {"m": _upload(work, "m", w.to_bytes(32, "little"))})
    assert len(memory.seen) == REPLAY_WINDOWS


def test_the_memory_survives_a_restart_in_the_state_file(work, tmp_path):
    """Saved with θ, window and book in one atomic file; read back only from our own state file (a
    checkpoint carries none)."""
    memory = ReplayMemory(REPLAY_WINDOWS)
    memory.observe(10, {"m": _upload(work, "m", b"a" * 32)})
    model = torch.nn.Linear(2, 2)
    save_node_state(tmp_path / "state.safetensors", model, {},
                    with_book(NodeState(window=10, global_step=3), ScoreBook(), memory))
    state, _ = load_node_state(tmp_path / "state.safetensors", model)
    restored = load_replays(state, windows=REPLAY_WINDOWS)
    assert restored == memory
    assert restored.observe(12, {"m": _upload(work, "m", b"a" * 32)}) == {"m": Sighting("m", 10)}
    assert len(load_replays(NodeState(window=12, global_step=5), windows=REPLAY_WINDOWS)) == 0  # a checkpoint's
    # the span is the run's: a memory saved under a longer one keeps only the run's newest windows
    memory.observe(11, {"m": _upload(work, "m", b"b" * 32)})
    save_node_state(tmp_path / "state.safetensors", model, {},
                    with_book(NodeState(window=11, global_step=4), ScoreBook(), memory))
    state, _ = load_node_state(tmp_path / "state.safetensors", model)
    assert sorted(load_replays(state, windows=1).seen) == [11]


@pytest.mark.parametrize("damage", [
    "not a memory", {"windows": 64}, {"windows": 64, "seen": {"x": {}}},
    {"windows": 64, "seen": {"3": {"zz": "m"}}}, {"windows": 64, "seen": {"3": {"ab" * 32: 7}}},
    {"windows": 1, "seen": {"3": {}, "4": {}}}, {"windows": True, "seen": {}},
])
def test_a_damaged_memory_is_refused_and_restarts_empty(damage, warnings):
    with pytest.raises(ReplayMemoryError):
        ReplayMemory.from_json(damage, REPLAY_WINDOWS)
    assert len(load_replays(NodeState(window=1, global_step=0, extra={"replays": damage}),
                            windows=REPLAY_WINDOWS)) == 0
