"""Several OS processes sharing one embedded chain file, and the `templar chain` commands."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from templar.chain import connect, create_dev_chain
from templar.cli import main

# A child process: register `count` wallets named PREFIX0.. once the parent says go, so the
# two children's write transactions genuinely overlap on the shared file.
WORKER = """
import json, sys, time
from pathlib import Path
from templar.chain import connect, load_wallet
from templar.chain.devchain import register_wallet
from templar.chain.embedded.store import ChainStore

path, wallets, prefix, count, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
with ChainStore(path) as store, connect(network="embedded", chain_endpoint=path, netuid=3,
                                        wallet_name=prefix + "0", wallet_path=wallets) as chain:
    Path(f"{go}.{prefix}").touch()
    while not go.exists():
        time.sleep(0.005)
    out = {}
    for i in range(count):
        wallet = load_wallet(f"{prefix}{i}", "default", wallets, create=True)
        done = register_wallet(chain.for_wallet(wallet), store, stake=1.0 if i == 0 else 0.0)
        out[done.hotkey] = done.uid
print(json.dumps(out))
"""


@pytest.mark.slow(seconds=3)
def test_two_processes_register_concurrently_on_one_file(tmp_path: Path, child_env: dict) -> None:
    path, wallets, go = tmp_path / "chain.sqlite", tmp_path / "wallets", tmp_path / "go"
    create_dev_chain(path, netuid=3, hotkeys={}, wallet_path=wallets, block_time=0.05)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(path), str(wallets), prefix, "5", str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=child_env,
        )
        for prefix in ("a", "b")
    ]
    deadline = time.monotonic() + 60
    while not all(Path(f"{go}.{p}").exists() for p in "ab"):
        assert time.monotonic() < deadline, [c.stderr.read() for c in children if c.poll() is not None]
        time.sleep(0.01)
    go.touch()
    reported: dict[str, int] = {}
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        reported.update(json.loads(out))

    with connect(network="embedded", chain_endpoint=str(path), netuid=3, wallet_name=None) as chain:
        neurons = chain.metagraph()
    assert [n.uid for n in neurons] == list(range(11))  # owner + 2 x 5, no gaps, no duplicates
    assert len({n.hotkey for n in neurons}) == 11
    assert {n.hotkey: n.uid for n in neurons if n.hotkey in reported} == reported
    staked = [n for n in neurons if n.stake > 0]
    assert len(staked) == 2 and all(n.validator_permit and n.stake == pytest.approx(1.0) for n in staked)


def _cli(*args: str) -> int:
    return main(["chain", *args])


def test_cli_init_register_show_and_redaction(tmp_path: Path, child_env: dict, capsys) -> None:
    where = [
        "--subtensor.chain_endpoint",
        str(tmp_path / "chain.sqlite"),
        "--netuid",
        "3",
        "--wallet.path",
        str(tmp_path / "wallets"),
    ]
    embedded = ["--subtensor.network", "embedded", *where]
    assert _cli("init", *where, "--block-time", "0.05", "--weights-rate-limit", "7") == 0
    assert _cli("init", *where) == 0  # idempotent: keeps block time and rate limit
    assert "weights rate limit 7 blocks" in capsys.readouterr().out
    assert _cli("init", *where, "--block-time", "1") == 1
    assert "already runs with block time 0.05s" in capsys.readouterr().err

    # `register` as its own OS process, through the installed entry point module.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "templar.cli",
            "chain",
            "register",
            *embedded,
            "--wallet.name",
            "val",
            "--stake",
            "12.5",
        ],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "is uid 1 on netuid 3 with stake 12.5 TAO" in done.stdout
    assert _cli("register", *embedded, "--wallet.name", "miner") == 0
    assert "is uid 2" in capsys.readouterr().out

    secret = "SECRETsecret0123456789"
    with connect(
        network="embedded", chain_endpoint=where[1], netuid=3, wallet_name="val", wallet_path=where[-1]
    ) as chain:
        chain.commit_bucket(f"s3:http://127.0.0.1:9000|val-bucket|READKEYID|{secret}", validator=True)
        chain.set_weights({2: 1.0})
    with connect(
        network="embedded", chain_endpoint=where[1], netuid=3, wallet_name="miner", wallet_path=where[-1]
    ) as chain:
        chain.commit_bucket("garbage-that-is-no-locator-at-all")

    assert _cli("show", *embedded, "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    assert [n["uid"] for n in shown["neurons"]] == [0, 1, 2]
    assert shown["neurons"][1]["bucket"] == "s3:val-bucket"
    assert shown["neurons"][1]["stake"] == pytest.approx(12.5) and shown["neurons"][1]["validator_permit"]
    assert shown["neurons"][2]["bucket"] == "garbage-that-is-…"
    assert [n["role"] for n in shown["neurons"]] == ["miner", "validator", "miner"]
    assert shown["weights"] == {"1": {"2": 1.0}}
    assert _cli("show", *embedded) == 0
    table = capsys.readouterr().out
    assert "s3:val-bucket" in table and "2: 1.000" in table
    for output in (json.dumps(shown), table):
        assert secret not in output and "READKEYID" not in output


def test_cli_reports_errors_without_traceback(tmp_path: Path, capsys) -> None:
    missing = [
        "--subtensor.network",
        "embedded",
        "--subtensor.chain_endpoint",
        str(tmp_path / "none.sqlite"),
        "--wallet.path",
        str(tmp_path / "w"),
    ]
    assert _cli("show", *missing) == 1
    assert "templar chain init" in capsys.readouterr().err
    assert _cli("init", "--netuid", "3", "--wallet.path", str(tmp_path / "w")) == 1
    assert "--subtensor.chain_endpoint" in capsys.readouterr().err


def test_dev_chain_registers_ten_hotkeys_quickly(tmp_path: Path) -> None:
    start = time.perf_counter()
    dev = create_dev_chain(
        tmp_path / "chain.sqlite",
        netuid=3,
        block_time=0.1,
        hotkeys={f"w{i}": (10.0 if i < 3 else 0.0) for i in range(10)},
        wallet_path=tmp_path / "wallets",
    )
    elapsed = time.perf_counter() - start
    assert sorted(w.uid for w in dev.wallets.values()) == list(range(1, 11))
    assert elapsed < 5.0, f"registering 10 hotkeys took {elapsed:.2f}s"
    # Rerunning is idempotent: same uids, stake topped up only where asked.
    again = create_dev_chain(
        tmp_path / "chain.sqlite",
        netuid=3,
        block_time=0.1,
        hotkeys={"w0": 15.0, "w5": 0.0},
        wallet_path=tmp_path / "wallets",
    )
    assert again["w0"].uid == dev["w0"].uid and again["w0"].stake == pytest.approx(15.0)
    with again.connect("w5") as chain:
        assert chain.metagraph()[again["w0"].uid].stake == pytest.approx(15.0)


def test_dev_chain_with_one_coldkey_and_many_hotkeys(tmp_path: Path) -> None:
    """The localnet layout: one operator wallet, one hotkey per neuron, indexable as (uid, hotkey)."""
    dev = create_dev_chain(
        tmp_path / "chain.sqlite",
        netuid=1,
        block_time=0.1,
        wallet_name="localnet",
        hotkeys={"lead": 10_000.0, "miner-0": 0.0},
        wallet_path=tmp_path / "wallets",
    )
    uid, hotkey = dev["miner-0"][:2]
    assert (uid, dev["lead"].uid) == (2, 1)
    assert dev["lead"].coldkey == dev["miner-0"].coldkey
    assert (tmp_path / "wallets" / "localnet" / "hotkeys" / "miner-0").is_file()
    assert dev.flags("miner-0")[:4] == ["--wallet.name", "localnet", "--wallet.hotkey", "miner-0"]
    with dev.connect("lead") as chain:
        chain.commit_bucket("local:/tmp/lead", validator=True)  # a validator leads once it commits its bucket
    with dev.connect("miner-0") as chain:
        assert chain.hotkey == hotkey and chain.lead_validator().uid == dev["lead"].uid
