"""The adapter against a real subtensor node (opt-in): the same checks as on the embedded chain.

Run with a local dev node whose `//Alice` and `//Bob` accounts are funded (e.g. subtensor's
localnet script):  TEMPLAR_E2E_ENDPOINT=ws://127.0.0.1:9944 pytest tests/chain -m e2e_chain
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from types import SimpleNamespace

import bittensor as bt
import pytest
from bittensor.sp_core import Keypair

from templar.chain import Chain, NotRegistered, RateLimited, connect, verify_signature

ENDPOINT = os.getenv("TEMPLAR_E2E_ENDPOINT")

pytestmark = [
    pytest.mark.e2e_chain,
    pytest.mark.skipif(
        not ENDPOINT,
        reason="set TEMPLAR_E2E_ENDPOINT=ws://host:port (a writable local "
        "subtensor node with funded //Alice and //Bob) to run",
    ),
]


def dev_keys(uri: str) -> SimpleNamespace:
    """A wallet-shaped bundle of dev keypairs: coldkey `uri`, hotkey `uri//hot`."""
    cold = Keypair.create_from_uri(uri)
    return SimpleNamespace(
        name=uri,
        hotkey_str="hot",
        coldkey=cold,
        coldkeypub=cold,
        hotkey=Keypair.create_from_uri(f"{uri}//hot"),
    )


@pytest.fixture(scope="module")
def node() -> Iterator[dict[str, Chain]]:
    base = connect(network=str(ENDPOINT), netuid=1, wallet_name=None, read_timeout=60, write_timeout=300)
    try:
        netuid = base.for_wallet(dev_keys("//Alice")).register_subnet()
        chains = {
            name: base.for_wallet(dev_keys(f"//{name}"), netuid=netuid)
            for name in ("Alice", "Bob", "Charlie")
        }
        chains["Bob"].register()
        yield chains
    finally:
        base.close()


def test_registration_and_metagraph(node: dict[str, Chain]) -> None:
    alice, bob, charlie = node["Alice"], node["Bob"], node["Charlie"]
    neurons = bob.metagraph()
    assert neurons[0].hotkey == alice.hotkey  # the owner hotkey takes uid 0
    assert bob.require_registered() == neurons[[n.hotkey for n in neurons].index(bob.hotkey)].uid
    assert charlie.my_uid() is None
    with pytest.raises(NotRegistered, match=f"netuid {charlie.netuid}"):
        charlie.require_registered()


def test_commitment_round_trip(node: dict[str, Chain]) -> None:
    locator = "local:/tmp/templar-e2e-" + "x" * 80
    node["Bob"].commit_bucket(locator)
    assert node["Alice"].bucket_locators()[node["Bob"].hotkey] == locator
    with pytest.raises(ValueError):
        node["Bob"].commit_bucket("y" * 129)


def test_clock_and_signatures(node: dict[str, Chain]) -> None:
    bob = node["Bob"]
    head = bob.block()
    assert head > 0 and bob.block_time > 0
    assert bob.block_timestamp(head + 10) == pytest.approx(bob.block_timestamp(head) + 10 * bob.block_time)
    signature = bob.sign(b"e2e")
    assert verify_signature(bob.hotkey, b"e2e", signature)
    assert not verify_signature(node["Alice"].hotkey, b"e2e", signature)


def test_self_weight_then_rate_limit(node: dict[str, Chain]) -> None:
    alice = node["Alice"]
    probe = bt.Subtensor(str(ENDPOINT), fallback_endpoints=[], archive_endpoints=[])
    try:
        if probe.subnets.commit_reveal_enabled(alice.netuid):
            pytest.skip("commit-reveal is on for the new subnet: weights reveal later via drand")
    finally:
        probe.close()
    uid = alice.require_registered()
    alice.set_weights({uid: 1.0})  # a self-weight needs no validator permit
    assert alice.current_weights()[uid] == {uid: pytest.approx(1.0)}
    with pytest.raises(RateLimited) as info:
        alice.set_weights({uid: 1.0})
    assert info.value.blocks_to_wait > 0
