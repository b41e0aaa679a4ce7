"""Fixtures: real embedded chains (SQLite files under tmp_path) driven by the real SDK."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from templar.chain import DevChain, ManualTime, create_dev_chain

NETUID = 3
RATE_LIMIT = 20
BLOCK_TIME = 0.1
GENESIS_TS = 1_700_000_000.0


@pytest.fixture(autouse=True)
def _sdk_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the SDK's token-symbol cache out of $HOME (subprocesses inherit the variable)."""
    monkeypatch.setenv("BTCLI_TOKEN_SYMBOLS_CACHE", str(tmp_path_factory.getbasetemp() / "symbols.json"))


@pytest.fixture
def clock() -> ManualTime:
    """A time source the test moves by hand, so block-based rules are exact and instant."""
    return ManualTime(GENESIS_TS)


@pytest.fixture
def go_to_block(clock: ManualTime) -> Callable[[int], None]:
    """Move the manual clock to the middle of a block (genesis block 1 is at GENESIS_TS)."""

    def go(block: int) -> None:
        clock.value = GENESIS_TS + (block - 1 + 0.5) * BLOCK_TIME

    return go


@pytest.fixture
def rate_limit() -> int:
    return RATE_LIMIT


@pytest.fixture
def dev_chain(tmp_path: Path, clock: ManualTime) -> DevChain:
    """Subnet 3 with two validators (100 and 40 TAO) and two miners, on a hand-driven clock."""
    return create_dev_chain(
        tmp_path / "chain.sqlite",
        netuid=NETUID,
        block_time=BLOCK_TIME,
        weights_rate_limit=RATE_LIMIT,
        hotkeys={"val1": 100.0, "val2": 40.0, "miner1": 0.0, "miner2": 0.0},
        wallet_path=tmp_path / "wallets",
        now=clock,
    )


@pytest.fixture
def open_chains(dev_chain: DevChain, clock: ManualTime) -> Iterator[dict]:
    """`Chain`s for every dev wallet (closed after the test), all on the manual clock."""
    chains = {name: dev_chain.connect(name, now=clock) for name in dev_chain.wallets}
    yield chains
    for chain in chains.values():
        chain.close()


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for child processes: this checkout's sources first on the path."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
