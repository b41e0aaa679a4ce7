"""The miner's one extension point.

A production miner runs `MinerHooks()` as it is: every hook returns its input unchanged. The
localnet's adversaries (`templar.localnet.adversaries`) subclass it to change exactly one
behaviour each, which is how the subnet's tests show that the incentive pays honest work and
nothing else. The hooks cover everything such a variant needs, and nothing else reaches into the
miner's window:

| hook | called | may |
|---|---|---|
| `pages` | before training | choose other pages than the assigned (plus `--extra-pages`) ones |
| `batch` | before training | train on other sequences than all of the fetched pages' |
| `transform` | after compression, before encoding | rewrite the top-k values |
| `before_commit` | after encoding, before the commitment | replace the signed payload it commits to |
| `before_upload` | when the put window opens | wait, or replace the signed payload |
| `after_step` | after the outer step | change the model the next window trains on |
| `checks_sync` (attribute) | each window, before encoding | `False`: skip the self-check against the lead's fingerprint |

Each hook receives the `Miner`, so a variant reads what it needs (its node, clock, hparams,
buckets) without the production loop knowing it exists.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from templar.miner.loop import Miner


class MinerHooks:
    """The honest miner: every hook is the identity."""

    name = "honest"
    """Recorded in `miner_windows.jsonl`, so a run's records say which behaviour produced them."""
    checks_sync = True
    """Whether the miner checks its model against the lead's fingerprint each window and re-syncs on
    a mismatch (`templar.runtime.sync.SyncCheck`). A variant that forks on purpose turns it off:
    a real cheat runs no such check, and the validators must still catch it."""

    def pages(self, miner: Miner, window: int, pages: list[int]) -> list[int]:
        """The pages to train on in `window`, given the assigned (plus extra) ones."""
        return pages

    def batch(self, miner: Miner, window: int, batch: torch.Tensor) -> torch.Tensor:
        """The sequences to train on, given the fetched pages' (one page after another)."""
        return batch

    def learning_rate(self, miner: Miner, window: int, lr: float) -> float:
        """The inner learning rate to train `window` with, given the run's."""
        return lr

    def transform(self, miner: Miner, window: int, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The top-k values to encode, per parameter, given the compressed ones."""
        return values

    async def before_commit(self, miner: Miner, window: int, payload: bytes) -> bytes:
        """The signed payload to commit to and upload, called once it is encoded (a variant that
        replaces it here passes the commitment check: what it sends is what it committed to)."""
        return payload

    async def before_upload(self, miner: Miner, window: int, payload: bytes) -> bytes:
        """The signed payload to upload, called as the put window opens."""
        return payload

    def after_step(self, miner: Miner, window: int) -> None:
        """Called once the window's outer step has been applied (or skipped), before saving."""
