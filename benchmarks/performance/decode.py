"""What a strict read of one peer's payload costs (`templar.wire.read_gradient` under the run's codec:
the container, the signed digest, every tensor's rice-coded indices and 2-bit values checked
canonical): with the C kernel reading the indices (`templar.compress.native.rice_indices`, where it is
built), with the numpy reader alone, and with the numpy reader finding the terminators in 0/1 bytes
instead of booleans (the baseline: the reader before both; all three interleaved in the same process).

    python -m benchmarks.performance.decode [--reps 10] [--cases micro,tiny,production] [--out FILE]

Why it matters: every node reads every payload it gathers inside the gather's round (`gather_seconds`,
20 s in production), a miner the 15 of the peer list, a validator up to 79 (F_t and the peer list), in
the gather's worker threads, which only run side by side where the read lets go of the GIL. On an H200's
host a production read took 1.2 s (benchmarks/LOG.md §70). Cases:
- `micro` (the test suite's model) and `tiny` (`hparams/tiny.json`);
- `production` (`hparams.json`'s 1.2B shapes, 147 tensors, 18.8 million values): one payload of random
  2-bit grid values at random distinct positions of each chunk (about 20 s to build on 2 cores).
All three must decode the same indices and values (exit 1 otherwise). One torch thread, CPU; prints one
JSON line per case, with 15 and 79 reads' seconds one after another and 8 reads' in 2 threads against
one after another, and writes benchmarks/results/decode.json.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from benchmarks._common import emit, median, timed, write_result
from benchmarks.performance.aggregate import PRESETS
from benchmarks.performance.gpu_bench import StandInKey
from templar.compress import Compressed, native
from templar.compress.methods import rule_of
from templar.compress.sparseloco.grid import quantise
from templar.core.config import HParams, load_hparams
from templar.core.model import build_model
from templar.wire import Gradient, Run, codec, read_gradient, write_gradient
from templar.wire.gradient import run_codec

PEER_LIST, GATHERED_BY_A_VALIDATOR = 15, 79
"""A miner's reads a window (the peer list, `top_g`) and a validator's at most (F_t's 64 and the list)."""


def payload_of(hp: HParams, key: StandInKey, run: Run) -> tuple[bytes, dict[str, torch.Size], int]:
    """One signed payload in the run's layout: random grid values at random distinct positions of
    every chunk, as many as the run keeps; with its shapes and its number of values."""
    compressor = rule_of(hp.optimizer.method).compressor(hp.demo.target_chunk, hp.demo.topk)
    shapes = {name: p.shape for name, p in build_model(hp, "meta").named_parameters()}
    gen = torch.Generator().manual_seed(0)
    payload, values = {}, 0
    for name, shape in shapes.items():
        plan = compressor.plan(shape)
        k = compressor.k_for(plan)
        positions = torch.rand(plan.n_chunks, plan.chunk_numel, generator=gen).topk(k, dim=1).indices
        payload[name] = Compressed(indices=positions.sort(dim=1).values,
                                   values=quantise(torch.randn(plan.n_chunks, k, generator=gen)),
                                   shape=shape, chunk=plan.chunk)
        values += plan.n_chunks * k
    probes = {name: torch.zeros(hp.gauntlet.probe_count) for name in shapes}
    data = write_gradient(payload, probes, window=1, global_step=0, hotkey="peer", hp=hp, run=run, sign=key.sign)
    return data, shapes, values


@contextlib.contextmanager
def terminators_in_bytes() -> Iterator[None]:
    """The numpy reader's unpacked high bits left as 0/1 bytes, as it held them before, which numpy scans
    for the set ones about 9 times slower than booleans."""
    ours = codec._bits
    codec._bits = lambda stream: np.unpackbits(stream.numpy(), bitorder="little")
    try:
        yield
    finally:
        codec._bits = ours


def interleaved_ms(sides: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
    """Each side's median milliseconds over `reps` rounds that run every side once, so a noisy shared
    machine slows all alike."""
    for fn in sides.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(reps):
        for name, fn in sides.items():
            _, seconds = timed(fn)
            times[name].append(seconds)
    return {name: 1000 * median(values) for name, values in times.items()}


def side_by_side(read: Callable[[], object], reads: int = 8) -> float:
    """`reads` reads in 2 threads over the same reads one after another: how far the gather's threads
    can run them at once (2 where nothing holds the GIL, on a machine with 2 free cores)."""
    _, serial = timed(lambda: [read() for _ in range(reads)])
    with ThreadPoolExecutor(2) as pool:
        _, threaded = timed(lambda: list(pool.map(lambda _: read(), range(reads))))
    return serial / threaded


def measure(case: str, reps: int) -> dict:
    hp = load_hparams(PRESETS[case])
    key, run = StandInKey(), Run(netuid=0, digest=hp.digest())
    data, shapes, values = payload_of(hp, key, run)

    def read() -> Gradient:
        return read_gradient(data, shapes, hp, run=run, verify=key.verify, expected_hotkey="peer", expected_window=1)

    def numpy_read() -> Gradient:
        with native.disabled():
            return read()

    def byte_scan_read() -> Gradient:
        with native.disabled(), terminators_in_bytes():
            return read()

    ms = interleaved_ms({"read": read, "numpy": numpy_read, "bytes": byte_scan_read}, reps)
    reads = [read(), numpy_read(), byte_scan_read()]
    same = all(torch.equal(r.tensors[n].indices, reads[0].tensors[n].indices)
               and torch.equal(r.tensors[n].values, reads[0].tensors[n].values) for r in reads[1:] for n in shapes)
    return {"case": case, "preset": hp.name, "codec": run_codec(hp), "kernel": native.available(),
            "tensors": len(shapes), "values_per_payload": values, "payload_mb": len(data) / 1e6,
            "read_ms": ms["read"], "numpy_read_ms": ms["numpy"], "numpy_byte_scan_read_ms": ms["bytes"],
            "ratio": ms["read"] / ms["bytes"], "numpy_ratio": ms["numpy"] / ms["bytes"], "same_payload": same,
            "two_threads_speedup": side_by_side(read), "numpy_two_threads_speedup": side_by_side(numpy_read),
            "peer_list_reads_seconds": PEER_LIST * ms["read"] / 1000,
            "validator_reads_seconds": GATHERED_BY_A_VALIDATOR * ms["read"] / 1000}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10, help="interleaved timed reads of each side (production: a third)")
    parser.add_argument("--cases", default="micro,tiny,production", help="comma-separated: micro, tiny, production")
    parser.add_argument("--out", default=None, help="where to write the JSON (default benchmarks/results/decode.json)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = {}
    for case in args.cases.split(","):
        results[case] = measure(case, max(3, args.reps // 3) if case == "production" else args.reps)
        emit(results[case])
    out = Path(args.out) if args.out else None
    write_result(out.name if out else "decode.json", results, *([out.parent] if out else []))
    return 0 if all(r["same_payload"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
