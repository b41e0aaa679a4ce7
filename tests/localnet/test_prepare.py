"""A localnet's set-up draws nothing from the OS: `--seed` fixes its hotkeys and each
validator's evaluation secret, so an in-process run (virtual time) repeats bit for bit."""

from __future__ import annotations

import json

import pytest

from templar.localnet.runner import Localnet, LocalnetConfig, plan_newcomers
from templar.validator.files import SECRET_FILE


def _prepared(out, seed: int) -> tuple[dict[str, str], dict[str, bytes]]:
    net = Localnet(LocalnetConfig(out=out, miners=2, validators=2, seed=seed, adversaries=[("copycat", 1)]))
    net.prepare()
    nodes = json.loads((out / "nodes.json").read_text())
    secrets = {n["name"]: (out / "nodes" / n["name"] / SECRET_FILE).read_bytes()
               for n in nodes if n["role"] == "validator"}
    return {n["name"]: n["hotkey"] for n in nodes}, secrets


def test_the_same_seed_prepares_the_same_localnet_and_another_seed_another(tmp_path):
    hotkeys, secrets = _prepared(tmp_path / "a", seed=0)
    assert (hotkeys, secrets) == _prepared(tmp_path / "b", seed=0)
    assert len(set(hotkeys.values())) == len(hotkeys) and len(secrets) == 2
    assert len(set(secrets.values())) == 2 and all(len(s) == 32 for s in secrets.values())
    other_hotkeys, other_secrets = _prepared(tmp_path / "c", seed=7)
    assert set(other_hotkeys.values()).isdisjoint(hotkeys.values())
    assert set(other_secrets.values()).isdisjoint(secrets.values())


def test_a_newcomer_is_on_the_chain_and_the_roster_only_once_the_lead_has_scored_its_windows(tmp_path):
    """`--newcomer W` (`LocalnetConfig.newcomers`): prepared, the run has no newcomer; it is due once the lead
    has scored W windows, and joining registers its hotkey (derived from the seed like every other) with the
    next uid and writes it into nodes.json; a `--resume` sees it joined and does not register it again."""
    from templar.chain.client import load_wallet
    from templar.runtime.records import VALIDATOR_WINDOWS_FILE

    cfg = LocalnetConfig(out=tmp_path / "run", miners=1, adversaries=[], newcomers=[2, 0])
    assert plan_newcomers(cfg) == [("newcomer0", 0), ("newcomer1", 2)]
    net = Localnet(cfg)
    net.prepare()
    assert [n["name"] for n in json.loads((cfg.out / "nodes.json").read_text())] == ["validator0", "miner0"]
    assert net.due_newcomers() == ["newcomer0"] and [name for name, _ in net.pending_newcomers()] == [
        "newcomer0", "newcomer1"]
    joined = net.join("newcomer0")
    assert joined.uid == 3 and joined.role == "miner" and joined.strategy == "honest"
    wallet = load_wallet("localnet", "newcomer0", cfg.out / "wallets", key_seed=net.run_seed())
    assert joined.hotkey == wallet.hotkey.ss58_address
    assert json.loads((cfg.out / "nodes.json").read_text())[-1]["name"] == "newcomer0"
    assert net.due_newcomers() == []  # newcomer1 waits for 2 scored windows
    lead = cfg.out / "nodes" / "validator0" / VALIDATOR_WINDOWS_FILE
    lead.write_text("".join(json.dumps({"window": w}) + "\n" for w in (5, 6)))
    assert net.due_newcomers() == ["newcomer1"]
    resumed = Localnet(LocalnetConfig(out=cfg.out, miners=1, adversaries=[], newcomers=[2, 0], resume=True))
    resumed.prepare()
    assert [name for name, _ in resumed.pending_newcomers()] == ["newcomer1"] and resumed.due_newcomers() == []
    with pytest.raises(ValueError, match="0 or more"):
        plan_newcomers(LocalnetConfig(out=tmp_path, newcomers=[-1]))
