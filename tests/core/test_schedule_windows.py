"""LR schedule and window arithmetic."""

import itertools
import math

import pytest
from pydantic import ValidationError

from templar.core.config import InnerConfig, load_hparams
from templar.core.schedule import learning_rate, scheduled_rate
from templar.runtime.consensus.windows import Clock
from templar.runtime.train import inner_lr


def test_learning_rate_warmup_then_cosine():
    # production's warm-up 250, horizon 20000 and floor 10 %, under the cosine at a peak of 8e-4
    opt = load_hparams().optimizer.model_copy(update={"outer_schedule": "cosine", "learning_rate": 8e-4})
    assert learning_rate(0, opt) == pytest.approx(8e-4 / 250)
    assert learning_rate(249, opt) == pytest.approx(8e-4)
    assert learning_rate(250, opt) == pytest.approx(8e-4)
    mid = 250 + (20000 - 250) // 2
    assert learning_rate(mid, opt) == pytest.approx(8e-5 + (8e-4 - 8e-5) * 0.5 * (1 + math.cos(math.pi * 0.5)), rel=1e-3)
    assert learning_rate(20000, opt) == pytest.approx(8e-5)
    assert learning_rate(10**7, opt) == pytest.approx(8e-5)
    steps = [learning_rate(s, opt) for s in range(250, 20000, 97)]
    assert all(a >= b for a, b in itertools.pairwise(steps))
    with pytest.raises(ValueError):
        learning_rate(-1, opt)


def test_a_constant_outer_rate_warms_up_then_stays_while_the_inner_rate_anneals():
    """`outer_schedule` constant (DiLoCo's outer SGD): α warms up as the cosine does, then stays at
    its peak to the end and beyond; the inner AdamW rate follows the cosine either way, and an SGD
    inner step takes α itself."""
    hp = load_hparams("tiny-sparseloco")  # α 1.0, warm-up 2, horizon 2000, inner AdamW 1e-3
    constant = hp.optimizer.model_copy(update={"outer_schedule": "constant"})
    assert [learning_rate(s, constant) for s in (0, 1)] == [learning_rate(s, hp.optimizer) for s in (0, 1)] == [0.5, 1.0]
    assert [learning_rate(s, constant) for s in (2, 1000, 2000, 10**6)] == [1.0] * 4
    assert learning_rate(1000, hp.optimizer) < 0.6 and learning_rate(2000, hp.optimizer) == pytest.approx(0.1)
    for step in (0, 2, 1000, 2000):
        assert inner_lr(hp.inner, step, constant) == inner_lr(hp.inner, step, hp.optimizer) \
            == pytest.approx(1e-3 * scheduled_rate(step, hp.optimizer))
    sgd = InnerConfig(steps=1, optimizer="sgd")
    assert inner_lr(sgd, 1000, constant) == 1.0 and inner_lr(sgd, 1000, hp.optimizer) == learning_rate(1000, hp.optimizer)
    with pytest.raises(ValidationError):
        hp.optimizer.model_validate({**hp.optimizer.model_dump(), "outer_schedule": "linear"})


def test_clock_windows_and_put_window():
    cfg = load_hparams("tiny").windows  # 20 blocks per window, put 4 s, skew 1 s, gather 6 s
    genesis = 1_000_000.0
    block = {"now": 45}
    clock = Clock(cfg, lambda: block["now"], lambda b: genesis + b * 1.0)
    assert clock.current_window() == 2
    t = clock.times(2)
    assert (t.start, t.end) == (genesis + 40, genesis + 60)
    assert t.put_window == (genesis + 60, genesis + 64)
    assert t.gather_start == genesis + 65.25  # after the last acceptable timestamp (+skew) has settled
    assert t.gather_deadline == genesis + 71.25
    # commitments (docs/scoring.md §8): written by end − skew − min(4 s, put / 2), read by validators until
    # end − skew, the earliest instant a gradient of the window can be stamped and still count
    assert t.commit_close == genesis + 57
    assert t.commit_read == (genesis + 57.25, genesis + 59)
    block["now"] = 60
    assert clock.current_window() == 3
    # lead slots (handover 2 s, settle 0.5 s, 3 slots): slot 0's inputs stored by gather_deadline + 2 s, each
    # next slot's 2 s after the one before settled (its deadline + skew 1 s + settle 0.5 s)
    assert [t.slot_deadline(k) for k in range(3)] == [genesis + 73.25, genesis + 76.75, genesis + 80.25]
    assert (t.slot_opens(0), t.slot_opens(1)) == (t.gather_start, t.slot_deadline(0))
    assert t.slot_settled(0) == genesis + 73.25 + 1.0 + 0.5  # + skew + settle: a "not found" is definite
    assert t.apply_deadline == t.slot_settled(2) + 5.0  # followers hold the window's inputs by then


class _Now:
    def __init__(self, value: float) -> None:
        self.value = value

    def now(self) -> float:
        return self.value


def test_clock_skew_against_the_chain_is_measured_and_said_once():
    from loguru import logger

    cfg = load_hparams("tiny").windows  # 1 s blocks, clock_skew_seconds 1
    genesis = 1_000_000.0
    machine = _Now(genesis + 45.5)
    clock = Clock(cfg, lambda: 45, lambda b: genesis + b * 1.0, machine)
    assert clock.skew() == 0.0  # within the head block's second
    machine.value = genesis + 42.0  # 3 s behind the head block's timestamp
    assert clock.skew() == pytest.approx(-3.0)
    machine.value = genesis + 49.0  # 3 s after the block's time span
    assert clock.skew() == pytest.approx(3.0)
    lines: list[str] = []
    handler = logger.add(lambda m: lines.append(m.record["message"]), level="INFO")
    try:
        for _ in range(3):
            clock.check_skew()
        machine.value = genesis + 45.2
        clock.check_skew()
    finally:
        logger.remove(handler)
    assert len([line for line in lines if "ahead of the chain" in line]) == 1
    assert len([line for line in lines if "back within" in line]) == 1


def test_a_window_has_ended_when_the_chain_made_its_next_block_not_when_it_was_foreseen():
    """A node foresees a window's end from the head (the next window's first block, one block time per
    block). A slot the chain misses moves the real end a block later, and validators judge an upload by the
    real one: timed on the foreseen end, every punctual miner's upload was `early` (production's geometry,
    one missed slot: 12 s early against a 2 s allowance; a review's run). `Clock.ended` waits for the block."""
    from templar.core.clock import loop_time, run_virtual

    cfg = load_hparams("hparams.json").windows  # 7 blocks of 12 s
    genesis, missed_after = 1_700_000_000.0, 7 * 1000 + 3  # an author misses its slot inside window 1000

    async def scenario():
        time = loop_time()

        def stamp(block: int) -> float:  # the chain's timestamps; past the missed slot, a block time later
            return genesis + block * 12.0 + (12.0 if block > missed_after else 0.0)

        def head() -> int:
            block = int((time.now() - genesis) // 12.0)
            return block if block <= missed_after else max(missed_after, int((time.now() - genesis - 12.0) // 12.0))

        def timestamp(block: int) -> float:  # past blocks as made, future ones extrapolated from the head
            return stamp(block) if block <= head() else stamp(head()) + (block - head()) * 12.0

        clock = Clock(cfg, head, timestamp, time)
        await clock.sleep_until(stamp(7 * 1000))  # the window's first block: a miner foresees its end now
        foreseen = clock.times(1000).end
        ended = await clock.ended(1000)
        return foreseen, ended.end, time.now(), head()

    foreseen, end, woke, block = run_virtual(scenario(), start=genesis + 7 * 1000 * 12.0 - 1.0)
    assert end == foreseen + 12.0 and block == 7 * 1001, (foreseen, end, block)
    assert end <= woke <= end + 3.0  # within a poll (a quarter block) of the block's arrival
