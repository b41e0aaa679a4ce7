"""The embedded chain: one SQLite file shared by every process on a machine, driven by the
real bittensor SDK through `EmbeddedSubstrate` (`templar.chain.embedded.substrate`).

The sub-package holds the chain itself, apart from the client every node uses
(`templar.chain.client`):

- `store`: the state (one SQLite file; the block number a pure function of wall-clock time);
- `runtime`: the extrinsics a subnet needs, each checked as the matching pallet call;
- `chainstate`: storage items, maps and the metagraph runtime API as the SDK reads them;
- `epochs` and `yuma`: the subnet epoch, Yuma consensus every tempo;
- `substrate`: the SDK's `Substrate` protocol over the store.

    create_chain(path, ChainSpec(block_time=1.0))       # the bare file with its genesis
    EmbeddedSubstrate(path)                              # `bt.Subtensor(..., substrate=...)` backend

`templar.chain.devchain` builds on it and on the client: a subnet and registered, staked wallets.
"""

from templar.chain.embedded.store import BlockClock, ChainSpec, ChainStore, ManualTime
from templar.chain.embedded.substrate import EmbeddedSubstrate, create_chain

__all__ = [
    "BlockClock",
    "ChainSpec",
    "ChainStore",
    "EmbeddedSubstrate",
    "ManualTime",
    "create_chain",
]
