"""Gather throughput from a local SeaweedFS server versus a plain sequential download.

    python -m benchmarks.performance.gather                  # 15, 64, 256 peers x ~150 KB payloads
    python -m benchmarks.performance.gather --quick          # 15 and 64 peers, one repeat
    python -m benchmarks.performance.gather --payload-kb 2048 --peers 15 64
    python -m benchmarks.performance.gather --peers 256 1024 2000 --repeats 1   # the scale of a big subnet

Each peer has its own bucket and its own client (read-only key), as a validator sees them.
Per case, after one warm-up `head` per peer (clients and connections created), it times
(a) a sequential `get` of every object, and (b) `templar.comms.gather` of the same objects
(head + timestamp check + capped get + safetensors validation, `--concurrency` at once).
One JSON line per case; seconds are the median over `--repeats`. Client and server share
this machine's cores, so the figures are end-to-end on loopback, not a network measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from templar.comms import GatherStatus, gather, put_gradient
from templar.comms.keys import gradient_key
from templar.storage import S3Bucket
from templar.storage.seaweed import SeaweedServer

WINDOW = 1


def make_payload(nbytes: int, seed: int) -> bytes:
    """A DeMo-like payload: int16 indices and float16 values, half the bytes each."""
    rng = np.random.default_rng(seed)
    n = max(nbytes // 4, 1)
    return st_save({"layer.idx": rng.integers(0, 4096, n, dtype=np.int16),
                    "layer.val": rng.standard_normal(n).astype(np.float16)},
                   metadata={"window": str(WINDOW)})


def validate(hotkey: str, data: bytes) -> int:
    tensors = st_load(data)
    return sum(t.size for t in tensors.values())


async def upload(server: SeaweedServer, names: list[str], payload_bytes: int) -> None:
    limit = asyncio.Semaphore(8)

    async def one(i: int, name: str) -> None:
        async with limit, S3Bucket(server.endpoint_url, name, server.admin) as own:
            await put_gradient(own, WINDOW, make_payload(payload_bytes, i))

    await asyncio.gather(*(one(i, n) for i, n in enumerate(names)))


async def run_case(server: SeaweedServer, names: list[str], repeats: int, concurrency: int) -> dict:
    peers = {f"peer{i}": S3Bucket(server.endpoint_url, n, server.reader, max_pool_connections=4)
             for i, n in enumerate(names)}
    key = gradient_key(WINDOW)
    try:
        limit = asyncio.Semaphore(32)  # warm-up: each peer's client and connection, a few at a time

        async def warm(b: S3Bucket):
            async with limit:
                return await b.head(key, timeout=120.0)

        sizes = [info.size for info in await asyncio.gather(*(warm(b) for b in peers.values()))]
        total = sum(sizes)
        seq_times, gather_times, ok = [], [], 0
        for _ in range(repeats):
            started = time.perf_counter()
            for b in peers.values():
                await b.get(key, max_bytes=max(sizes))
            seq_times.append(time.perf_counter() - started)

            now = time.time()
            started = time.perf_counter()
            results = await gather(peers, WINDOW, put_window=(now - 3600, now + 3600), deadline=now + 120,
                                   max_bytes=max(sizes), validate=validate, concurrency=concurrency)
            gather_times.append(time.perf_counter() - started)
            ok = sum(r.status is GatherStatus.OK for r in results.values())
    finally:
        for b in peers.values():
            await b.aclose()
    seq, gat = statistics.median(seq_times), statistics.median(gather_times)
    return {"case": "gather", "peers": len(names), "payload_bytes": int(statistics.mean(sizes)),
            "total_mb": round(total / 1e6, 2), "concurrency": concurrency, "repeats": repeats,
            "sequential_s": round(seq, 3), "sequential_mb_s": round(total / 1e6 / seq, 1),
            "gather_s": round(gat, 3), "gather_mb_s": round(total / 1e6 / gat, 1),
            "speedup": round(seq / gat, 2), "ok": ok}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, nargs="+", default=[15, 64, 256])
    parser.add_argument("--payload-kb", type=int, default=150, help="payload size per peer (tiny preset ~150)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="15 and 64 peers, one repeat")
    args = parser.parse_args()
    if args.quick:
        args.peers, args.repeats = [p for p in args.peers if p <= 64] or [15], 1

    with tempfile.TemporaryDirectory(prefix="templar-bench-") as tmp:
        # Every bucket is a SeaweedFS collection with at least one volume of its own: the cap must
        # exceed the bucket count (the default 1024 stops near 1,023 buckets).
        server = SeaweedServer(Path(tmp) / "weed", volume_max=max(1024, 2 * max(args.peers) + 64),
                               memory_limit="1GiB").start()
        try:
            started = time.perf_counter()
            names = [server.create_bucket(f"peer-{i:04d}") for i in range(max(args.peers))]
            asyncio.run(upload(server, names, args.payload_kb * 1024))
            print(json.dumps({"case": "setup", "buckets": len(names),
                              "seconds": round(time.perf_counter() - started, 1)}), flush=True)
            for n in sorted(args.peers):
                result = asyncio.run(run_case(server, names[:n], args.repeats, args.concurrency))
                print(json.dumps(result), flush=True)
        finally:
            server.stop(kill=True)


if __name__ == "__main__":
    main()
