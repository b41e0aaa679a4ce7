"""The `Chain` adapter over the real bittensor SDK, against an embedded chain on a manual clock."""

from __future__ import annotations

import os

import pytest

from templar.chain import (
    VALIDATOR_MARK,
    ChainError,
    Commitment,
    DevChain,
    Neuron,
    NotRegistered,
    RateLimited,
    connect,
    is_miner,
    verify_signature,
)
from templar.chain.embedded import ChainStore
from templar.chain.embedded.store import commitment_record
from templar.chain.types import CommitRevealPending, InsufficientStake, PoolRejected, StaleMetagraph


def test_metagraph_lists_every_neuron_with_stake_and_permits(dev_chain: DevChain, open_chains: dict) -> None:
    neurons = open_chains["miner1"].metagraph()
    assert [n.uid for n in neurons] == [0, 1, 2, 3, 4]
    by_name = {name: neurons[w.uid] for name, w in dev_chain.wallets.items()}
    assert all(isinstance(n, Neuron) for n in neurons)
    assert by_name["val1"].hotkey == dev_chain.wallets["val1"].hotkey
    assert by_name["val1"].coldkey == dev_chain.wallets["val1"].coldkey
    assert by_name["val1"].stake == pytest.approx(100.0)
    assert by_name["val2"].stake == pytest.approx(40.0)
    assert [by_name[n].validator_permit for n in ("val1", "val2", "miner1", "miner2")] == [
        True,
        True,
        False,
        False,
    ]
    assert neurons[0].hotkey == dev_chain.owner.hotkey  # the subnet owner's hotkey holds uid 0
    assert all(n.commitment is None and n.last_update == 0 for n in neurons)


def test_my_uid_and_require_registered(dev_chain: DevChain, open_chains: dict) -> None:
    chain = open_chains["miner2"]
    assert chain.my_uid() == dev_chain.wallets["miner2"].uid
    assert chain.require_registered() == dev_chain.wallets["miner2"].uid
    assert chain.hotkey == dev_chain.wallets["miner2"].hotkey


def test_unregistered_hotkey_raises_not_registered_naming_wallet_hotkey_netuid(
    dev_chain: DevChain, clock
) -> None:
    with connect(
        network="embedded",
        chain_endpoint=str(dev_chain.path),
        netuid=dev_chain.netuid,
        wallet_name="stranger",
        wallet_hotkey="hk",
        wallet_path=dev_chain.wallet_path,
        now=clock,
    ) as chain:
        assert chain.my_uid() is None
        with pytest.raises(NotRegistered) as info:
            chain.require_registered()
        message = str(info.value)
        assert "'stranger'" in message and "'hk'" in message and chain.hotkey in message
        assert f"netuid {dev_chain.netuid}" in message
        with pytest.raises(NotRegistered):
            chain.set_weights({1: 1.0})
        with pytest.raises(NotRegistered):
            chain.commit_bucket("local:/tmp/bucket")


def test_commit_and_read_bucket_locators(dev_chain: DevChain, open_chains: dict) -> None:
    longest = "s3:http://127.0.0.1:9000|bucket-one|READKEY|" + "s" * (128 - 44)
    assert len(longest) == 128
    open_chains["miner1"].commit_bucket("local:/tmp/miner1")
    open_chains["val1"].commit_bucket(longest)
    locators = open_chains["miner2"].bucket_locators()
    assert locators == {
        dev_chain.wallets["miner1"].hotkey: "local:/tmp/miner1",
        dev_chain.wallets["val1"].hotkey: longest,
    }
    neurons = open_chains["miner2"].metagraph()
    assert neurons[dev_chain.wallets["miner1"].uid].commitment == "local:/tmp/miner1"
    assert neurons[dev_chain.wallets["miner2"].uid].commitment is None
    open_chains["miner1"].commit_bucket("local:/tmp/moved")  # a new commitment replaces the old one
    assert open_chains["val2"].bucket_locators()[dev_chain.wallets["miner1"].hotkey] == "local:/tmp/moved"


def test_a_hotkey_declares_itself_a_validator_and_a_strangers_stake_does_not_make_a_miner_one(
        dev_chain: DevChain, open_chains: dict) -> None:
    """The role is the hotkey's own commitment (`VALIDATOR_MARK`): a validator's reads back as its locator and
    its role; a miner that a stranger stakes into a validator permit is still a miner and never leads (the
    rule of "a permit and stake" stopped scoring it, and on a dTAO subnet a miner's own pay is such stake)."""
    val2, miner1 = dev_chain.wallets["val2"], dev_chain.wallets["miner1"]
    open_chains["val2"].commit_bucket("local:/tmp/val2", validator=True)
    open_chains["miner1"].commit_bucket("local:/tmp/miner1")
    with ChainStore(dev_chain.path) as store, store.read() as conn:  # what the chain holds: the mark, then the locator
        raw = commitment_record(conn, dev_chain.netuid, val2.hotkey)["info"]["fields"]
    assert raw == [{"Raw17": "0x" + f"{VALIDATOR_MARK}local:/tmp/val2".encode().hex()}]
    assert open_chains["miner2"].bucket_locators() == {val2.hotkey: "local:/tmp/val2", miner1.hotkey: "local:/tmp/miner1"}
    assert open_chains["miner2"].commitments()[val2.hotkey] == Commitment("local:/tmp/val2", validates=True)
    dev_chain.fund("val1", 1000.0)
    open_chains["val1"].add_stake(500.0, miner1.hotkey)  # val1's coldkey stakes onto miner1: a stranger's stake
    neurons = {n.uid: n for n in open_chains["miner2"].metagraph()}
    assert neurons[val2.uid].validates and not is_miner(neurons[val2.uid])
    staked = neurons[miner1.uid]
    assert staked.validator_permit and staked.stake == pytest.approx(500.0)
    assert not staked.validates and is_miner(staked)
    assert [n.uid for n in open_chains["miner2"].succession()] == [val2.uid]
    with pytest.raises(ValueError):  # the mark takes 2 of the chain's 128 bytes
        open_chains["val1"].commit_bucket("local:/" + "x" * 121, validator=True)
    with pytest.raises(ValueError):  # no locator begins with the mark: a miner cannot commit one that reads as a validator's
        open_chains["miner1"].commit_bucket(f"{VALIDATOR_MARK}local:/tmp/x")
    assert Commitment.read("v:") is None and Commitment.read("v:local:/x") == Commitment("local:/x", True)
    assert Commitment.read("local:/x") == Commitment("local:/x", False) and Commitment.read(b"v:local:/x") is None


@pytest.mark.parametrize("bad", ["x" * 129, "", "tab\there", "caf\u00e9:/x", "line\nbreak"])
def test_commit_refuses_oversize_or_unprintable_locators(open_chains: dict, bad: str) -> None:
    with pytest.raises(ValueError):
        open_chains["miner1"].commit_bucket(bad)
    assert open_chains["miner1"].bucket_locators() == {}


def test_set_weights_and_read_back(dev_chain: DevChain, open_chains: dict, go_to_block) -> None:
    go_to_block(50)
    m1, m2 = dev_chain.wallets["miner1"].uid, dev_chain.wallets["miner2"].uid
    open_chains["val1"].set_weights({m1: 1.0, m2: 3.0})
    weights = open_chains["miner1"].current_weights()
    val1 = dev_chain.wallets["val1"].uid
    assert set(weights) == {val1}
    assert weights[val1][m1] == pytest.approx(0.25, abs=1e-4)
    assert weights[val1][m2] == pytest.approx(0.75, abs=1e-4)
    assert open_chains["miner1"].metagraph()[val1].last_update == 50


def test_rate_limit_raises_with_blocks_to_wait_then_clears(
    dev_chain: DevChain, open_chains: dict, go_to_block, rate_limit: int
) -> None:
    chain, miner = open_chains["val2"], dev_chain.wallets["miner1"].uid
    go_to_block(100)
    chain.set_weights({miner: 1.0})
    with pytest.raises(RateLimited) as info:
        chain.set_weights({miner: 1.0})
    assert info.value.blocks_to_wait == rate_limit
    assert f"rate limit is {rate_limit} blocks" in str(info.value)
    go_to_block(100 + rate_limit - 3)
    with pytest.raises(RateLimited) as info:
        chain.set_weights({miner: 2.0})
    assert info.value.blocks_to_wait == 3
    go_to_block(100 + rate_limit)
    chain.set_weights({miner: 2.0})
    assert chain.metagraph()[dev_chain.wallets["val2"].uid].last_update == 100 + rate_limit


def test_miner_without_permit_cannot_weight_others(
    dev_chain: DevChain, open_chains: dict, go_to_block
) -> None:
    go_to_block(10)
    with pytest.raises(ChainError) as info:
        open_chains["miner1"].set_weights({dev_chain.wallets["miner2"].uid: 1.0})
    assert "NeuronNoValidatorPermit" in str(info.value)
    assert not isinstance(info.value, RateLimited | NotRegistered)


@pytest.mark.parametrize(("error", "stage", "expected", "reason"), [
    ("PriorityTooLow", "pool", PoolRejected, "priority_too_low"),
    ("Stale", "pool", PoolRejected, "priority_too_low"),
    ("RateLimitExceeded", "pool", RateLimited, "rate_limited"),
    ("StakeAmountTooLow", "pool", InsufficientStake, "stake"),
    ("SettingWeightsTooFast", "dispatch", RateLimited, "rate_limited"),
    ("NotEnoughStakeToSetWeights", "dispatch", InsufficientStake, "stake"),
    ("CommittingWeightsTooFast", "dispatch", CommitRevealPending, "commit_reveal"),
    ("TooManyUnrevealedCommits", "dispatch", CommitRevealPending, "commit_reveal"),
    ("CommitRevealEnabled", "dispatch", CommitRevealPending, "commit_reveal"),
    ("UidVecContainInvalidOne", "dispatch", StaleMetagraph, "stale_metagraph"),
])
def test_each_weights_refusal_arrives_typed(dev_chain: DevChain, open_chains: dict, go_to_block, error, stage,
                                            expected, reason) -> None:
    """A refusal injected into the chain file reaches us as a node would send it (the SDK resolves
    the node's text or the dispatch error's name) and leaves the adapter as one typed exception.
    "Priority is too low" is a pool rejection, not the rate limit the SDK's code calls it."""
    go_to_block(30)
    with ChainStore(dev_chain.path) as store:
        store.inject_fault("set_mechanism_weights", error, stage=stage, times=3)  # the SDK resubmits pool errors twice
    with pytest.raises(expected) as info:
        open_chains["val1"].set_weights({dev_chain.wallets["miner1"].uid: 1.0})
    assert info.value.reason == reason
    assert type(info.value) is expected  # not the rate limit by accident
    assert open_chains["val1"].metagraph()[dev_chain.wallets["val1"].uid].last_update == 0, "nothing landed"


def test_injected_faults_are_used_up_and_name_their_call(dev_chain: DevChain, open_chains: dict, go_to_block) -> None:
    go_to_block(30)
    with ChainStore(dev_chain.path) as store:
        store.inject_fault("set_mechanism_weights", "NotEnoughStakeToSetWeights", signer=dev_chain.wallets["val2"].hotkey)
        with pytest.raises(ValueError):
            store.inject_fault("set_mechanism_weights", "X", stage="mempool")
    miner = dev_chain.wallets["miner1"].uid
    open_chains["val1"].set_weights({miner: 1.0})  # another signer: untouched
    with pytest.raises(InsufficientStake):
        open_chains["val2"].set_weights({miner: 1.0})
    go_to_block(30 + 1)
    open_chains["val2"].set_weights({miner: 1.0})  # used up


def test_weights_settings_and_head(dev_chain: DevChain, open_chains: dict, go_to_block, rate_limit: int) -> None:
    go_to_block(42)
    settings = open_chains["val1"].weights_settings()
    assert settings.rate_limit == rate_limit and settings.commit_reveal is False
    assert settings.min_allowed_weights == 1 and settings.max_weight_fraction == 1.0
    block, stamp = open_chains["val1"].head()
    assert block == 42 and stamp == open_chains["val1"].block_timestamp(42)
    with ChainStore(dev_chain.path) as store:
        store.set_subnet_params(dev_chain.netuid, commit_reveal=1, weights_rate_limit=100)
    settings = open_chains["val1"].weights_settings()
    assert settings.commit_reveal is True and settings.rate_limit == 100


@pytest.mark.parametrize("weights", [{}, {1: 0.0}, {1: float("nan")}, {1: -1.0}, {-1: 1.0}])
def test_set_weights_rejects_malformed_input(open_chains: dict, weights: dict) -> None:
    with pytest.raises(ValueError):
        open_chains["val1"].set_weights(weights)


def test_lead_validator_is_highest_stake_then_lowest_uid(dev_chain: DevChain, open_chains: dict) -> None:
    """The succession order (`succession_of`): validators with a permit, stake and a bucket committed as a
    validator's, most stake first, the lower uid on ties; the lead is its first."""
    assert open_chains["miner1"].lead_validator() is None  # no validator has committed a bucket yet
    open_chains["val2"].commit_bucket("local:/tmp/val2", validator=True)
    assert open_chains["miner1"].lead_validator().uid == dev_chain.wallets["val2"].uid
    open_chains["val1"].commit_bucket("local:/tmp/val1")  # a permit and the most stake, but a miner's commitment
    assert open_chains["miner1"].lead_validator().uid == dev_chain.wallets["val2"].uid
    open_chains["val1"].commit_bucket("local:/tmp/val1", validator=True)
    lead = open_chains["miner1"].lead_validator()
    assert lead is not None and lead.uid == dev_chain.wallets["val1"].uid
    assert [n.uid for n in open_chains["miner1"].succession()] == [dev_chain.wallets[v].uid for v in ("val1", "val2")]
    # Bring val2 level with val1: equal stake, so the lower uid (val1) still leads.
    dev_chain.fund("val2", 61.0)
    open_chains["val2"].add_stake(60.0)
    neurons = open_chains["miner1"].metagraph()
    assert neurons[dev_chain.wallets["val2"].uid].stake == pytest.approx(100.0)
    assert open_chains["miner1"].lead_validator().uid == dev_chain.wallets["val1"].uid
    open_chains["val2"].add_stake(0.5)
    assert open_chains["miner1"].lead_validator().uid == dev_chain.wallets["val2"].uid


def test_no_lead_validator_without_staked_permits(tmp_path, clock) -> None:
    from templar.chain import create_dev_chain

    dev = create_dev_chain(
        tmp_path / "c.sqlite",
        netuid=5,
        hotkeys={"m": 0.0},
        wallet_path=tmp_path / "w",
        block_time=0.1,
        now=clock,
    )
    with dev.connect("m", now=clock) as chain:
        assert chain.lead_validator() is None


def test_sign_and_verify_signature(dev_chain: DevChain, open_chains: dict) -> None:
    chain = open_chains["val1"]
    message = b"templar window 42"
    signature = chain.sign(message)
    assert len(signature) == 64
    assert verify_signature(chain.hotkey, message, signature)
    assert chain.verify_signature(chain.hotkey, message, signature)
    assert not verify_signature(chain.hotkey, b"templar window 43", signature)
    assert not verify_signature(dev_chain.wallets["val2"].hotkey, message, signature)
    flipped = bytes([signature[0] ^ 1]) + signature[1:]
    assert not verify_signature(chain.hotkey, message, flipped)


@pytest.mark.parametrize(
    "hotkey, message, signature",
    [
        ("not-an-address", b"m", bytes(64)),
        ("", b"m", bytes(64)),
        ("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQZ", b"m", bytes(64)),  # bad checksum
        ("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY", b"m", b""),
        ("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY", b"m", b"\x00" * 63),
        ("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY", b"m", os.urandom(64)),
        ("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY", "text", bytes(64)),
        (None, b"m", bytes(64)),
        ("5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY", b"m", None),
    ],
    ids=["bad-address", "empty-address", "bad-checksum", "empty-signature", "short-signature", "random-signature",
         "str-message", "no-address", "no-signature"],
)
def test_verify_signature_is_false_on_garbage(hotkey, message, signature) -> None:
    assert verify_signature(hotkey, message, signature) is False


def test_block_clock_is_exact_past_and_future(
    dev_chain: DevChain, open_chains: dict, clock, go_to_block
) -> None:
    chain = open_chains["miner1"]
    assert chain.block_time == pytest.approx(0.1)
    go_to_block(7)
    assert chain.block() == 7
    genesis = chain.block_timestamp(1)
    assert chain.block_timestamp(7) == pytest.approx(genesis + 0.6)
    assert chain.block_timestamp(10_007) == pytest.approx(genesis + 1000.6)
    clock.advance(0.1)
    assert chain.block() == 8


def test_read_only_chain_reads_but_refuses_to_act(dev_chain: DevChain, clock) -> None:
    with connect(
        network="embedded",
        chain_endpoint=str(dev_chain.path),
        netuid=dev_chain.netuid,
        wallet_name=None,
        now=clock,
    ) as chain:
        assert len(chain.metagraph()) == 5
        with pytest.raises(ChainError, match="read-only"):
            _ = chain.hotkey
        with pytest.raises(ChainError, match="read-only"):
            chain.sign(b"x")


def test_missing_subnet_and_missing_chain_file_are_clear_errors(dev_chain: DevChain, tmp_path, clock) -> None:
    with (
        connect(
            network="embedded", chain_endpoint=str(dev_chain.path), netuid=99, wallet_name=None, now=clock
        ) as chain,
        pytest.raises(ChainError, match="subnet 99 does not exist"),
    ):
        chain.metagraph()
    with pytest.raises(ChainError, match="templar chain init"):
        connect(network="embedded", chain_endpoint=str(tmp_path / "nope.sqlite"), netuid=3, wallet_name=None)


def test_a_file_that_is_not_a_chain_is_reported(tmp_path) -> None:
    bogus = tmp_path / "bogus.sqlite"
    bogus.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ChainError, match="not a usable embedded chain"):
        connect(network="embedded", chain_endpoint=str(bogus), netuid=3, wallet_name=None)


def test_one_chain_is_safe_to_share_between_threads(dev_chain: DevChain, open_chains: dict) -> None:
    from concurrent.futures import ThreadPoolExecutor

    chain = open_chains["miner1"]

    def work(i: int) -> tuple[int, int | None]:
        if i % 4 == 0:
            chain.commit_bucket(f"local:/tmp/thread-{i}")
        return len(chain.metagraph()), chain.my_uid()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, range(32)))
    assert set(results) == {(5, dev_chain.wallets["miner1"].uid)}
    assert chain.bucket_locators()[chain.hotkey].startswith("local:/tmp/thread-")


def test_yuma_epoch_results_reach_the_metagraph(dev_chain: DevChain, open_chains: dict, go_to_block) -> None:
    """Two validators, stake 100 / 40 (S = 5/7, 2/7), weigh two miners (1, 3) and (3, 1); tempo 9.

    Subnet 3's epochs fall on blocks b with (b + 3 + 1) % 10 == 0: 56 is the first after the
    weights are set at block 50. By hand (κ = 0.5): consensus (1/4, 3/4); val2's clipped row is
    (1/4, 1/4), so ranks are (1/4, 5/7·3/4 + 2/7·1/4 = 17/28) and incentive (7/24, 17/24);
    vtrust (1, 1/2); trust of miner1 = (1/4) / (5/7·1/4 + 2/7·3/4 = 11/28) = 7/11, miner2 1.
    Bonds are the stake-weighted clipped weights per column: (5/7, 2/7) and (15/17, 2/17), so
    dividends are (5/7·7/24 + 15/17·17/24, 2/7·7/24 + 2/17·17/24) = (5/6, 1/6). Emission:
    10 blocks × 1 α; miners and validators get 41 % each.
    """
    with ChainStore(dev_chain.path) as store:
        store.set_subnet_params(dev_chain.netuid, tempo=9)
    w = dev_chain.wallets
    m1, m2, v1, v2 = w["miner1"].uid, w["miner2"].uid, w["val1"].uid, w["val2"].uid
    go_to_block(50)
    open_chains["val1"].set_weights({m1: 1.0, m2: 3.0})
    open_chains["val2"].set_weights({m1: 3.0, m2: 1.0})
    go_to_block(55)
    assert all(n.incentive == 0 for n in open_chains["miner1"].metagraph())  # no epoch since the weights
    go_to_block(57)
    neurons = open_chains["miner1"].metagraph()
    approx = lambda x: pytest.approx(x, abs=2e-4)  # noqa: E731  (u16 fractions)
    assert [neurons[m1].incentive, neurons[m2].incentive] == approx([7 / 24, 17 / 24])
    assert [neurons[m1].consensus, neurons[m2].consensus] == approx([1 / 4, 3 / 4])
    assert [neurons[m1].trust, neurons[m2].trust] == approx([7 / 11, 1.0])
    assert [neurons[v1].validator_trust, neurons[v2].validator_trust] == approx([1.0, 0.5])
    assert [neurons[v1].dividends, neurons[v2].dividends] == approx([5 / 6, 1 / 6])
    assert neurons[m2].emission == pytest.approx(10 * 0.41 * 17 / 24, abs=1e-6)
    assert neurons[v1].emission == pytest.approx(10 * 0.41 * 5 / 6, abs=1e-6)


def test_validator_trust_is_display_data_never_a_failure() -> None:
    """Malformed or missing vtrust vectors read as zeros, padded or cut to the neuron count."""
    from templar.chain.client import _u16_fractions

    assert _u16_fractions([65535, 0, 32768], 2) == pytest.approx([1.0, 0.0])
    assert _u16_fractions([65535], 3) == pytest.approx([1.0, 0.0, 0.0])
    assert _u16_fractions(None, 2) == [0.0, 0.0]
    assert _u16_fractions([70000, 1], 2) == [0.0, 0.0]
    assert _u16_fractions("0x00", 1) == [0.0]


def test_dev_keys_from_a_seed_are_reproducible_and_differ_by_seed(tmp_path, clock) -> None:
    """A localnet's `--seed` fixes its hotkeys (evaluation draws are keyed hashes of hotkeys)."""
    from templar.chain import create_dev_chain

    def hotkeys(run: str, seed: bytes | None) -> dict[str, str]:
        dev = create_dev_chain(tmp_path / run / "c.sqlite", netuid=5, hotkeys={"a": 0.0, "b": 1.0},
                               wallet_path=tmp_path / run / "w", block_time=0.1, now=clock, key_seed=seed)
        return {name: w.hotkey for name, w in dev.wallets.items()}

    first, again, other = hotkeys("1", b"seed-1"), hotkeys("2", b"seed-1"), hotkeys("3", b"seed-2")
    assert first == again
    assert first["a"] != first["b"]
    assert set(first.values()).isdisjoint(other.values())
    assert set(first.values()).isdisjoint(hotkeys("4", None).values())  # no seed: the OS's randomness
