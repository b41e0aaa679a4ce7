"""A localnet's set-up draws nothing from the OS: `--seed` fixes its hotkeys and each
validator's evaluation secret, so an in-process run (virtual time) repeats bit for bit."""

from __future__ import annotations

import json

from templar.localnet.runner import Localnet, LocalnetConfig
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
