"""The localnet's supervising process plans its roster from `templar.localnet.behaviours` and stays
small: it names every neuron's command line without torch, which only the neurons load."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from templar.core.config import REPO_ROOT
from templar.localnet.adversaries import ADVERSARIES, Copycat, Pooled, make_adversary
from templar.localnet.behaviours import ADVERSARY_NAMES, GROUP_SIZES, LOCALNET_BEHAVIOURS
from templar.localnet.runner import Localnet, LocalnetConfig, parse_adversary


def test_the_roster_table_and_the_hooks_name_the_same_adversaries() -> None:
    assert set(ADVERSARIES) == ADVERSARY_NAMES and len(ADVERSARIES) == len(ADVERSARY_NAMES) == 20
    assert ADVERSARY_NAMES | {"moredata"} == LOCALNET_BEHAVIOURS
    assert set(GROUP_SIZES) <= ADVERSARY_NAMES
    assert {name for name in GROUP_SIZES if issubclass(ADVERSARIES[name], Pooled)} == {"pooled", "flood"}  # `faint` shares no work
    for name in ADVERSARY_NAMES:
        hooks = make_adversary(name, target="5Hotkey", pool=[3, 4])
        assert hooks.name == name
        assert not isinstance(hooks, Copycat) or hooks.target == "5Hotkey"
    with pytest.raises(ValueError, match="unknown adversary 'honest'"):
        parse_adversary("honest")


SUPERVISOR = """
import json, sys
from pathlib import Path
from templar.localnet.behaviours import LOCALNET_BEHAVIOURS
from templar.localnet.runner import Localnet, LocalnetConfig, parse_adversary
net = Localnet(LocalnetConfig(out=Path(sys.argv[1]), miners=1, validators=2, live=False,
                              adversaries=[parse_adversary(name) for name in sorted(LOCALNET_BEHAVIOURS)]))
net.prepare()
net.check_corpus()
commands = {node.name: net._command(node)[0][1:] for node in net.nodes}
loaded = sorted(m for m in ("torch", "transformers", "templar.localnet.adversaries", "templar.validator.state")
                if m in sys.modules)
print(json.dumps({"loaded": loaded, "commands": commands}))
"""


def test_the_supervisor_plans_prepares_and_names_every_neuron_without_torch(tmp_path) -> None:
    """Every behaviour at once: the chain, wallets and validator secrets are prepared, the corpus is
    checked and every neuron's command line is built in a process that never loads torch, transformers,
    the adversaries' hooks or the validator's state (before: 1.8 s of CPU and 276 MB for this much)."""
    out = subprocess.run([sys.executable, "-c", SUPERVISOR, str(tmp_path / "net")], capture_output=True, text=True,
                         timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["loaded"] == []
    commands = said["commands"]
    assert commands["moredata0"][0].endswith("neurons/miner.py") and "--extra-pages" in commands["moredata0"]
    for name in ("copycat0", "overclaim0", "pooled0-1", "flood0-5", "duplicate0"):
        assert commands[name][:3] == ["-m", "templar.localnet.adversary", "--strategy"], commands[name]
    assert commands["dup0-twin"][0].endswith("neurons/miner.py")
    pool = commands["pooled0-1"][commands["pooled0-1"].index("--pool.uids") + 1].split(",")
    assert len(pool) == GROUP_SIZES["pooled"]
    assert (tmp_path / "net" / "nodes" / "validator1" / "eval_secret").stat().st_size == 32


def test_the_adversary_entry_point_parses_and_checks_its_flags_before_torch(tmp_path) -> None:
    """`python -m templar.localnet.adversary` answers a bad command line as `neurons/miner.py` does:
    before the hooks, torch and the miner load."""
    probe = ("import sys; from templar.localnet import adversary; "
             f"args = adversary.parse_args(['--strategy', 'thin', '--hparams', {str(tmp_path / 'missing.json')!r}]); "
             "code = adversary.check_config(args); "
             "print(code, sorted(m for m in ('torch', 'transformers', 'templar.localnet.adversaries') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "3 []"
    bad = subprocess.run([sys.executable, "-m", "templar.localnet.adversary", "--strategy", "honest"],
                         capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "invalid choice: 'honest'" in bad.stderr


def test_a_localnet_without_its_corpus_says_so_before_starting_a_neuron(tmp_path) -> None:
    preset = tmp_path / "nocorpus.json"
    preset.write_text(json.dumps({"base": str(REPO_ROOT / "hparams" / "tiny.json"), "name": "tiny-nocorpus", "data": {"corpus": str(tmp_path / "absent")}}))
    net = Localnet(LocalnetConfig(out=tmp_path / "net", miners=1, hparams=str(preset), adversaries=[], live=False))
    net.prepare()
    with pytest.raises(FileNotFoundError, match="absent"):
        net.start()
    assert net.procs == {}
