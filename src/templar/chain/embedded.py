"""The embedded chain: one SQLite file shared by every process on a machine, driven by the
real bittensor SDK through `EmbeddedSubstrate` (see `templar.chain.substrate`).

This module gathers what tools and tests need to stand one up:

    create_chain(path, ChainSpec(block_time=1.0))       # the bare file with its genesis
    create_dev_chain(path, netuid=..., hotkeys={...})    # ... plus a subnet and registered wallets
    EmbeddedSubstrate(path)                              # `bt.Subtensor(..., substrate=...)` backend
"""

from templar.chain.devchain import DevChain, DevWallet, create_dev_chain, ensure_subnet, register_wallet
from templar.chain.store import BlockClock, ChainSpec, ChainStore, ManualTime
from templar.chain.substrate import EmbeddedSubstrate, create_chain

__all__ = [
    "BlockClock",
    "ChainSpec",
    "ChainStore",
    "DevChain",
    "DevWallet",
    "EmbeddedSubstrate",
    "ManualTime",
    "create_chain",
    "create_dev_chain",
    "ensure_subnet",
    "register_wallet",
]
