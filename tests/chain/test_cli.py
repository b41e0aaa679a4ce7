"""`templar chain show` against what peers commit: a commitment is any printable ASCII a peer chose."""

from __future__ import annotations

from pathlib import Path

import pytest

from templar.chain import connect, create_dev_chain
from templar.cli import main


@pytest.mark.parametrize("bucket", ["[/bold]", "[/]", "[link=https://evil.example/]click[/link]", "[blink]x"])
def test_show_prints_a_peers_commitment_as_text_not_rich_markup(tmp_path: Path, capsys, monkeypatch,
                                                                bucket: str) -> None:
    """rich reads `[...]` in a table cell as markup: an unbalanced closing tag crashed the command with a
    traceback, and a balanced one styled the operator's terminal or planted a hyperlink (OSC 8) in it."""
    monkeypatch.setenv("COLUMNS", "200")  # one line per row: the cell is found whole
    path, wallets = tmp_path / "chain.sqlite", tmp_path / "wallets"
    create_dev_chain(path, netuid=3, hotkeys={"peer": 0.0}, wallet_path=wallets, block_time=0.05)
    with connect(network="embedded", chain_endpoint=str(path), netuid=3, wallet_name="peer",
                 wallet_path=wallets) as chain:
        chain.commit_bucket(f"s3:http://203.0.113.7|{bucket}|READKEYID|secret123")
    args = ["--subtensor.network", "embedded", "--subtensor.chain_endpoint", str(path), "--netuid", "3"]
    assert main(["chain", "show", *args]) == 0
    out = capsys.readouterr().out
    assert f"s3:{bucket}" in out  # said as committed, not read as markup
    assert "\x1b]8;" not in out and "READKEYID" not in out
