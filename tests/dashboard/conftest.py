"""Fixtures: a small real run directory (embedded chain + records) and the dashboard serving it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from templar.dashboard.server import BackgroundDashboard, start_localnet_dashboard

from .runfixture import NETUID, Run, build_run


@pytest.fixture(autouse=True)
def _sdk_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the SDK's token-symbol cache out of $HOME."""
    monkeypatch.setenv("BTCLI_TOKEN_SYMBOLS_CACHE", str(tmp_path_factory.getbasetemp() / "symbols.json"))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return build_run(tmp_path_factory.mktemp("run") / "localnet")


def serve_localnet(out: Path) -> BackgroundDashboard:
    """The dashboard exactly as `templar localnet --dashboard` starts it, on a free port."""
    dash = start_localnet_dashboard(out, "tiny", 0, NETUID)
    assert dash is not None
    dash.board.refresh_files()
    dash.board.refresh_chain(force=True)  # the first page already shows the chain
    return dash


def serve_chain_only(out: Path) -> BackgroundDashboard:
    """The dashboard of an operator without a validator's state directory (a miner's, say), on a localnet's
    embedded chain alone: the peers page is the chain's subnet table."""
    from templar.chain import connect
    from templar.dashboard.board import Board, BoardConfig

    config = BoardConfig(connect=lambda: connect(network="embedded", chain_endpoint=str(out / "chain.sqlite"),
                                                 netuid=NETUID, wallet_name=None),
                         chain_label=f"embedded netuid {NETUID}", blocks_per_window=20)
    dash = BackgroundDashboard(Board(config), "127.0.0.1", 0).start()
    dash.board.refresh_chain(force=True)
    return dash


@pytest.fixture(scope="module")
def dashboard(run: Run) -> Iterator[BackgroundDashboard]:
    dash = serve_localnet(run.out)
    yield dash
    dash.stop()
