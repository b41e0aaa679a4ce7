"""Every `templar doctor` check, passing and failing, against a real embedded chain and a real
SeaweedFS server: an unregistered hotkey, a skewed clock, a read key that can write, a stalled
bucket, a wrong manifest, another run's hparams, and the rest."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import pytest

from templar.chain import create_dev_chain
from templar.chain.embedded.store import ChainStore
from templar.comms import put_start_window
from templar.core.config import PRESETS_DIR, PROTOCOL_VERSION, REPO_ROOT, load_hparams
from templar.core.memory import GIB
from templar.doctor import Doctor, Status, run_checks
from templar.doctor import bucket as bucket_checks
from templar.doctor import chain as chain_checks
from templar.doctor import machine as machine_checks
from templar.doctor.result import format_results
from templar.runtime.flags import add_memory_args, add_node_args
from templar.storage import LocalBucket, S3Bucket
from templar.storage.locator import WRITE_KEY_ID_ENV, WRITE_SECRET_ENV, BucketLocator
from templar.wire import Run

NETUID = 7


@pytest.fixture(autouse=True)
def _sdk_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BTCLI_TOKEN_SYMBOLS_CACHE", str(tmp_path_factory.getbasetemp() / "symbols.json"))
    for name in (WRITE_KEY_ID_ENV, WRITE_SECRET_ENV, "TEMPLAR_BUCKET", "TEMPLAR_BUCKET_CREDENTIALS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def subnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lead validator (100 τ), a miner and a staked "miner"; "stranger" has keys but no uid."""
    root = tmp_path_factory.mktemp("doctor")
    with create_dev_chain(root / "chain.sqlite", netuid=NETUID, block_time=1.0, weights_rate_limit=10,
                          hotkeys={"lead": 100.0, "miner": 0.0, "staked": 5.0},
                          wallet_path=root / "wallets").connect("lead") as chain:
        chain.commit_bucket(f"local:{root / 'buckets' / 'lead'}", validator=True)  # the succession counts validators
    from templar.chain import load_wallet

    load_wallet("stranger", "default", root / "wallets", create=True)
    return root


def flags(root: Path, wallet: str, *extra: str, hparams: str = "tiny") -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_node_args(parser)
    return parser.parse_args(["--wallet.name", wallet, "--wallet.path", str(root / "wallets"), "--netuid", str(NETUID),
                              "--subtensor.network", "embedded", "--subtensor.chain_endpoint",
                              str(root / "chain.sqlite"), "--hparams", hparams, "--state.dir",
                              str(root / "state" / wallet), *extra])


def run(d: Doctor, *checks):
    """Run `checks` in order on `d` (each later one sees what the earlier ones found); returns the last."""
    async def body():
        try:
            return [await c(d) for c in checks]
        finally:
            await bucket_checks.cleanup_probe(d)
            await d.close()

    return asyncio.run(body())[-1]


def identity(d: Doctor):
    """hparams, wallet and a chain connection: what check_chain leaves behind, without its clock
    measurement (up to two block times; `test_chain_and_this_machines_clock` covers it)."""
    return (chain_checks.check_hparams, chain_checks.check_wallet, _connect)


async def _connect(d: Doctor) -> None:
    from templar.chain import connect

    a = d.args
    chain = connect(network=a.subtensor_network, chain_endpoint=a.subtensor_chain_endpoint, netuid=a.netuid,
                    wallet_name=None)
    d.chain = chain.for_wallet(d.wallet) if d.wallet is not None else chain


# -- who the node is ----------------------------------------------------------------------------


def test_hparams_and_wallet(subnet, tmp_path):
    d = Doctor(flags(subnet, "miner"), "miner")
    assert run(d, chain_checks.check_hparams).status == Status.OK and d.hp.name == "tiny"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"base": str(PRESETS_DIR / "tiny.json"), "windows": {"block_time": -1}}))
    result = run(Doctor(flags(subnet, "miner", hparams=str(bad)), "miner"), chain_checks.check_hparams)
    assert result.status == Status.FAILED and "block_time" in result.summary
    assert run(Doctor(flags(subnet, "miner"), "miner"), chain_checks.check_wallet).status == Status.OK
    missing = run(Doctor(flags(subnet, "nobody"), "miner"), chain_checks.check_wallet)
    assert missing.status == Status.FAILED and "nobody" in missing.summary
    assert missing.fix == "create them: templar chain register --wallet.name nobody --wallet.hotkey default"
    assert not (subnet / "wallets" / "nobody").exists(), "the doctor creates nothing"


def test_the_wallet_fix_is_the_one_recipe_of_the_docs(subnet, tmp_path):
    """A missing wallet on a real network has one recipe: the fix line's, which docs/mining.md §3
    gives too; the summary says only what is missing."""
    def on_finney(wallet: str, path: Path) -> Doctor:
        args = flags(subnet, wallet, "--subtensor.network", "finney", "--wallet.path", str(path))
        return Doctor(args, "miner")

    fresh = run(on_finney("W", tmp_path / "empty"), chain_checks.check_wallet)
    said = fresh.summary.replace(str(tmp_path), "")  # the scratch path may hold any word
    assert fresh.status == Status.FAILED and "btcli" not in said and "templar" not in said
    assert fresh.fix == f"create them: btcli wallet create -w W -H default --wallet-path {tmp_path / 'empty'}"
    mining = (REPO_ROOT / "docs" / "mining.md").read_text()
    assert "btcli wallet create -w W -H H" in mining and "btcli wallet new-hotkey -w W -H H" in mining
    # a coldkey without this hotkey: a new hotkey for it, not a new coldkey
    other = run(on_finney("stranger", subnet / "wallets"), chain_checks.check_wallet)
    assert other.status == Status.OK
    hotkeyless = Doctor(flags(subnet, "stranger", "--subtensor.network", "finney", "--wallet.hotkey", "second"),
                        "miner")
    assert run(hotkeyless, chain_checks.check_wallet).fix.startswith("create them: btcli wallet new-hotkey -w "
                                                                      "stranger -H second")


def test_chain_and_this_machines_clock(subnet, tmp_path):
    clock = (chain_checks.check_hparams, chain_checks.check_wallet, chain_checks.check_chain)
    d = Doctor(flags(subnet, "miner"), "miner")
    result = run(d, *clock)
    assert result.status == Status.OK and abs(result.data["skew_seconds"]) < 0.2, result
    ahead = Doctor(flags(subnet, "miner"), "miner", chain_now=lambda: time.time() + 30)
    result = run(ahead, *clock)
    assert result.status == Status.FAILED and -31 < result.data["skew_seconds"] < -29, result
    assert "clock_skew_seconds" in result.summary and "NTP" in result.fix
    nowhere = flags(subnet, "miner")
    nowhere.subtensor_chain_endpoint = str(tmp_path / "none.sqlite")
    assert run(Doctor(nowhere, "miner"), chain_checks.check_chain).status == Status.FAILED


def test_registration_stake_and_permit(subnet):
    def check(wallet: str, role: str):
        d = Doctor(flags(subnet, wallet), role)
        return run(d, *identity(d), chain_checks.check_registration)

    assert check("miner", "miner").status == Status.OK
    assert check("lead", "validator").status == Status.OK and check("lead", "validator").data["lead"]
    stranger = check("stranger", "miner")
    assert stranger.status == Status.FAILED and "not registered on netuid 7" in stranger.summary
    assert "templar chain register" in stranger.fix
    unstaked = check("miner", "validator")
    assert unstaked.status == Status.FAILED and "stake" in unstaked.fix
    staked = check("staked", "miner")  # a permit and stake, its commitment no validator's: a miner all the same
    assert staked.status == Status.OK and staked.data["permit"] and staked.data["stake"] > 0
    declared = check("lead", "miner")  # a validator's hotkey run as a miner: it commits bare, and leads nothing
    assert declared.status == Status.OK and "declares a validator" in declared.summary and not declared.data["lead"]


def test_the_doctor_applies_the_chains_rules_for_the_lead_and_the_miners(subnet):
    """The doctor says what the nodes do: its lead is `Chain.lead_validator` (`lead_of`) and the
    hotkeys it counts as miners are `is_miner`'s, not a rule of its own."""
    from templar.chain import connect, is_miner

    d = Doctor(flags(subnet, "staked"), "validator")
    result = run(d, *identity(d), chain_checks.check_registration)
    a = d.args
    lead = connect(network=a.subtensor_network, chain_endpoint=a.subtensor_chain_endpoint, netuid=a.netuid,
                   wallet_name=None).lead_validator()
    assert lead is not None and not result.data["lead"]  # 5 τ against the lead's 100
    assert result.summary.endswith(f"lead is uid {lead.uid}")
    staked = next(n for n in d.neurons if n.uid == d.uid)
    assert staked.validator_permit and staked.stake > 0 and is_miner(staked)  # it declared no validator
    assert {n.hotkey for n in d.neurons if not is_miner(n)} == {lead.hotkey}


def test_weights_settings_of_the_subnet(subnet, tmp_path):
    def check():
        d = Doctor(flags(subnet, "lead"), "validator")
        return run(d, *identity(d), chain_checks.check_registration, chain_checks.check_weights_settings)

    assert check().status == Status.OK
    with ChainStore(subnet / "chain.sqlite") as store:
        store.set_subnet_params(NETUID, weights_rate_limit=500)
        try:
            slow = check()
            store.set_subnet_params(NETUID, weights_rate_limit=10, commit_reveal=1)
            reveal = check()
        finally:
            store.set_subnet_params(NETUID, weights_rate_limit=10, commit_reveal=0)
    assert slow.status == Status.WARNING and slow.data["rate_limit"] == 500 and slow.data["cadence_blocks"] == 40
    assert reveal.status == Status.FAILED and "embedded chain cannot reveal" in reveal.summary
    d = Doctor(flags(subnet, "miner"), "miner")
    assert run(d, chain_checks.check_weights_settings).status == Status.SKIPPED


def test_our_run_against_the_leads(subnet, tmp_path):
    lead_bucket = subnet / "buckets" / "lead"
    with create_dev_chain(subnet / "chain.sqlite", netuid=NETUID, block_time=1.0, weights_rate_limit=10,
                          hotkeys={"lead": 100.0}, wallet_path=subnet / "wallets").connect("lead") as chain:
        chain.commit_bucket(f"local:{lead_bucket}", validator=True)

    def check():
        d = Doctor(flags(subnet, "miner"), "miner")
        return run(d, *identity(d), chain_checks.check_lead_run)

    assert check().status == Status.WARNING  # nothing published yet
    hp = load_hparams("tiny")
    asyncio.run(put_start_window(LocalBucket(lead_bucket), 5, run=Run(NETUID, hp.digest())))
    assert check().status == Status.OK
    (lead_bucket / f"v{PROTOCOL_VERSION}" / "start_window.json").unlink()  # (the lead's is create-only: another run's bucket)
    asyncio.run(put_start_window(LocalBucket(lead_bucket), 5, run=Run(NETUID, "ab" * 32)))
    other = check()
    assert other.status == Status.FAILED and "wrong_run" in other.summary and other.data["lead_run"] == "ab" * 32
    d = Doctor(flags(subnet, "lead"), "validator")
    assert run(d, *identity(d), chain_checks.check_lead_run).summary.startswith("this validator is the lead")


def test_the_leads_words_cannot_rewrite_the_doctors_lines(subnet):
    """The lead's start_window.json is a peer's file: its `run` was quoted in the failure, and a `\\r` or an
    escape sequence in it would overwrite `failed` with `ok` on the operator's terminal. The doctor now reads
    it with the nodes' own reader (`comms.exchange.parse_record`), which takes a run only as 64 hex
    digits: such a record is no run record, and nothing of it reaches the line. So is `"netuid": Infinity`,
    which made the check itself fail (OverflowError, "report this")."""
    lead_bucket = subnet / "buckets" / "lead"
    with create_dev_chain(subnet / "chain.sqlite", netuid=NETUID, block_time=1.0, weights_rate_limit=10,
                          hotkeys={"lead": 100.0}, wallet_path=subnet / "wallets").connect("lead") as chain:
        chain.commit_bucket(f"local:{lead_bucket}", validator=True)
    record = lead_bucket / f"v{PROTOCOL_VERSION}" / "start_window.json"
    before = record.read_bytes() if record.exists() else None
    record.parent.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for text in (json.dumps({"run": "\r\x1b[2Kok      \n", "netuid": NETUID, "window": 5}),
                     '{"protocol": ' + str(PROTOCOL_VERSION) + ', "run": "' + "ab" * 32 + '", "netuid": Infinity, "start_window": 5}'):
            record.write_text(text)
            d = Doctor(flags(subnet, "miner"), "miner")
            results.append(run(d, *identity(d), chain_checks.check_lead_run))
    finally:
        record.unlink()
        if before is not None:
            record.write_bytes(before)
    for result in results:
        assert result.status == Status.WARNING and "not a run record" in result.summary, result
        shown = format_results([result])
        assert "\x1b" not in shown and "\r" not in shown and len(shown.splitlines()) == 3  # the line, its fix, the total


# -- the bucket ---------------------------------------------------------------------------------


def bucket_flags(subnet: Path, locator: str, *extra: str) -> argparse.Namespace:
    return flags(subnet, "miner", "--bucket.locator", locator, *extra)


def bucket_checks_of(d: Doctor):
    return (chain_checks.check_hparams, bucket_checks.check_bucket_locator, bucket_checks.check_bucket_write,
            bucket_checks.check_bucket_read, bucket_checks.check_bucket_read_only,
            bucket_checks.check_bucket_throughput)


def test_bucket_with_a_read_only_key_passes_every_check(subnet, seaweed, new_bucket, monkeypatch):
    name = new_bucket()
    monkeypatch.setenv(WRITE_KEY_ID_ENV, seaweed.admin.access_key_id)
    monkeypatch.setenv(WRITE_SECRET_ENV, seaweed.admin.secret_access_key)
    d = Doctor(bucket_flags(subnet, seaweed.locator(name).encode()), "miner", timeout=10)

    async def body():
        try:
            return [await c(d) for c in bucket_checks_of(d)]
        finally:
            await bucket_checks.cleanup_probe(d)
            await d.close()

    results = asyncio.run(body())
    assert [r.status for r in results] == [Status.OK] * 6, results
    assert results[-1].data["payload_bytes"] > 100_000
    left = asyncio.run(_keys(S3Bucket(seaweed.endpoint_url, name, seaweed.admin)))
    assert left == [], "probe objects are deleted"


async def _keys(bucket) -> list[str]:
    async with bucket:
        return [o.key for o in await bucket.list("")]


def test_a_read_key_that_can_write_fails(subnet, seaweed, new_bucket, monkeypatch):
    name = new_bucket()
    monkeypatch.setenv(WRITE_KEY_ID_ENV, seaweed.admin.access_key_id)
    monkeypatch.setenv(WRITE_SECRET_ENV, seaweed.admin.secret_access_key)
    writer = seaweed.admin  # committed as if it were the read key
    locator = BucketLocator.s3(seaweed.endpoint_url, name, writer.access_key_id, writer.secret_access_key).encode()
    d = Doctor(bucket_flags(subnet, locator), "miner", timeout=10)
    result = run(d, bucket_checks.check_bucket_locator)
    assert result.status == Status.FAILED and "WRITE key" in result.summary  # the same pair: caught at once
    monkeypatch.delenv(WRITE_KEY_ID_ENV)
    monkeypatch.delenv(WRITE_SECRET_ENV)
    d = Doctor(bucket_flags(subnet, locator), "miner", timeout=10)
    d.locator = BucketLocator.parse(locator)  # what a node would commit, whatever its write key
    result = run(d, bucket_checks.check_bucket_read_only)
    assert result.status == Status.FAILED and "can WRITE" in result.summary and "read-only key" in result.fix


def test_a_read_key_peers_cannot_use_fails_the_peer_read(subnet, seaweed, new_bucket, monkeypatch):
    name = new_bucket()
    monkeypatch.setenv(WRITE_KEY_ID_ENV, seaweed.admin.access_key_id)
    monkeypatch.setenv(WRITE_SECRET_ENV, seaweed.admin.secret_access_key)
    revoked = BucketLocator.s3(seaweed.endpoint_url, name, "revokedreadkey", "revokedsecret1").encode()
    d = Doctor(bucket_flags(subnet, revoked), "miner", timeout=10)
    result = run(d, bucket_checks.check_bucket_locator, bucket_checks.check_bucket_write, bucket_checks.check_bucket_read)
    assert result.status == Status.FAILED and "read key was refused" in result.summary, result
    assert asyncio.run(_keys(S3Bucket(seaweed.endpoint_url, name, seaweed.admin))) == [], "the probe is deleted"


def test_a_validators_locator_and_role_as_the_doctor_sees_them(subnet, tmp_path):
    """A validator's commitment is its locator after the mark `v:` (docs/validating.md §1): a 127-byte locator
    fits a miner and a shadow (which commits nothing), not a validator; a locator committed as a miner's is
    the validator's at its start; a shadow on a hotkey whose commitment declares no validator is warned that
    validators score that hotkey as a miner and it cannot lead."""
    from templar.chain import connect

    long = tmp_path / ("b" * (127 - len("local:") - len(str(tmp_path)) - 1))
    long.mkdir()

    def check(role: str, locator: Path, *, shadow: bool = False):
        args = flags(subnet, "staked", "--bucket.locator", f"local:{locator}")
        args.shadow = shadow
        d = Doctor(args, role)
        return run(d, *identity(d), bucket_checks.check_bucket_locator)

    too_long = check("validator", long)
    assert too_long.status == Status.FAILED and "129 bytes" in too_long.summary and "1 characters shorter" in too_long.fix
    assert check("miner", long).status == Status.OK
    assert check("validator", long, shadow=True).status == Status.OK
    with connect(network="embedded", chain_endpoint=str(subnet / "chain.sqlite"), netuid=NETUID, wallet_name="staked",
                 wallet_path=subnet / "wallets") as chain:
        chain.commit_bucket(f"local:{tmp_path}")  # as a miner's
    live = check("validator", tmp_path)
    assert live.status == Status.OK and "committed on chain as a miner's; the node commits it as a validator's" in live.summary
    shadow = check("validator", tmp_path, shadow=True)
    assert shadow.status == Status.WARNING and "declares no validator" in shadow.summary, shadow


def test_bucket_configuration_failures(subnet, seaweed, new_bucket, monkeypatch):
    name = new_bucket()
    locator = seaweed.locator(name).encode()
    assert run(Doctor(flags(subnet, "miner"), "miner"), bucket_checks.check_bucket_locator).status == Status.FAILED
    no_key = run(Doctor(bucket_flags(subnet, locator), "miner"), bucket_checks.check_bucket_locator)
    assert no_key.status == Status.FAILED and "no write key" in no_key.summary
    monkeypatch.setenv(WRITE_KEY_ID_ENV, "wrongkeyid")
    monkeypatch.setenv(WRITE_SECRET_ENV, "wrongsecret123")
    d = Doctor(bucket_flags(subnet, locator), "miner", timeout=10)
    wrong = run(d, bucket_checks.check_bucket_locator, bucket_checks.check_bucket_write)
    assert wrong.status == Status.FAILED and "refused" in wrong.summary
    public = bucket_flags(subnet, locator)
    public.subtensor_network = "finney"
    private = run(Doctor(public, "miner"), bucket_checks.check_bucket_locator)
    assert private.status == Status.FAILED and "refuse" in private.summary
    key_file = subnet / "open-write-key.json"  # the write key in a file the umask left readable by all
    key_file.write_text(json.dumps({"access_key_id": "writer", "secret_access_key": "writesecret123"}))
    key_file.chmod(0o644)
    open_file = run(Doctor(bucket_flags(subnet, locator, "--bucket.credentials", str(key_file)), "miner"),
                    bucket_checks.check_bucket_locator)
    assert open_file.status == Status.FAILED and "mode 0644" in open_file.summary and "0600" in open_file.fix
    assert "writesecret123" not in open_file.summary + open_file.fix


@pytest.mark.slow(seconds=4, waits=True)
def test_a_stalled_bucket_fails_the_write_and_the_throughput(subnet, hanging, monkeypatch, tmp_path):
    monkeypatch.setenv(WRITE_KEY_ID_ENV, "stalledkey")
    monkeypatch.setenv(WRITE_SECRET_ENV, "stalledsecret")
    locator = BucketLocator.s3(hanging.url, "stalled", "readkey", "readsecret123").encode()
    d = Doctor(bucket_flags(subnet, locator), "miner", timeout=1.0)
    started = time.monotonic()
    write = run(d, bucket_checks.check_bucket_locator, bucket_checks.check_bucket_write)
    assert write.status == Status.FAILED and "no answer within" in write.summary
    fast = tmp_path / "fast.json"
    fast.write_text(json.dumps({"base": str(PRESETS_DIR / "tiny.json"), "windows": {"put_window_seconds": 1.0}}))
    d = Doctor(bucket_flags(subnet, locator, "--hparams", str(fast)), "miner", timeout=1.0)
    d.probe = ("templar-probe/x", b"x")  # as if the write check had passed before the bucket stalled
    throughput = run(d, chain_checks.check_hparams, bucket_checks.check_bucket_locator,
                     _open_bucket, bucket_checks.check_bucket_throughput)
    assert throughput.status == Status.FAILED and "did not go through" in throughput.summary
    assert time.monotonic() - started < 20


async def _open_bucket(d: Doctor):
    from templar.storage import open_bucket

    d.bucket = open_bucket(d.locator, d.credentials, own=True)
    return None


# -- data and the machine -----------------------------------------------------------------------


def test_manifest_pinned_wrong_and_unpublished(subnet, tmp_path):
    assert run(Doctor(flags(subnet, "miner"), "miner"), chain_checks.check_hparams,
               machine_checks.check_manifest).status == Status.OK
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"base": str(PRESETS_DIR / "tiny.json"), "data": {"manifest": "3" * 64}}))
    result = run(Doctor(flags(subnet, "miner", hparams=str(wrong)), "miner"), chain_checks.check_hparams,
                 machine_checks.check_manifest)
    assert result.status == Status.FAILED and "does not match the pinned" in result.summary
    unpublished = run(Doctor(flags(subnet, "miner", hparams=str(PRESETS_DIR.parent / "hparams.json")), "miner"),
                      chain_checks.check_hparams, machine_checks.check_manifest)
    assert unpublished.status == Status.FAILED and "not published yet" in unpublished.summary
    assert "nothing to fix on this machine" in unpublished.fix and "docs/launch.md §11" in unpublished.fix
    assert "## 11. Publishing the production corpus" in (REPO_ROOT / "docs" / "launch.md").read_text()


def test_manifest_warns_of_a_corpus_too_small_for_disjoint_assignments(subnet, tmp_path, assets_dir):
    from templar.cli import main

    (tmp_path / "src").mkdir()
    with open(assets_dir / "corpus" / "wiki.jsonl", encoding="utf-8") as f:
        (tmp_path / "src" / "a.jsonl").write_text("".join(line for _, line in zip(range(40), f, strict=False)))
    assert main(["data", "prepare", str(tmp_path / "src"), "--tokenizer", str(assets_dir / "tokenizer"),
                 "--hparams", "tiny", "--out", str(tmp_path / "corpus"), "--no-progress"]) == 0
    assert main(["data", "pin", str(tmp_path / "corpus"), "--hparams", str(tmp_path / "run.json"),
                 "--base", "tiny"]) == 0
    small = run(Doctor(flags(subnet, "miner", hparams=str(tmp_path / "run.json")), "miner"),
                chain_checks.check_hparams, machine_checks.check_manifest)
    assert small.status == Status.WARNING and "fewer than the 522 pages" in small.summary, small


def test_gpu_memory_and_disks(subnet, monkeypatch):
    tiny = run(Doctor(flags(subnet, "miner", "--device", "cpu"), "miner"), chain_checks.check_hparams,
               machine_checks.check_gpu)
    assert tiny.status == Status.OK and "CPU" in tiny.summary
    big = run(Doctor(flags(subnet, "miner", "--device", "cpu", hparams=str(PRESETS_DIR.parent / "hparams.json")),
                     "miner"), chain_checks.check_hparams, machine_checks.check_gpu)
    assert big.status == Status.FAILED and "no GPU on this machine" in big.summary
    assert "GPU of at least" in big.fix and "--device cuda" not in big.fix  # this machine has no GPU to name
    # a 1 GB cache: the default (DEFAULT_CACHE_GB) exceeds the free disk of a crowded test machine, a warning there
    for check in (machine_checks.check_cache_space, machine_checks.check_state_disk, machine_checks.check_host_memory):
        assert run(Doctor(flags(subnet, "miner", "--data.cache_gb", "1"), "miner"), chain_checks.check_hparams,
                   check).status == Status.OK
    huge = run(Doctor(flags(subnet, "miner", "--data.cache_gb", "1000000"), "miner"), chain_checks.check_hparams,
               machine_checks.check_cache_space)
    assert huge.status == Status.WARNING and "--data.cache_gb" in huge.fix
    # a full disk and a busy host are edge cases no test machine has: the two readings are replaced
    monkeypatch.setattr(machine_checks.shutil, "disk_usage", lambda path: type("U", (), {"free": 10_000})())
    assert run(Doctor(flags(subnet, "miner"), "miner"), chain_checks.check_hparams,
               machine_checks.check_state_disk).status == Status.FAILED
    monkeypatch.setattr(machine_checks, "_meminfo", lambda: {"MemAvailable": 1e8, "MemTotal": 2e9})
    assert run(Doctor(flags(subnet, "miner"), "miner"), chain_checks.check_hparams,
               machine_checks.check_host_memory).status == Status.WARNING
    resource = pytest.importorskip("resource", reason="open-file limits are POSIX")
    assert run(Doctor(flags(subnet, "lead"), "validator"), machine_checks.check_open_files).status == Status.OK
    monkeypatch.setattr(resource, "getrlimit", lambda which: (1024, 2048))  # a hard limit a validator outgrows
    low = run(Doctor(flags(subnet, "lead"), "validator"), machine_checks.check_open_files)
    assert low.status == Status.WARNING and "2,048 files" in low.summary and "LimitNOFILE" in low.fix
    assert run(Doctor(flags(subnet, "miner"), "miner"), machine_checks.check_open_files).status == Status.OK


def production_doctor(role: str, *memory_flags: str) -> Doctor:
    """A doctor for the production run with a miner's memory flags, its hparams checked (no chain)."""
    parser = argparse.ArgumentParser()
    add_node_args(parser)
    add_memory_args(parser)
    d = Doctor(parser.parse_args(["--hparams", str(PRESETS_DIR.parent / "hparams.json"), *memory_flags]), role)
    assert asyncio.run(chain_checks.check_hparams(d)).status == Status.OK
    return d


@pytest.mark.parametrize("card_gb,flags", [(80, ""), (40, "--memory.offload"),
                                           (24, "--memory.offload --memory.checkpoint_activations")])
def test_the_gpu_check_names_the_memory_setting_that_fits(card_gb, flags):
    """The GPU check reads the same memory table as `templar hparams`: with no flag, a GPU too small
    for the default is told which flags fit it; with those flags, it passes (or warns on time)."""
    total = card_gb * GIB
    plain = machine_checks.gpu_verdict(production_doctor("miner"), f"GPU {card_gb}GB", total, total)
    if not flags:
        assert plain.status == Status.OK and "(default)" in plain.summary
        return
    assert plain.status == Status.FAILED and "does not fit" in plain.summary
    assert plain.fix.startswith(f"add {flags} (") and plain.data["recommended"] == flags.split()
    fixed = machine_checks.gpu_verdict(production_doctor("miner", *flags.split()), f"GPU {card_gb}GB", total, total)
    assert fixed.status == Status.OK, fixed


def test_the_gpu_check_on_small_slow_or_busy_gpus_and_without_one():
    eight = 8 * GIB
    small = machine_checks.gpu_verdict(production_doctor("miner"), "GPU 8GB", eight, eight)
    assert small.status == Status.FAILED and "no memory setting fits" in small.summary
    ranks = small.data["torchrun_ranks"]
    assert f"torchrun over {ranks} such GPUs and --memory.offload --memory.checkpoint_activations" in small.fix
    # an H100 holds the model with the offload, but the transfers make its window late: drop the flag
    h100 = machine_checks.gpu_verdict(production_doctor("miner", "--memory.offload"), "NVIDIA H100 80GB HBM3",
                                      80 * GIB, 80 * GIB)
    assert h100.status == Status.WARNING and "miss their commitment deadline" in h100.summary
    assert "drop the memory flags: the default setting fits this GPU" in h100.fix
    # an A100's compute cannot train the window in time whatever fits its memory
    a100 = machine_checks.gpu_verdict(production_doctor("miner", "--memory.offload"), "NVIDIA A100-SXM4-40GB",
                                      40 * GIB, 40 * GIB)
    assert a100.status == Status.WARNING and "a faster GPU, or torchrun" in a100.fix
    busy = machine_checks.gpu_verdict(production_doctor("validator"), "GPU 24GB", 24 * GIB, 4 * GIB)
    assert busy.status == Status.WARNING and "other processes" in busy.summary
    cpu = machine_checks.cpu_verdict(production_doctor("miner"), "auto", gpu_present=False)
    assert cpu.status == Status.FAILED and "--device" not in cpu.fix and "GPU of at least" in cpu.fix
    wasted = machine_checks.cpu_verdict(production_doctor("miner"), "cpu", gpu_present=True)
    assert wasted.status == Status.FAILED and "drop --device" in wasted.fix


def test_the_whole_doctor_and_its_exit_code(subnet, capsys):
    from templar.cli import main

    lead_bucket = subnet / "buckets" / "lead-cli"
    argv = ["doctor", "--role", "validator", "--wallet.name", "lead", "--wallet.path", str(subnet / "wallets"),
            "--netuid", str(NETUID), "--subtensor.network", "embedded", "--subtensor.chain_endpoint",
            str(subnet / "chain.sqlite"), "--hparams", "tiny", "--state.dir", str(subnet / "state" / "cli"),
            "--bucket.locator", f"local:{lead_bucket}", "--device", "cpu", "--json"]
    code = main(argv)
    report = json.loads(capsys.readouterr().out)
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert code == 0 and report["ok"], statuses
    assert set(statuses) == {"hparams", "wallet", "chain", "registration", "weights-settings", "lead-run",
                             "bucket-locator", "bucket-write", "bucket-read", "bucket-read-only",
                             "bucket-throughput", "manifest", "cache-space", "gpu", "host-memory", "state-disk",
                             "open-files"}
    # the validator's own flags, as the docs say: the node's command line works unchanged (a shadow commits nothing)
    assert main([*argv, "--shadow", "--record-evaluations"]) == 0
    shadow = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert "--shadow: the node never commits it" in shadow["bucket-locator"]["summary"], shadow["bucket-locator"]
    assert main([*argv[:4], "stranger", *argv[5:-1]]) == 1
    text = capsys.readouterr().out
    assert "failed   registration" in text and "fix: templar chain register" in text
    assert asyncio.run(run_checks(Doctor(flags(subnet, "miner"), "miner"), ())) == []
