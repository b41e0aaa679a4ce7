"""What peers whose name servers never answer cost a validator's own work, with aiohttp's default
resolver (the baseline: `getaddrinfo` on the event loop's default executor) and with the nodes'
`storage.resolve.PeerResolver` (each lookup in a thread of its own).

    python -m benchmarks.performance.peer_dns [--silent 0 8 32] [--seconds 10] [--threads 20]

For each count of silent peers, each peer's bucket is read once a second for `--seconds` (a
validator reads every miner's commitment each window, and gathers the ones it evaluates), each read
ending at its 1 s deadline, while the validator's work runs beside it: an `asyncio.to_thread` call
every 0.25 s (its evaluation, its state saves and its chain calls go that way). A silent name server
is a lookup that answers "try again" after `--lookup-seconds` (glibc's default for one name server:
5 s, twice); the names are under `.silent.test`, and the system's `getaddrinfo` is wrapped for them
in this process only. The default executor has `--threads` threads (`min(32, cores + 4)`: 20 on a
16-core validator). Prints one JSON line per case and writes benchmarks/results/peer_dns.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from aiohttp.resolver import ThreadedResolver

from templar.storage import S3Bucket, StorageError
from templar.storage.locator import Credentials
from templar.storage.resolve import PeerResolver

RESULTS = Path(__file__).resolve().parents[1] / "results" / "peer_dns.json"
SILENT_ZONE = ".silent.test"


def _silent_name_servers(lookup_seconds: float) -> None:
    """`getaddrinfo` as a name server that never answers makes it, for names in `SILENT_ZONE` only."""
    system = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(host, str) and host.endswith(SILENT_ZONE):
            time.sleep(lookup_seconds)
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return system(host, *args, **kwargs)

    socket.getaddrinfo = getaddrinfo


async def _case(resolver_name: str, silent: int, seconds: float, threads: int) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(ThreadPoolExecutor(threads))
    buckets = [S3Bucket(f"https://bucket{i}{SILENT_ZONE}", "peer", Credentials("key", "secretsecret"), "us-east-1",
                        connect_timeout=1.0, max_attempts=1,
                        resolver=ThreadedResolver() if resolver_name == "aiohttp default" else PeerResolver())
               for i in range(silent)]
    stop = loop.time() + seconds

    async def reads(bucket: S3Bucket) -> None:
        while loop.time() < stop:
            started = loop.time()
            with contextlib.suppress(StorageError):
                await bucket.head("v4/commit/7.json", timeout=1.0)
            await asyncio.sleep(max(0.0, 1.0 - (loop.time() - started)))

    waits: list[float] = []

    async def work() -> None:
        while loop.time() < stop:
            started = time.perf_counter()
            await asyncio.to_thread(lambda: None)
            waits.append(time.perf_counter() - started)
            await asyncio.sleep(0.25)

    await asyncio.gather(work(), *(reads(b) for b in buckets))
    for bucket in buckets:
        await bucket.aclose()
    return {"case": "peer_dns", "resolver": resolver_name, "silent_peers": silent, "executor_threads": threads,
            "work_calls": len(waits), "work_wait_ms_median": round(statistics.median(waits) * 1e3, 2),
            "work_wait_ms_max": round(max(waits) * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--silent", type=int, nargs="+", default=[0, 8, 32])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--lookup-seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=20)
    args = parser.parse_args()
    _silent_name_servers(args.lookup_seconds)
    results = []
    for silent in args.silent:
        by_resolver = {}
        for name in ("aiohttp default", "PeerResolver"):
            result = asyncio.run(_case(name, silent, args.seconds, args.threads))
            by_resolver[name] = result
            results.append(result)
            print(json.dumps(result))
        base, ours = by_resolver["aiohttp default"], by_resolver["PeerResolver"]
        print(json.dumps({"case": "peer_dns_ratio", "silent_peers": silent,
                          "max_wait_default_over_peer_resolver": round(
                              base["work_wait_ms_max"] / max(ours["work_wait_ms_max"], 1e-3), 1)}))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
