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


@pytest.fixture(scope="module")
def dashboard(run: Run) -> Iterator[BackgroundDashboard]:
    dash = serve_localnet(run.out)
    yield dash
    dash.stop()
