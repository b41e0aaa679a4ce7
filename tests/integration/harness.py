"""A small subnet inside one test: a real embedded chain, local buckets, real Miner/Validator
objects (the same code the neurons run), and fast windows.

Scenarios run on virtual time (`templar.core.clock.run_virtual`): the chain's blocks, every deadline
and every wait follow the event loop's virtual clock, which jumps ahead whenever all nodes are
waiting, so a window costs only the computation in it. `Subnet.node` picks the running loop's
time source, so the same scenario code also runs on the wall clock under `asyncio.run` (the
tests that start real neuron processes do)."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from templar.chain import DevChain, create_dev_chain
from templar.core.clock import loop_time
from templar.core.config import HParams, base_lag, load_hparams
from templar.runtime.flags import add_node_args
from templar.runtime.node import Node, start_node
from templar.storage import Bucket, open_bucket
from templar.validator.files import SECRET_FILE

NETUID = 7
FAST_WINDOWS = {
    "blocks_per_window": 11,
    "block_time": 0.6,
    "put_window_seconds": 1.5,
    "clock_skew_seconds": 0.5,
    "gather_seconds": 1.5,
    "windows_per_weights": 2,
    "checkpoint_frequency": 2,
    "peer_replacement_frequency": 1,
    "warmup_windows": 1,
    "max_allowed_stale": 3,
    "lead_cadence": 4,
    "handover_seconds": 0.5,
    "handover_settle_seconds": 0.25,
}


MICRO_PRESET = Path(__file__).resolve().parents[1] / "presets" / "micro.json"
"""`tiny-paper` (tiny with the paper's rules) with a 4× narrower, 2-layer model (32 wide; same vocabulary,
data and Gauntlet levers): the nodes' tests check mechanisms, not model quality, and training and evaluation
are most of a localnet's CPU (an in-process adversarial localnet: 120 -> 72 s at 64 wide). At 32 wide rather
than 64 the nodes' integration, distributed, runtime, validator and doctor tests took 196-200 CPU-s and
102-104 s against 213-218 and 111-112 s (2026-12-04, each twice on one host, 4 workers). The tests that
judge who is paid keep 64 (`micro-gauntlet`): at 32 three of their seeded outcomes moved (the pay localnet's
loss fell 0.50 in 10 windows, where the test asks more; two identical honest miners beside four `faint`
hotkeys were paid 0.29 and 0.71), and re-basing them means re-measuring every figure they cite."""


MICRO_GAUNTLET_PRESET = MICRO_PRESET.with_name("micro-gauntlet.json")
"""A micro model twice `micro`'s width (64; 2 layers) under production's Gauntlet (`tiny`'s rules: the proof
of computation by size, the relative LossRating) with H = 2 inner AdamW steps: the tests that judge who is paid."""

MICRO_1K_PRESET = MICRO_PRESET.with_name("micro-1k.json")
"""`micro` on the 1024-token corpus (see below): what a `Subnet` runs unless a test names another base.
The nodes' integration tests cost half the CPU on it (181 -> 127 s for those of tests/integration,
doctor, runtime and dashboard on virtual time) and check the same mechanisms."""

MICRO_GAUNTLET_1K_PRESET = MICRO_PRESET.with_name("micro-gauntlet-1k.json")
"""`micro-gauntlet` on the sample corpus under a 1024-token tokenizer (`assets/shards-1k`, built by
scripts/build_assets.py): with a 64-wide model the 8192-way output layer is 0.52 M of about 0.69 M
multiply-adds per token, so a 9-node in-process localnet costs 10-11 s of CPU here against 24 s on
`micro-gauntlet`. The incentive localnets of test_localnet.py and the validator's integration tests use it,
and so do the localnets whose neurons are OS processes in real time (test_localnet's end-to-end run,
test_failover): their windows last as long on any model, and on tiny's 4 wider layers they took more of the
CPU the suite's other tests run on (2026-12-02, both tests alone: 43 CPU-s, 39 on micro)."""


def write_fast_preset(directory: Path, sections: dict[str, dict] | None = None, base: Path = MICRO_1K_PRESET,
                      **windows: object) -> Path:
    """The 1024-token micro preset (or `base`) with 6.6-second windows (and optional window overrides; `sections`:
    other hparams sections' overrides, e.g. less data per window for tests that only need the mechanics)."""
    body: dict[str, object] = {"base": str(base), "name": "micro-fast", **(sections or {}),
                               "windows": {**FAST_WINDOWS, **windows}}
    path = directory / "fast.json"
    path.write_text(json.dumps(body))
    return path


@dataclass
class Subnet:
    root: Path
    hparams: Path
    stakes: dict[str, float]
    wallets: dict = field(default_factory=dict)
    dev: DevChain | None = None
    """The chain's wallets, to act as one of them (`DevChain.connect`, `fund`)."""
    open_bucket: Callable[..., Bucket] = open_bucket
    """How its nodes open buckets (`start_node`'s `open_bucket`; a `FaultPlan`'s to put them on a faulty server)."""

    @classmethod
    def create(cls, root: Path, stakes: dict[str, float], sections: dict[str, dict] | None = None,
               base: Path = MICRO_1K_PRESET, **windows: object) -> Subnet:
        hparams = write_fast_preset(root, sections, base, **windows)
        hp = load_hparams(hparams)
        dev = create_dev_chain(root / "chain.sqlite", netuid=NETUID, hotkeys=stakes, wallet_path=root / "wallets",
                               wallet_name="test", block_time=hp.windows.block_time, weights_rate_limit=2)
        return cls(root=root, hparams=hparams, stakes=stakes, wallets=dev.wallets, dev=dev)

    def args(self, name: str, *extra: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        add_node_args(parser)
        bucket = self.root / "buckets" / name
        bucket.mkdir(parents=True, exist_ok=True)
        self._seed_secret(self.root / "nodes" / name, name)
        return parser.parse_args([
            "--wallet.name", "test", "--wallet.hotkey", name, "--wallet.path", str(self.root / "wallets"),
            "--netuid", str(NETUID), "--subtensor.network", "embedded",
            "--subtensor.chain_endpoint", str(self.root / "chain.sqlite"), "--hparams", str(self.hparams),
            "--device", "cpu", "--state.dir", str(self.root / "nodes" / name),
            "--bucket.locator", f"local:{bucket}", *extra,
        ])

    @staticmethod
    def _seed_secret(state_dir: Path, name: str) -> None:
        """A validator's evaluation secret, derived from its name (as `templar localnet` derives it from
        `--seed`), so that a test repeats bit for bit on virtual time. Its random one would make each run a
        new draw of the private page and sequence choices, and a measured margin a matter of luck: a lazy
        miner's weight in test_validator ranged 0-0.058 over 13 random secrets."""
        path = state_dir / SECRET_FILE
        if not path.exists():
            state_dir.mkdir(parents=True, exist_ok=True)
            path.write_bytes(hashlib.blake2b(name.encode(), key=b"templar-tests", digest_size=32).digest())

    def neuron_cmd(self, role: str, name: str, *extra: str) -> list[str]:
        """The same flags for a real `neurons/<role>.py` process."""
        import sys

        from templar.core.config import REPO_ROOT

        args = self.args(name)
        return [sys.executable, str(REPO_ROOT / "neurons" / f"{role}.py"), "--wallet.name", "test",
                "--wallet.hotkey", name, "--wallet.path", str(self.root / "wallets"), "--netuid", str(NETUID),
                "--subtensor.network", "embedded", "--subtensor.chain_endpoint", str(self.root / "chain.sqlite"),
                "--hparams", str(self.hparams), "--device", "cpu", "--state.dir", str(args.state_dir),
                "--bucket.locator", args.bucket_locator, *extra]

    def role(self, name: str) -> str:
        """A staked hotkey is a validator, the others miners: the role its commitment declares."""
        return "validator" if self.stakes.get(name, 0.0) > 0 else "miner"

    async def node(self, name: str, *extra: str) -> Node:
        """A started node on the running loop's time (virtual under `run_virtual`)."""
        return await start_node(self.args(name, *extra), self.role(name), time=loop_time(),
                                open_bucket=self.open_bucket)


PRODUCTION_QUARTER = dict(blocks_per_window=7, block_time=3.0, put_window_seconds=6.0, clock_skew_seconds=0.5,
                          gather_seconds=5.0, settle_seconds=0.0625, handover_seconds=1.25, handover_settle_seconds=0.25,
                          apply_seconds=1.25, commit_read_seconds=1.0)
"""hparams.json's window settings with every duration divided by 4 (21-second windows): production's
geometry, where the suite's 6.6-second windows leave no room for what takes real seconds."""


def untrained_windows(hp: HParams) -> int:
    """Windows a freshly started miner steps without training: a delayed run's first (its base, θ
    after the window before last, has gone by: `templar.miner.loop.Miner.may_begin`), none else."""
    return base_lag(hp.inner) - 1


def parameters(node_or_model) -> dict[str, torch.Tensor]:
    model = node_or_model.model if isinstance(node_or_model, Node) else node_or_model
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same_parameters(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


async def wait_for_window(node: Node, window: int, timeout: float = 60.0) -> None:
    async with asyncio.timeout(timeout):
        while node.clock.current_window() < window:
            await asyncio.sleep(0.1)
