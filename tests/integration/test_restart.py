"""Exactly-once windows across validator restarts: a crash between a window's records and its
state commit, and a torn state file, neither lose nor double a window in the records or the
score book. On virtual time, against the real validator and miner."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest

from templar.core.clock import run_virtual
from templar.gauntlet import ScoreBook
from templar.miner.loop import Miner
from templar.runtime.records import SCORES_FILE, VALIDATOR_WINDOWS_FILE, read_records
from templar.runtime.state import STATE_FILE, previous_path
from templar.validator.loop import Validator

from .harness import Subnet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def _windows(path) -> list[int]:
    return [r["window"] for r in read_records(path)]


def test_restarts_neither_lose_nor_double_a_window(tmp_path):
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "m1": 0.0}, max_allowed_stale=12)
    state_dir = subnet.root / "nodes" / "lead"

    async def windows(v: Validator, miners: list[Miner], count: int) -> None:
        for _ in range(count):
            w = v.state.window + 1
            await asyncio.gather(v.run_window(w), *(m.run_window(w) for m in miners if m.state.window < w))

    async def scenario():
        v = Validator(await subnet.node("lead"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1")]
        await v.start()
        for m in miners:
            await m.start()
        await windows(v, miners, 3)
        committed = v.state.window

        # 1. A crash after window committed+1's records were appended, before its state was saved.
        ghost = committed + 1
        with open(state_dir / VALIDATOR_WINDOWS_FILE, "a") as f:
            f.write(json.dumps({**list(read_records(state_dir / VALIDATOR_WINDOWS_FILE))[-1], "window": ghost}) + "\n")
        with open(state_dir / SCORES_FILE, "a") as f:
            f.write(json.dumps({**list(read_records(state_dir / SCORES_FILE))[-1], "window": ghost}) + "\n")
        await v.node.aclose()
        v = Validator(await subnet.node("lead"))
        await v.start()
        assert v.state.window == committed
        await windows(v, miners, 2)

        # 2. The newest state file torn by the disk: the previous one is one window older.
        book_before_last = ScoreBook.from_json(_previous_book(state_dir))
        torn = v.state.window
        (state_dir / STATE_FILE).write_bytes((state_dir / STATE_FILE).read_bytes()[:2048])
        await v.node.aclose()
        v = Validator(await subnet.node("lead"))
        await v.start()
        # The previous state file is one window older; that window is then replayed from the lead's
        # own published history (never gathered or scored again: published history is append-only).
        assert v.state.window == torn, "restored from the previous state, then replayed the torn window"
        assert v.book == book_before_last
        await windows(v, miners, 2)
        for node in [v.node, *(m.node for m in miners)]:
            await node.aclose()
        return v.state.window, torn

    last, torn_window = run_virtual(scenario())
    recorded = _windows(state_dir / VALIDATOR_WINDOWS_FILE)
    # every window exactly once, but the torn one: replayed from published history, it is not scored again
    assert recorded == [w for w in range(recorded[0], last + 1) if w != torn_window], recorded
    per_peer = Counter((r["window"], r["hotkey"]) for r in read_records(state_dir / SCORES_FILE))
    assert max(per_peer.values()) == 1, "a window was recorded twice for some peer"
    assert set(recorded) == {w for w, _ in per_peer}


def _previous_book(state_dir) -> str:
    from safetensors import safe_open

    with safe_open(str(previous_path(state_dir / STATE_FILE)), framework="pt") as f:
        return json.loads(f.metadata()["extra"])["scorebook"]
