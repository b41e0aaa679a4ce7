"""Stalling buckets against honest peers in a validator's gather: how many honest peers each window is judged
on what the stallers did.

    python -m benchmarks.incentive.gather_stallers [--stallers 0 16 32 48] [--seconds 1 3] [--rounds 50]

Production's gather as the validator runs it (`comms.gather` with its default 16 slots and 10 s per peer, the
run's `windows.gather_seconds` round) over F_t and the peer list (`gauntlet.fast_eval_uids` + `top_g` peers),
`--stallers` of them an attacker's buckets, the rest honest, each transfer taking `--seconds`. A `naive`
staller answers nothing until its budget ends; a `timed` one knows the round's deadline (the chain's schedule)
and answers "no such object" `lead` seconds before it, so that its slot passes to an honest peer too late to
finish: `lead` just under an honest transfer (0.9 × `--seconds`), and just over the least time the gather starts
a transfer with (`MIN_BUDGET_SHARE` of the per-peer budget, or `LONGEST_MARGIN` times the round's longest valid
transfer), the best the attacker can aim at. On virtual time,
`--rounds` shuffles each. Per row, the share of honest peers that ended `ok`, `timeout` (a φ on the peer) and
`unserved` (never asked; judged on nothing); the baseline is the row without stallers.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from templar.comms import gather
from templar.comms.gather import LONGEST_MARGIN, MIN_BUDGET_SHARE
from templar.core.clock import run_virtual
from templar.core.config import load_hparams
from templar.storage.base import Blob, ObjectInfo, ObjectNotFound

START = 1_000_000.0  # the put window opens here (virtual unix seconds)
PER_PEER_SECONDS = 10.0  # `comms.gather`'s default per-peer budget


class _Peer:
    """A bucket answering its payload in `seconds` (half for the head, half for the bytes), or never."""

    def __init__(self, stalls: bool, seconds: float):
        self.stalls, self.seconds = stalls, seconds

    async def head(self, key: str, timeout: float | None = None) -> ObjectInfo:
        await asyncio.sleep(3600.0 if self.stalls else self.seconds / 2)
        return ObjectInfo(key, 16, START + 1)

    async def fetch(self, key: str, max_bytes: int | None = None, timeout: float | None = None) -> Blob:
        await asyncio.sleep(self.seconds / 2)
        return Blob(ObjectInfo(key, 16, START + 1), b"\0" * 16)


class _TimedStaller:
    """Holds its slot until `lead` seconds before the round's end, then answers that it has no upload."""

    def __init__(self, release: float):
        self.release = release

    async def head(self, key: str, timeout: float | None = None) -> ObjectInfo:
        wait = self.release - asyncio.get_running_loop().time()
        await asyncio.sleep(wait if wait > 0 else 3600.0)  # too late to release in time: a plain stall
        raise ObjectNotFound(key)


async def _round(peers: int, stallers: int, seconds: float, round_seconds: float, lead: float | None = None
                 ) -> Counter[str]:
    """One gather; `lead` None: naive stallers, else timed ones releasing `lead` s before the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + round_seconds
    buckets: dict[str, object] = {f"s{i:03d}": _Peer(True, seconds) if lead is None else _TimedStaller(deadline - lead)
                                  for i in range(stallers)}
    buckets |= {f"h{i:03d}": _Peer(False, seconds) for i in range(peers - stallers)}
    results = await gather(buckets, 5, put_window=(START, START + 24), deadline=deadline,  # type: ignore[arg-type]
                           max_bytes=64, validate=lambda hotkey, data: data, now=loop.time)
    return Counter(r.status.value for hotkey, r in results.items() if hotkey.startswith("h"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stallers", type=int, nargs="+", default=[0, 16, 32, 48])
    parser.add_argument("--seconds", type=float, nargs="+", default=[1.0, 3.0])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    hp = load_hparams()
    peers = hp.gauntlet.fast_eval_uids + hp.gauntlet.top_g
    print(f"{peers} peers gathered per window, a {hp.windows.gather_seconds:g} s round, {args.rounds} shuffles each")
    for seconds in args.seconds:
        least = min(MIN_BUDGET_SHARE * min(PER_PEER_SECONDS, hp.windows.gather_seconds), LONGEST_MARGIN * seconds)
        for stallers in args.stallers:
            kinds = {"naive": None} if stallers == 0 else {
                "naive": None, f"timed {0.9 * seconds:.1f} s": 0.9 * seconds, f"timed {least + 0.01:.2f} s": least + 0.01}
            for kind, lead in kinds.items():
                total: Counter[str] = Counter()
                for _ in range(args.rounds):
                    total += run_virtual(_round(peers, stallers, seconds, hp.windows.gather_seconds, lead),
                                         start=START + 30)
                honest = (peers - stallers) * args.rounds
                shares = {status: total[status] / honest for status in ("ok", "timeout", "unserved")}
                print(f"transfers of {seconds:g} s, {stallers:2d} stallers ({kind}): honest peers "
                      + ", ".join(f"{status} {share:.0%}" for status, share in shares.items()))


if __name__ == "__main__":
    main()
