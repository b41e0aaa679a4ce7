"""Chain access for templar: the only package that imports `bittensor`.

    from templar.chain import connect
    chain = connect(network="embedded", chain_endpoint="/tmp/chain.sqlite", netuid=3,
                    wallet_name="validator")
    chain.require_registered(); chain.set_weights({1: 0.7, 2: 0.3})

`Chain` is the adapter over the bittensor 11 SDK (finney, test, local, ws://..., or the
embedded SQLite chain); `Neuron` and the exceptions are plain project types. Dev chains with
registered wallets come from `create_dev_chain` (see `templar.chain.devchain`).
"""

from templar.chain.client import Chain, connect, load_wallet, verify_signature
from templar.chain.devchain import DevChain, DevWallet, create_dev_chain
from templar.chain.embedded.store import ChainSpec, ManualTime
from templar.chain.types import (
    MAX_COMMITMENT_BYTES,
    VALIDATOR_LOCATOR_BYTES,
    VALIDATOR_MARK,
    ChainError,
    ChainUnavailable,
    Commitment,
    CommitRevealPending,
    InsufficientStake,
    Neuron,
    NotRegistered,
    PoolRejected,
    RateLimited,
    Refused,
    StaleMetagraph,
    WeightsSettings,
    is_miner,
    lead_of,
    succession_of,
)

__all__ = [
    "MAX_COMMITMENT_BYTES",
    "VALIDATOR_LOCATOR_BYTES",
    "VALIDATOR_MARK",
    "Chain",
    "ChainError",
    "ChainSpec",
    "ChainUnavailable",
    "CommitRevealPending",
    "Commitment",
    "DevChain",
    "DevWallet",
    "InsufficientStake",
    "ManualTime",
    "Neuron",
    "NotRegistered",
    "PoolRejected",
    "RateLimited",
    "Refused",
    "StaleMetagraph",
    "WeightsSettings",
    "connect",
    "create_dev_chain",
    "is_miner",
    "lead_of",
    "load_wallet",
    "succession_of",
    "verify_signature",
]
