"""The node runtime's edges: entry points decide exit codes (library code raises), the production
miner's flags know nothing of adversaries, and a peer's commitment can only hurt its owner."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from templar.core.config import REPO_ROOT
from templar.runtime.flags import add_node_args
from templar.runtime.lock import StateLock
from templar.runtime.node import EXIT_CONFIG, EXIT_STATE_LOCKED, Node, StartupError, start_node
from templar.storage import LocalBucket


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_node_args(parser)
    return parser.parse_args(list(argv))


def test_a_configuration_error_is_one_line_and_exit_code_3(tmp_path):
    done = _run(str(REPO_ROOT / "neurons" / "miner.py"), "--hparams", str(tmp_path / "missing.json"),
                "--subtensor.network", "embedded", "--subtensor.chain_endpoint", str(tmp_path / "chain.sqlite"))
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "Traceback" not in done.stderr and "missing.json" in done.stderr


def test_more_extra_pages_than_the_run_allows_is_a_configuration_error(tmp_path):
    """`--extra-pages` beyond the run's `data.max_extra_pages` (tiny: 2) exits 3 with one line before
    anything loads: every validator would refuse the payloads it declares them in."""
    done = _run(str(REPO_ROOT / "neurons" / "miner.py"), "--hparams", "tiny", "--extra-pages", "3",
                "--subtensor.network", "embedded", "--subtensor.chain_endpoint", str(tmp_path / "chain.sqlite"))
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert "--extra-pages 3: this run allows 0 to 2" in done.stderr and "Traceback" not in done.stderr


def test_start_node_raises_instead_of_exiting(tmp_path):
    args = _args("--hparams", "tiny", "--subtensor.network", "embedded",
                 "--subtensor.chain_endpoint", str(tmp_path / "no-chain.sqlite"))
    with pytest.raises(StartupError) as info:
        asyncio.run(start_node(args, "miner"))
    assert info.value.exit_code == EXIT_CONFIG and "chain" in str(info.value)


@pytest.mark.slow(seconds=5)
def test_the_production_miner_has_no_adversary_switches():
    shown = _run(str(REPO_ROOT / "neurons" / "miner.py"), "--help").stdout
    assert "--extra-pages" in shown
    for hidden in ("--strategy", "--copy.hotkey", "copycat", "signflip"):
        assert hidden not in shown
    adversary = _run("-m", "templar.localnet.adversary", "--help").stdout
    assert "--strategy" in adversary and "copycat" in adversary


def test_the_node_flags_load_neither_torch_nor_transformers():
    """`neurons/*.py --help` and a bad command line answer at once: the flags are parsed before the
    node's imports (about 5 s of CPU: torch, transformers, the model code) are loaded."""
    probe = ("import sys, templar.runtime.flags as f, argparse; f.add_node_args(argparse.ArgumentParser()); "
             "print(sorted(m for m in ('torch', 'transformers', 'templar.runtime.node') if m in sys.modules))")
    assert _run("-c", probe).stdout.strip() == "[]"


def test_a_bad_hparams_file_or_a_held_state_directory_is_answered_before_torch_loads(tmp_path):
    """The entry points' pre-flight check (`check_config`) names the bad file, the unpublished corpus, or the
    pid of the node holding the state directory, and gives the exit code `start_node` would, without importing torch,
    transformers or the node. Under torchrun only rank 0 asks (the other ranks take no lock)."""
    bad = tmp_path / "typo.json"
    bad.write_text(json.dumps({"base": str(REPO_ROOT / "hparams" / "tiny.json"), "gauntlet": {"top_gg": 4}}))
    held, free = tmp_path / "held", tmp_path / "free"
    held.mkdir()
    lock = StateLock(held)  # this process is the node on `held`
    probe = ("import os, sys, argparse, templar.runtime.flags as f; p = argparse.ArgumentParser(); f.add_node_args(p); "
             f"code = f.check_config(p.parse_args(['--hparams', {str(bad)!r}])); "
             f"ok = f.check_config(p.parse_args(['--hparams', 'tiny', '--state.dir', {str(free)!r}])); "
             f"locked = f.check_config(p.parse_args(['--hparams', 'tiny', '--state.dir', {str(held)!r}])); "
             "os.environ['RANK'] = '1'; "
             f"follower = f.check_config(p.parse_args(['--hparams', 'tiny', '--state.dir', {str(held)!r}])); "
             f"unpublished = f.check_config(p.parse_args(['--state.dir', {str(free)!r}])); "
             "print(code, ok, locked, follower, unpublished, sorted(m for m in ('torch', 'transformers', "
             "'templar.runtime.node') if m in sys.modules))")
    try:
        done = _run("-c", probe)
    finally:
        lock.release()
    assert done.stdout.strip() == f"{EXIT_CONFIG} 0 {EXIT_STATE_LOCKED} 0 {EXIT_CONFIG} []", done.stderr
    # production's hparams.json before its corpus is published: the docs' exit 3 and line, before the chain
    assert "data: this run's corpus is not published yet (hparams data.manifest is empty)" in done.stderr
    assert "typo.json" in done.stderr and "top_gg" in done.stderr and "Traceback" not in done.stderr
    assert f"in use by another node (pid {os.getpid()})" in done.stderr, done.stderr
    assert not (free / "node.lock").exists()  # asking created nothing


class _Chain:
    """A chain whose commitments are whatever peers wrote."""

    def __init__(self, locators: dict[str, str]) -> None:
        self.locators = locators

    def bucket_locators(self) -> dict[str, str]:
        return self.locators


def _node(locators: dict[str, str], **kw) -> Node:
    unused = SimpleNamespace()
    return Node(hp=unused, chain=_Chain(locators), clock=SimpleNamespace(now=lambda: 0.0), uid=0, model=unused, pages=unused, plan=unused,
                bucket=unused, state_dir=unused, device=unused, compute=unused, **kw)


def test_hostile_commitments_hurt_only_their_owner(tmp_path):
    good = tmp_path / "good"
    LocalBucket(good)  # an honest peer's existing bucket
    never = tmp_path / "never" / "created"
    locators = {"honest": f"local:{good}", "passwd": "local:/etc/passwd", "made-up": f"local:{never}",
                "garbage": "\x00not a locator", "loopback": "s3:http://127.0.0.1:1/b:" + "0" * 20 + ":" + "0" * 40}

    async def scenario(allow_private: bool):
        node = _node(locators, allow_private_endpoints=allow_private)
        return await node.peer_buckets(), node.bucket_faults

    opened, faults = asyncio.run(scenario(True))
    assert "honest" in opened and "garbage" not in opened
    assert "garbage" in faults and "honest" not in faults  # its gathers are `unreachable`, with this reason
    assert not never.exists() and not (tmp_path / "never").exists(), "a peer's locator created directories"
    public, faults = asyncio.run(scenario(False))  # finney/test: no local or private buckets at all
    assert not {"honest", "passwd", "made-up", "loopback"} & set(public)
    assert {"honest", "passwd", "made-up", "loopback", "garbage"} <= set(faults)


class _Opened:
    """A peer's bucket as the node opens it, which says whether it was closed."""

    def __init__(self, locator: object) -> None:
        self.locator, self.closed = locator, False

    async def aclose(self) -> None:
        self.closed = True


def test_buckets_and_faults_of_hotkeys_that_left_are_closed_and_forgotten(tmp_path):
    """Every hotkey that ever held a uid stayed in the node's bucket cache (with its opened S3 client)
    and in its faults, for as long as the node ran: 2,000 re-registrations on a 256-uid subnet left
    1,974 open clients (~650 MiB). What the node keeps is bounded by the registered hotkeys, and a
    bucket whose commitment left, or turned unusable, is closed."""
    opened: list[_Opened] = []

    def open_bucket(locator: object, **_: object) -> _Opened:
        opened.append(_Opened(locator))
        return opened[-1]

    locators = {f"hk{uid}-0": (f"local:{tmp_path / str(uid)}" if uid % 4 else "garbage") for uid in range(16)}
    node = _node(locators, allow_private_endpoints=True, open_bucket=open_bucket)

    async def churn() -> None:
        for window in range(200):  # one uid changes hands per window
            uid = window % 16
            del locators[next(hk for hk in locators if hk.startswith(f"hk{uid}-"))]
            locators[f"hk{uid}-{window + 1}"] = f"local:{tmp_path / str(uid)}" if uid % 4 else "garbage"
            await node.peer_buckets(sorted(locators))
        await node.peer_buckets()

    asyncio.run(churn())
    assert set(node._peer_buckets) | set(node.bucket_faults) == set(locators)
    assert len(node._peer_buckets) == 12 and len(node.bucket_faults) == 4
    assert sum(not b.closed for b in opened) == 12  # only the registered hotkeys' buckets are open

    turned = next(hk for hk in sorted(node._peer_buckets))
    bucket = node._peer_buckets[turned][1]
    locators[turned] = "garbage"  # its commitment changed to one that does not parse
    asyncio.run(node.peer_buckets())
    assert bucket.closed and turned not in node._peer_buckets and turned in node.bucket_faults


def test_windows_a_lead_led_read_the_bucket_it_committed_since(tmp_path):
    """A lead that rotates its read key (or moves its bucket) commits a new locator; the node opens the new
    bucket and closes the old. The decisions of the windows it led kept the old one, and every read through
    them (catch-up's aggregates, the sync check's progress) failed with "bucket is closed" until they left the
    node's 64-window history, a re-sync replaying into the same failure (a review). They read the new one."""
    import dataclasses

    from templar.chain import Neuron
    from templar.runtime.consensus.succession import Decision, Lead
    from templar.wire import StepInputs

    opened: list[_Opened] = []

    def open_bucket(locator: object, **_: object) -> _Opened:
        opened.append(_Opened(locator))
        return opened[-1]

    locators = {"lead": f"local:{tmp_path / 'old'}", "other": f"local:{tmp_path / 'other'}"}
    node = _node(locators, allow_private_endpoints=True, open_bucket=open_bucket)
    validator = Neuron(uid=3, hotkey="lead", coldkey="c", stake=10.0, validator_permit=True, last_update=0,
                       commitment=locators["lead"], validates=True)

    async def scenario() -> None:
        first = await node.peer_buckets()
        inputs = StepInputs(20, 5, (("miner", b"\x01" * 32),))
        for window in (20, 21):
            node.leads.remember(Decision(window, True, slot=0, lead=Lead(validator, first["lead"]), inputs=inputs))
        other = dataclasses.replace(validator, uid=4, hotkey="other", commitment=locators["other"])
        node.leads.remember(Decision(22, True, slot=0, lead=Lead(other, first["other"]), inputs=inputs))
        locators["lead"] = f"local:{tmp_path / 'new'}"  # the read key rotated
        now = await node.peer_buckets()
        assert first["lead"].closed and not now["lead"].closed
        assert [node.leads.decisions[w].lead.bucket for w in (20, 21)] == [now["lead"]] * 2
        assert node.leads.decisions[22].lead.bucket is first["other"]  # another hotkey's: as it was
        assert node.leads.decisions[20].inputs == inputs
        locators["lead"] = "garbage"  # its commitment turned unusable: nothing of it is read, no closed bucket
        await node.peer_buckets()
        assert now["lead"].closed and node.leads.decisions[20].lead.bucket is None
        del locators["other"]  # deregistered
        await node.peer_buckets()
        assert first["other"].closed and node.leads.decisions[22].lead.bucket is None

    asyncio.run(scenario())


def test_a_locator_carrying_the_write_secret_is_never_committed(monkeypatch):
    """The node commits its `--bucket.locator` on chain, in public. Pasted with the write key's secret as its
    read secret, it was committed as it was, and anyone reading the chain could overwrite or delete the
    bucket: the node now refuses it at start, as `templar bucket locator` and the doctor do, naming neither key."""
    import argparse

    from templar.runtime.node import _open_own_bucket

    secret = "writesecret1234567890"
    monkeypatch.setenv("TEMPLAR_BUCKET_WRITE_KEY_ID", "writekeyid")
    monkeypatch.setenv("TEMPLAR_BUCKET_WRITE_SECRET", secret)
    args = argparse.Namespace(bucket_locator=f"s3:https://s3.example.com|my-bucket|writekeyid|{secret}",
                              bucket_credentials=None)

    def never(*_args, **_kwargs):
        raise AssertionError("the bucket was opened (and its locator would be committed)")

    with pytest.raises(StartupError, match="WRITE key") as info:
        asyncio.run(_open_own_bucket(args, chain=None, time=None, open_bucket=never))  # type: ignore[arg-type]
    assert info.value.exit_code == EXIT_CONFIG and secret not in str(info.value)


def test_a_write_key_file_other_users_may_open_stops_the_node(tmp_path):
    """A write key file left mode 0644 by the umask lets every user of the machine overwrite the bucket:
    the node stops at start with the fix (chmod 600), as ssh does with an open private key."""
    import argparse
    import json

    from templar.runtime.node import _open_own_bucket

    key_file = tmp_path / "bucket-write.json"
    key_file.write_text(json.dumps({"access_key_id": "writekeyid", "secret_access_key": "writesecret1234567890"}))
    key_file.chmod(0o644)
    args = argparse.Namespace(bucket_locator="s3:https://s3.example.com|my-bucket|readkeyid|readsecret1234567890",
                              bucket_credentials=str(key_file))

    def never(*_args, **_kwargs):
        raise AssertionError("the bucket was opened with a write key others can read")

    with pytest.raises(StartupError, match=r"mode 0644.*chmod 600") as info:
        asyncio.run(_open_own_bucket(args, chain=None, time=None, open_bucket=never))  # type: ignore[arg-type]
    assert info.value.exit_code == EXIT_CONFIG and "writesecret" not in str(info.value)


def test_a_validators_locator_leaves_room_for_its_role_mark_and_a_shadow_commits_nothing(tmp_path):
    """A validator commits its locator after the 2-byte mark `v:` (`templar.chain.is_miner`): a 127-byte
    locator, which a miner commits, stops a validator at start with the limit and the fix; a `--shadow`
    on it commits nothing, so it starts."""
    from templar.chain import Commitment
    from templar.core.clock import SYSTEM_TIME
    from templar.runtime.node import _open_own_bucket

    directory = tmp_path / ("b" * (127 - len("local:") - len(str(tmp_path)) - 1))
    directory.mkdir()
    committed: list[tuple[str, bool]] = []
    chain = SimpleNamespace(hotkey="hk", commitments=lambda: {},
                            commit_bucket=lambda locator, validator=False: committed.append((locator, validator)))
    args = argparse.Namespace(bucket_locator=f"local:{directory}", bucket_credentials=None)
    assert len(args.bucket_locator) == 127

    async def open_as(**role) -> None:
        bucket = await _open_own_bucket(args, chain, SYSTEM_TIME, lambda loc, cred, **kw: LocalBucket(loc.path),
                                        **role)
        await bucket.aclose()

    asyncio.run(open_as(validator=False))
    assert committed == [(args.bucket_locator, False)]
    with pytest.raises(StartupError, match="126 of the chain's bytes") as info:
        asyncio.run(open_as(validator=True))
    assert info.value.exit_code == EXIT_CONFIG and len(committed) == 1
    asyncio.run(open_as(validator=True, commit=False))
    assert len(committed) == 1
    with pytest.raises(ValueError):
        Commitment(args.bucket_locator, validates=True).encode()
