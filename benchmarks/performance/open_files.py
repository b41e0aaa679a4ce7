"""How many files a validator holds open when it reads every miner's commitment at once: a count,
sampled from `/proc/self/fd`, not an estimate.

    python -m benchmarks.performance.open_files [--peers 64 256] [--reads 3]

A validator reads each window's commitments of every miner in one burst (`comms.commit.read_commits`:
every read starts at once, none waits for a slot), each through the miner's own bucket client
(`Node.peer_buckets`, `storage.open_bucket` as a node opens a peer's locator). Here the peers' buckets are
clients of one local SeaweedFS bucket, one client per peer (what a socket is opened per: the client's
connection pool, not the bucket's name), each holding a commitment of the window. The process first
imports what a validator's process imports (`templar.validator.loop`), so the baseline counts its
libraries' files too. A thread samples the count of open descriptors every millisecond. Per peer
count: the baseline, the peak over `--reads` bursts, and what stays open after them (the connections
each client keeps alive for the next window). Linux only (`/proc`). Prints one JSON line per case and
writes benchmarks/results/open_files.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from pathlib import Path

from templar.comms.commit import put_commit, read_commits
from templar.storage import S3Bucket, open_bucket
from templar.storage.seaweed import SeaweedServer
from templar.wire.schema import Run

RESULTS = Path(__file__).resolve().parents[1] / "results" / "open_files.json"
WINDOW = 7
RUN = Run(netuid=3, digest="0" * 64)
FD_DIR = "/proc/self/fd"


def open_files() -> int:
    return len(os.listdir(FD_DIR))


class PeakSampler:
    """The most descriptors open at once while it runs, sampled every `interval` seconds in a thread."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval, self.peak = interval, open_files()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, open_files() - 1)  # less the directory listing itself
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


async def case(server: SeaweedServer, bucket: str, peers: int, reads: int) -> dict[str, object]:
    baseline = open_files()
    buckets = {f"peer{i:04d}": open_bucket(server.locator(bucket)) for i in range(peers)}
    found = 0
    try:
        with PeakSampler() as sampler:
            for _ in range(reads):
                loop = asyncio.get_running_loop()
                digests = await read_commits(buckets, WINDOW, run=RUN, deadline=loop.time() + 60.0, now=loop.time)
                found = sum(bool(d) for d in digests.values())
        after = open_files()
    finally:
        for b in buckets.values():
            await b.aclose()
    closed = open_files()
    return {"case": "commit_read", "peers": peers, "reads": reads, "commitments_read": found,
            "baseline_open_files": baseline, "peak_open_files": sampler.peak, "peak_over_baseline": sampler.peak - baseline,
            "open_after_reads": after, "open_after_close": closed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--reads", type=int, default=3, help="bursts per case (a window's read each)")
    args = parser.parse_args()
    if not os.path.isdir(FD_DIR):
        raise SystemExit(f"{FD_DIR} is not there: this benchmark counts open files on Linux only")
    import templar.validator.loop  # noqa: F401  (what a validator's process holds open before its reads)

    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="templar-bench-") as tmp:
        server = SeaweedServer(Path(tmp) / "weed", memory_limit="1GiB").start()
        try:
            name = server.create_bucket("commitments")

            async def run() -> None:
                async with S3Bucket(server.endpoint_url, name, server.admin) as own:
                    await put_commit(own, WINDOW, bytes(32), run=RUN)
                for peers in sorted(args.peers):
                    results.append(await case(server, name, peers, args.reads))
                    print(json.dumps(results[-1]), flush=True)

            asyncio.run(run())
        finally:
            server.stop(kill=True)
    RESULTS.write_text(json.dumps({"cases": results}, indent=1) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
