"""When a validator submits weights (`WeightsCadence`): every `windows_per_weights` windows, counted back
from each Yuma epoch, so the submission an epoch reads is the freshest the validator could land in time,
and never closer together than the rate limit allows."""

from __future__ import annotations

import asyncio
import itertools
from types import SimpleNamespace

import pytest

from templar.chain import ChainError
from templar.chain.embedded.epochs import is_epoch_block
from templar.chain.types import next_epoch_block
from templar.validator.weights import SUBMIT_LAG_WINDOWS, WeightsCadence, WeightSetter

FINNEY = dict(every=15, blocks_per_window=7, tempo=360)  # 84 s windows, 100-block rate limit, 360-block tempo


def due_windows(cadence: WeightsCadence, windows: int) -> list[int]:
    return [w for w in range(windows) if cadence.due(w)]


@pytest.mark.parametrize("netuid", [0, 3, 17, 255])
def test_the_last_submission_before_each_epoch_is_two_windows_before_it(netuid):
    cadence = WeightsCadence(netuid=netuid, **FINNEY)
    due = due_windows(cadence, 2000)
    per_window = cadence.blocks_per_window
    epochs = [b for b in range(per_window * (due[0] + SUBMIT_LAG_WINDOWS), per_window * due[-1]) if
              is_epoch_block(b, netuid, cadence.tempo)]
    assert len(epochs) >= 30
    for epoch in epochs:
        read = max(w for w in due if (w + SUBMIT_LAG_WINDOWS) * per_window <= epoch)  # submitted during w + 1
        assert read == epoch // per_window - SUBMIT_LAG_WINDOWS, (epoch, read)
    gaps = [b - a for a, b in itertools.pairwise(due)]
    # never closer than `every` windows (105 blocks, above finney's rate limit of 100), never a tempo without one
    assert min(gaps) == cadence.every and max(gaps) < 2 * cadence.every, gaps


def test_the_first_epoch_block_at_or_after_a_block_is_the_chains():
    for netuid, tempo in ((0, 360), (3, 360), (7, 9)):
        for block in range(0, 900, 7):
            epoch = next_epoch_block(block, netuid, tempo)
            assert epoch is not None and epoch >= block and is_epoch_block(epoch, netuid, tempo)
            assert not any(is_epoch_block(b, netuid, tempo) for b in range(block, epoch))
    assert next_epoch_block(100, 3, 0) is None


@pytest.mark.parametrize("tempo", [0, 50])
def test_without_an_epoch_to_aim_at_weights_go_every_windows_per_weights_from_window_0(tempo):
    """tempo 0: the chain runs no epochs; 50 blocks: epochs come every 7 windows, closer than 15."""
    cadence = WeightsCadence(every=15, blocks_per_window=7, netuid=3, tempo=tempo)
    assert due_windows(cadence, 200) == list(range(0, 200, 15))


def test_the_next_due_window_is_the_retry_deadline():
    cadence = WeightsCadence(netuid=3, **FINNEY)
    due = due_windows(cadence, 600)
    for window in range(0, 560):
        assert cadence.next_due(window) == min(w for w in due if w > window)


class _Chain:
    """The two things the cadence reads from the chain: the subnet's tempo (or a refusal) and its netuid."""

    netuid = 3

    def __init__(self) -> None:
        self.tempo: int | None = None  # None: the chain does not answer
        self.reads = 0

    def weights_settings(self):
        self.reads += 1
        if self.tempo is None:
            raise ChainError("no answer")
        return SimpleNamespace(tempo=self.tempo)


def test_the_validator_reads_the_tempo_once_every_weights_window_and_keeps_the_last_one_read():
    chain = _Chain()
    windows = SimpleNamespace(windows_per_weights=15, blocks_per_window=7)
    setter = WeightSetter(SimpleNamespace(chain=chain, hp=SimpleNamespace(windows=windows)))

    async def scenario() -> list[WeightsCadence]:
        seen = [await setter.cadence(100)]  # no answer: every 15 windows from window 0
        chain.tempo = 360
        seen += [await setter.cadence(101), await setter.cadence(110)]  # read at 101, not again at 110
        chain.tempo = None
        seen.append(await setter.cadence(116))  # due for a read, no answer: keeps 360
        chain.tempo = 99
        seen.append(await setter.cadence(117))  # the owner changed it: read again
        return seen

    seen = asyncio.run(scenario())
    assert [c.tempo for c in seen] == [0, 360, 360, 360, 99]
    assert chain.reads == 4  # at 100, 101, 116 and 117
    assert [w for w in range(100, 160) if seen[0].due(w)] == [105, 120, 135, 150]
    assert seen[1] == WeightsCadence(netuid=3, **FINNEY)
