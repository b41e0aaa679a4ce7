"""Fixtures for compression and wire tests: the tiny preset, a real sr25519 key, real gradients."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from templar.compress import Compressed, DCTCompressor, DeMo, native
from templar.config import HParams, load_hparams
from templar.model import build_model, causal_lm_loss, parameter_shapes


@pytest.fixture(scope="session")
def hp() -> HParams:
    return load_hparams("tiny")


@pytest.fixture(scope="session")
def keypair():
    from bittensor.sp_core import Keypair

    return Keypair.create_from_uri("//Alice")


@pytest.fixture(scope="session")
def verify() -> Callable[[str, bytes, bytes], bool]:
    """What templar.chain injects: sr25519 verification against an ss58 address."""
    from bittensor.sp_core import Keypair

    def _verify(hotkey: str, message: bytes, signature: bytes) -> bool:
        return bool(Keypair(ss58_address=hotkey).verify(message, signature))

    return _verify


@pytest.fixture(scope="session")
def small_shapes() -> dict[str, torch.Size]:
    """A compact schema with every chunking case: 2-D, 1-D, padded (prime) rows, tiny."""
    return {
        "emb": torch.Size([131, 64]),
        "proj": torch.Size([128, 128]),
        "norm": torch.Size([128]),
        "odd": torch.Size([5, 3]),
    }


@pytest.fixture(scope="session")
def tiny_shapes(hp: HParams) -> dict[str, torch.Size]:
    return parameter_shapes(build_model(hp, device="meta"))


@pytest.fixture(scope="session")
def real_peers(hp: HParams) -> tuple[dict[str, torch.Size], list[dict[str, Compressed]]]:
    """Compressed pseudo-gradients of 4 peers: two DeMo steps each of real tiny-model backward
    passes on Zipf-distributed tokens (different tokens per peer)."""
    torch.manual_seed(0)
    model = build_model(hp)
    shapes = parameter_shapes(model)
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    zipf = 1.0 / torch.arange(1, hp.model.vocab_size + 1, dtype=torch.float64) ** 1.1
    peers = []
    for peer in range(4):
        demo = DeMo(model, compressor=compressor, decay=hp.demo.momentum_decay)
        gen = torch.Generator().manual_seed(100 + peer)
        for _ in range(2):
            ids = torch.multinomial(zipf, 4 * 64, replacement=True, generator=gen).view(4, 64)
            model.zero_grad()
            causal_lm_loss(model, ids).backward()
            update = demo.step(
                {n: p.grad for n, p in model.named_parameters()}, lr=hp.optimizer.learning_rate
            )
        peers.append(update)
    return shapes, peers


@pytest.fixture(params=["native", "torch"])
def kernel_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test on the C kernels (where built) and again on the torch paths."""
    if request.param == "torch":
        with native.disabled():
            yield "torch"
    else:
        yield "native" if native.available() else "torch"
