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


def test_a_follower_stopped_while_catching_up_keeps_the_window_before(tmp_path, monkeypatch):
    """SIGTERM while a follower waits for a window's published update (its own fetch of a payload the
    lead named failed): the window's step is not in its model, so it must not claim the window. It
    saved a state file saying window w with θ and step still w - 1's; restarted, it said "Active"
    holding a model that is not the run's."""
    import templar.validator.roles as roles
    from templar.runtime.consensus.follow import FollowError
    from templar.runtime.state import load_node_state

    from .harness import parameters, same_parameters

    subnet = Subnet.create(tmp_path, {"lead": 100.0, "follower": 50.0, "m0": 0.0, "m1": 0.0}, max_allowed_stale=12)

    async def scenario():
        lead, follower = Validator(await subnet.node("lead")), Validator(await subnet.node("follower"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1")]
        for node in (lead, follower, *miners):
            await node.start()
        for _ in range(3):
            w = lead.state.window + 1
            await asyncio.gather(*(n.run_window(w) for n in (lead, follower, *miners)))
        w, before = lead.state.window + 1, parameters(follower.node)
        committed = (follower.state.window, follower.state.global_step)
        apply_inputs = roles.apply_inputs

        async def stopped_while_fetching(node, window, *args, **kwargs):
            if node is follower.node and window == w:
                node.stop.set()  # the SIGTERM, while a named payload's fetch times out
                raise FollowError("m0's payload, aggregated by the lead, could not be read (TimeoutError)")
            return await apply_inputs(node, window, *args, **kwargs)

        monkeypatch.setattr(roles, "apply_inputs", stopped_while_fetching)
        await asyncio.gather(*(n.run_window(w) for n in (lead, follower, *miners)))
        assert lead.state.global_step == committed[1] + 1  # the window had a step
        assert (follower.state.window, follower.state.global_step) == committed
        assert same_parameters(parameters(follower.node), before)
        loaded = load_node_state(follower.node.state_dir / STATE_FILE, follower.node.model)
        assert loaded is not None and (loaded[0].window, loaded[0].global_step) == committed
        assert same_parameters(parameters(follower.node), before)  # the state file holds what it says
        assert w not in _windows(follower.node.state_dir / VALIDATOR_WINDOWS_FILE)
        for node in (lead, follower, *miners):
            await node.node.aclose()

    run_virtual(scenario())


def test_a_validator_down_longer_than_its_state_keeps_its_book_beside_the_checkpoint(tmp_path):
    """Down more than `max_allowed_stale` windows, a validator takes θ from the lead's checkpoint, and
    its score book and replay memory from its own state file: no window was scored after it was saved,
    so none counts twice (before: both started empty, every peer's reputation from zero)."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "v2": 50.0, "m0": 0.0, "m1": 0.0}, max_allowed_stale=2,
                           checkpoint_frequency=2)

    async def windows(roles: list, count: int) -> None:
        for _ in range(count):
            w = roles[0].state.window + 1
            await asyncio.gather(*(r.run_window(w) for r in roles if r.state.window < w))

    async def scenario():
        lead, v2 = Validator(await subnet.node("lead")), Validator(await subnet.node("v2"))
        miners = [Miner(await subnet.node(name)) for name in ("m0", "m1")]
        for role in (lead, v2, *miners):
            await role.start()
        await windows([lead, v2, *miners], 3)
        book, replays, stopped_at = ScoreBook.from_json(v2.book.to_json()), v2.replays.to_json(), v2.state.window
        assert len(book) > 0
        await v2.node.aclose()
        await windows([lead, *miners], 5)  # v2 down for 5 windows: its state file is too old for θ
        v2 = Validator(await subnet.node("v2"))
        await v2.start()
        restarted = v2.state.window, v2.book, v2.replays.to_json()
        for role in (lead, v2, *miners):
            await role.node.aclose()
        return stopped_at, book, replays, restarted

    stopped_at, book, replays, (window, restored_book, restored_replays) = run_virtual(scenario())
    assert window > stopped_at + 2, "θ came from a checkpoint, not the old state file"
    assert restored_book == book and restored_replays == replays
