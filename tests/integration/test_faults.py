"""Fault injection (issue #15): every honest node ends with the same model, and no window is lost
or doubled in any record, whatever fails. On virtual time with in-process nodes: a "kill -9" is a
node's task cancelled with no cleanup at all, then a new node started from its state dir."""

from __future__ import annotations

import asyncio

import pytest
import torch
from loguru import logger

from templar.chain import verify_signature
from templar.comms.keys import gradient_key
from templar.core.clock import run_virtual
from templar.core.schedule import learning_rate
from templar.miner.loop import Miner
from templar.runtime.records import MINER_WINDOWS_FILE, read_records
from templar.validator.loop import Validator
from templar.wire import read_gradient

from .harness import Subnet, parameters, same_parameters

pytestmark = pytest.mark.timeout(240)


class LogLines(list):
    """Loguru messages at WARNING and above while the context is open."""

    def __enter__(self) -> LogLines:
        self.handler = logger.add(lambda m: self.append(m.record["message"]), level="WARNING")
        return self

    def __exit__(self, *exc) -> None:
        logger.remove(self.handler)


async def _windows(lead: Validator, miners: list[Miner], count: int) -> None:
    for _ in range(count):
        w = lead.state.window + 1
        await asyncio.gather(lead.run_window(w), *(m.run_window(w) for m in miners))


def test_a_miner_holding_a_foreign_model_notices_at_the_next_window_and_resyncs(tmp_path):
    """θ perturbed by one foreign update between two windows: at the next window the miner's check
    fails, it uploads a warm-up payload (weight 0, never scored as a desynced active one), logs one
    `[SYNC]` line, re-syncs from the lead's checkpoint and ends identical to everyone."""
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m0": 0.0, "victim": 0.0})

    async def scenario():
        v = Validator(await subnet.node("lead"))
        m0, victim = Miner(await subnet.node("m0")), Miner(await subnet.node("victim"))
        await v.start()
        for m in (m0, victim):
            await m.start()
        await _windows(v, [m0, victim], 3)
        assert same_parameters(parameters(victim.node), parameters(v.node))
        lr = learning_rate(victim.state.global_step, victim.hp.optimizer)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for p in victim.node.model.parameters():
                p.add_(lr * (torch.randint(0, 2, p.shape, generator=g).float() * 2 - 1))
        hit = v.state.window + 1
        with LogLines() as lines:
            await _windows(v, [m0, victim], 1)
        assert [line for line in lines if "[SYNC] Our model differs from the lead's" in line], lines
        assert same_parameters(parameters(victim.node), parameters(v.node)), "not re-synced"
        await _windows(v, [m0, victim], 1)
        assert same_parameters(parameters(victim.node), parameters(v.node))
        assert same_parameters(parameters(m0.node), parameters(v.node))
        assert victim.state.global_step == v.state.global_step
        payload = (subnet.root / "buckets" / "victim" / gradient_key(hit)).read_bytes()
        gradient = read_gradient(payload, victim.node.shapes, victim.hp, run=victim.node.run,
                                 verify=verify_signature, expected_hotkey=victim.node.hotkey, expected_window=hit)
        assert gradient.warmup, "an out-of-sync miner uploaded as active"
        for node in (v.node, m0.node, victim.node):
            await node.aclose()
        return hit, victim

    hit, victim = run_virtual(scenario())
    records = list(read_records(victim.node.state_dir / MINER_WINDOWS_FILE))
    windows = [r["window"] for r in records]
    assert windows == list(range(windows[0], windows[-1] + 1)), windows
    by_window = {r["window"]: r for r in records}
    assert by_window[hit]["phase"] == "catchup" and by_window[hit + 1]["phase"] == "active"
