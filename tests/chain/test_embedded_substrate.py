"""Chain-side rules of the embedded substrate, exercised with raw SDK calls that skip the adapter
(and, for `submit_call`, the SDK's own intent preflights), as a buggy or hostile client would."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import bittensor as bt
import pytest

from templar.chain import DevChain, load_wallet
from templar.chain.client import EMBEDDED_LABEL
from templar.chain.embedded import EmbeddedSubstrate


@pytest.fixture
def sub(dev_chain: DevChain, clock) -> Iterator[bt.Subtensor]:
    """A blocking SDK client on the embedded chain, exactly as `bt.Subtensor` is used elsewhere."""
    client = bt.Subtensor(EMBEDDED_LABEL, substrate=EmbeddedSubstrate(dev_chain.path, now=clock))
    yield client
    client.close()


def _wallet(dev_chain: DevChain, name: str) -> bt.Wallet:
    return load_wallet(name, "default", dev_chain.wallet_path)


def _commit(sub: bt.Subtensor, wallet, netuid: int, fields: list) -> bt.ExtrinsicResult:
    call = bt.calls.Commitments.set_commitment(netuid=netuid, info={"fields": [fields]})
    return sub.submit_call(call, wallet, signer="hotkey")


def test_chain_stores_128_raw_bytes_and_refuses_129(dev_chain: DevChain, sub: bt.Subtensor) -> None:
    miner = _wallet(dev_chain, "miner1")
    accepted = _commit(sub, miner, dev_chain.netuid, [{"Raw128": b"a" * 128}])
    assert accepted.success, accepted.message
    refused = _commit(sub, miner, dev_chain.netuid, [{"Raw129": b"b" * 129}])
    assert not refused.success
    assert "at most 128 bytes" in refused.message
    stored = sub.identity.commitment(netuid=dev_chain.netuid, hotkey_ss58=miner.hotkey.ss58_address)
    assert stored.data == "a" * 128  # the refused call changed nothing


def test_chain_refuses_malformed_commitments(dev_chain: DevChain, sub: bt.Subtensor) -> None:
    miner, netuid = _wallet(dev_chain, "miner1"), dev_chain.netuid
    too_many = _commit(sub, miner, netuid, [{"Raw1": b"a"}] * 4)
    assert too_many.error.name == "TooManyFieldsInCommitmentInfo"
    mismatch = _commit(sub, miner, netuid, [{"Raw5": b"abc"}])
    assert "exactly 5 bytes" in mismatch.message
    sealed = _commit(sub, miner, netuid, [{"TimelockEncrypted": {"encrypted": b"x", "reveal_round": 1}}])
    assert "only Raw commitment fields" in sealed.message
    outsider = load_wallet("outsider", "default", dev_chain.wallet_path, create=True)
    refused = _commit(sub, outsider, netuid, [{"Raw2": b"hi"}])
    assert refused.error.name == "AccountNotAllowedCommit"
    assert sub.subnets.commitments(netuid) == {}


def test_chain_enforces_the_weights_rate_limit_without_sdk_preflight(
    dev_chain: DevChain, sub: bt.Subtensor, go_to_block, rate_limit: int
) -> None:
    validator, netuid = _wallet(dev_chain, "val1"), dev_chain.netuid
    call = bt.calls.SubtensorModule.set_mechanism_weights(
        netuid=netuid, mecid=0, dests=[3, 4], weights=[100, 300], version_key=0
    )
    go_to_block(200)
    first = sub.submit_call(call, validator, signer="hotkey")
    assert first.success, first.message
    second = sub.submit_call(call, validator, signer="hotkey")
    assert not second.success
    assert second.error.name == "SettingWeightsTooFast"
    assert second.error.code == bt.ErrorCode.RATE_LIMITED
    assert f"Retry in ~{rate_limit} blocks" in second.message
    # Stored max-upscaled, as the pallet does: 300 -> 65535, 100 -> 21845.
    assert sub.query(bt.storage.SubtensorModule.Weights, [netuid, 1]) == [[3, 21845], [4, 65535]]


def test_chain_checks_weight_vectors(dev_chain: DevChain, sub: bt.Subtensor, go_to_block) -> None:
    validator, netuid = _wallet(dev_chain, "val1"), dev_chain.netuid
    go_to_block(300)

    def attempt(dests: list[int], weights: list[int]) -> str | None:
        call = bt.calls.SubtensorModule.set_mechanism_weights(
            netuid=netuid, mecid=0, dests=dests, weights=weights, version_key=0
        )
        result = sub.submit_call(call, validator, signer="hotkey")
        return None if result.success else result.error.name

    assert attempt([3, 3], [1, 1]) == "DuplicateUids"
    assert attempt([3, 99], [1, 1]) == "UidVecContainInvalidOne"
    assert attempt([3], [1, 2]) == "WeightVecNotEqualSize"
    assert attempt([3, 4], [1, 2]) is None


def test_registration_goes_through_the_mev_shield_carrier(dev_chain: DevChain, sub: bt.Subtensor) -> None:
    with sqlite3.connect(dev_chain.path) as conn:
        rows = conn.execute(
            "SELECT block, idx, module, function, success, signer FROM extrinsics "
            "WHERE module = 'MevShield' OR function = 'burned_register' ORDER BY block, idx"
        ).fetchall()
    carriers = [r for r in rows if r[2] == "MevShield"]
    inners = [r for r in rows if r[3] == "burned_register"]
    assert len(carriers) == len(inners) == len(dev_chain.wallets)
    for carrier, inner in zip(carriers, inners, strict=True):
        assert carrier[0] == inner[0] and inner[1] == carrier[1] + 1  # decrypted into the carrier's block
        assert carrier[4] == inner[4] == 1 and carrier[5] == inner[5]
    again = sub.execute(bt.BurnedRegister(netuid=dev_chain.netuid), _wallet(dev_chain, "miner1"))
    assert not again.success
    assert again.error.name == "HotKeyAlreadyRegisteredInSubNet"


def test_unknown_calls_and_storage_fail_loudly(dev_chain: DevChain, sub: bt.Subtensor) -> None:
    miner = _wallet(dev_chain, "miner1")
    axon = sub.submit_call(
        bt.calls.SubtensorModule.serve_axon(
            netuid=dev_chain.netuid,
            version=1,
            ip=2130706433,
            port=8091,
            ip_type=4,
            protocol=4,
            placeholder1=0,
            placeholder2=0,
        ),
        miner,
        signer="hotkey",
    )
    assert not axon.success
    assert "does not implement SubtensorModule.serve_axon" in axon.message
    stray = sub.submit_call(bt.calls.MevShield.submit_encrypted(ciphertext=b"\x00" * 64), miner)
    assert not stray.success and "cannot decrypt" in stray.message
    with pytest.raises(bt.ChainError, match=r"storage SubtensorModule\.Bonds"):
        sub.query(("SubtensorModule", "Bonds"), [dev_chain.netuid, 0])
    with pytest.raises(bt.ChainError, match=r"runtime API NeuronInfoRuntimeApi\.get_neurons"):
        sub.runtime(("NeuronInfoRuntimeApi", "get_neurons"), [dev_chain.netuid])


def test_sdk_sees_the_same_clock(dev_chain: DevChain, sub: bt.Subtensor, go_to_block) -> None:
    go_to_block(1234)
    assert sub.block == 1234
    assert sub.block_time() == pytest.approx(0.1)
    genesis = sub.timestamp(block=1).timestamp()
    assert sub.timestamp(block=1234).timestamp() == pytest.approx(genesis + 123.3)
    assert sub.timestamp().timestamp() == pytest.approx(genesis + 123.3)
