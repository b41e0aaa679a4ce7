"""`templar.wire.shared_reads`: inside `sharing_reads()` a payload is decoded once for every reader of the
process, each reader gets what `read_gradient` returns, in tensors of its own, and every check still
refuses what it refused."""

from __future__ import annotations

import pytest
import torch

from templar.compress import DCTCompressor
from templar.wire import PayloadError, Run, read_gradient, take_probes, write_gradient
from templar.wire.shared_reads import read_gradient_shared, sharing_reads

WINDOW, STEP = 7, 3
RUN = Run(netuid=7, digest="ab" * 32)


def _payload(hp, shapes, keypair, seed: int) -> bytes:
    gen = torch.Generator().manual_seed(seed)
    compressor = DCTCompressor(hp.demo.target_chunk, hp.demo.topk)
    compressed = {n: compressor.compress(torch.randn(s, generator=gen)) for n, s in shapes.items()}
    probes = take_probes({n: torch.randn(s, generator=gen) for n, s in shapes.items()}, seed=11, window=WINDOW,
                         count=hp.gauntlet.probe_count)
    return write_gradient(compressed, probes, window=WINDOW, global_step=STEP, hotkey=keypair.ss58_address, hp=hp,
                          run=RUN, sign=keypair.sign)


def _same(a, b) -> bool:
    return (a.digest, a.document_digest, a.hotkey, a.window, a.global_step, a.nbytes) == (
        b.digest, b.document_digest, b.hotkey, b.window, b.global_step, b.nbytes) and all(
        torch.equal(a.tensors[n].indices, b.tensors[n].indices) and torch.equal(a.tensors[n].values, b.tensors[n].values)
        and torch.equal(a.probes[n], b.probes[n]) for n in a.tensors)


def test_readers_share_one_decode_and_each_gets_tensors_of_its_own(hp, small_shapes, keypair, verify) -> None:
    payload = _payload(hp, small_shapes, keypair, seed=0)
    read = {"run": RUN, "verify": verify, "expected_hotkey": keypair.ss58_address, "expected_window": WINDOW}
    alone = read_gradient(payload, small_shapes, hp, **read)
    assert _same(read_gradient_shared(payload, small_shapes, hp, **read), alone)  # outside the block: read_gradient
    with sharing_reads() as shared:
        first = read_gradient_shared(payload, small_shapes, hp, **read)
        first.tensors["proj"].values.mul_(-3)  # one reader changing what it read in place ...
        first.probes["proj"].zero_()
        second = read_gradient_shared(bytes(payload), small_shapes, hp, **read)
        assert _same(second, alone)  # ... changes nothing another reads
        assert (shared.misses, shared.hits) == (1, 1)
        # another payload is decoded on its own
        other = _payload(hp, small_shapes, keypair, seed=1)
        assert _same(read_gradient_shared(other, small_shapes, hp, **read), read_gradient(other, small_shapes, hp, **read))
        assert shared.misses == 2


def test_every_check_of_a_read_still_refuses_what_it_refused(hp, small_shapes, keypair, verify) -> None:
    """The bytes alone do not name a read: a reader expecting another hotkey, window or run, or checking
    no signature, reads them under its own checks; a refused payload is refused again, never kept."""
    from bittensor.sp_core import Keypair

    payload = _payload(hp, small_shapes, keypair, seed=0)
    ok = {"run": RUN, "verify": verify, "expected_hotkey": keypair.ss58_address, "expected_window": WINDOW}
    refused = {"expected_hotkey": Keypair.create_from_uri("//Bob").ss58_address, "expected_window": WINDOW + 1,
               "run": Run(netuid=8, digest="ab" * 32)}
    with sharing_reads() as shared:
        read_gradient_shared(payload, small_shapes, hp, **ok)
        for name, value in refused.items():
            for _ in range(2):
                with pytest.raises(PayloadError) as info:
                    read_gradient_shared(payload, small_shapes, hp, **{**ok, name: value})
                assert info.value.reason == {"expected_hotkey": "wrong_hotkey", "expected_window": "wrong_window",
                                             "run": "wrong_run"}[name]
        with pytest.raises(PayloadError):
            read_gradient_shared(payload[:-1], small_shapes, hp, **ok)
        assert shared.hits == 0  # no refused read was answered from what an accepted one kept


def test_what_is_kept_stays_within_its_bound(hp, small_shapes, keypair, verify) -> None:
    payloads = [_payload(hp, small_shapes, keypair, seed=s) for s in range(3)]
    read = {"run": RUN, "verify": verify}
    g = read_gradient(payloads[0], small_shapes, hp, **read)
    size = sum(c.indices.nbytes + c.values.nbytes for c in g.tensors.values()) + sum(p.nbytes for p in g.probes.values())
    with sharing_reads(max_bytes=2 * size + size // 2) as shared:  # room for two payloads' tensors and probes
        for data in payloads:
            read_gradient_shared(data, small_shapes, hp, **read)
        read_gradient_shared(payloads[0], small_shapes, hp, **read)  # the least recently read went first
        assert (shared.misses, shared.hits) == (4, 0)
        read_gradient_shared(payloads[2], small_shapes, hp, **read)
        assert shared.hits == 1
