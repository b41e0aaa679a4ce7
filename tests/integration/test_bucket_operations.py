"""What a window costs in object-store requests, counted on a real subnet (a lead and two miners,
their real loops, virtual time) at the `Bucket` interface, against the figures `templar hparams`
prints (`templar.tools.bucket_costs`): the same requests, and no LIST in any window but the
lead's checkpoint cleanup."""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter
from pathlib import Path

import pytest

from templar.core.clock import run_virtual
from templar.core.config import load_hparams, resolve_asset
from templar.miner.loop import Miner
from templar.storage.counting import ACTOR, OPERATIONS, counting_buckets
from templar.tools.bucket_costs import Sizes, made
from templar.tools.sizing import window_sizing
from templar.validator.loop import Validator

from .harness import Subnet, untrained_windows

pytestmark = [pytest.mark.slow(seconds=3), pytest.mark.timeout(300)]

WINDOWS = 6
MAX_INPUT_POLLS = 6  # extra reads of the lead's inputs while its gather still runs (0.5 s apart)
MAX_PROGRESS_POLLS = 6  # extra reads of the lead's progress record while its step is being published (0.5 s apart)
STEADY_FROM = 2  # the miners' warm-up window and the first peer list are behind us


def _in(name: str) -> contextvars.Context:
    ctx = contextvars.copy_context()
    ctx.run(ACTOR.set, name)
    return ctx


def test_a_window_makes_the_requests_hparams_says_and_lists_nothing(tmp_path):
    # peer lists replaced every 3 windows, as in production (5): in between the lead names the list in
    # effect again, so every reader's peer-list read stays one GET
    subnet = Subnet.create(tmp_path, {"lead": 100.0, "m1": 0.0, "m2": 0.0}, peer_replacement_frequency=3)
    hp = load_hparams(subnet.hparams)
    corpus = Path(resolve_asset(hp.data.corpus))
    data = f"local:{corpus}"  # the corpus through a locator, so its reads count too
    skipped = untrained_windows(hp)  # a delayed run's first window: no payloads
    windows, steady_from = WINDOWS + skipped, STEADY_FROM + skipped

    async def scenario():
        with counting_buckets() as log:
            log.now = asyncio.get_running_loop().time
            loop = asyncio.get_running_loop()
            nodes = {name: await loop.create_task(subnet.node(name, "--data.locator", data), context=_in(name))
                     for name in ("lead", "m1", "m2")}
            v = Validator(nodes["lead"])
            miners = {name: Miner(nodes[name]) for name in ("m1", "m2")}
            await loop.create_task(v.start(), context=_in("lead"))
            for name, m in miners.items():
                await loop.create_task(m.start(), context=_in(name))
            watcher = loop.create_task(v.commits.run(), context=_in("lead"))
            first = v.state.window + 1
            marks = []
            for w in range(first, first + windows):
                marks.append(len(log.requests))
                await asyncio.gather(loop.create_task(v.run_window(w), context=_in("lead")),
                                     *(loop.create_task(m.run_window(w), context=_in(name))
                                       for name, m in miners.items()))
            await v.checkpoints.wait()  # as a stopping validator does: the last checkpoint's upload and cleanup
            marks.append(len(log.requests))
            watcher.cancel()
            for node in nodes.values():
                node.stop.set()
                await node.aclose()
                node.chain.close()
            buckets = {name: node.bucket.label for name, node in nodes.items()}
            return log.requests, marks, first, buckets, v.hp

    requests, marks, first, buckets, hp = run_virtual(scenario())

    def where(bucket: str, actor: str) -> str:
        if bucket.startswith("own:"):
            return "own"
        if bucket == buckets["lead"].removeprefix("own:"):
            return "lead"
        return "data" if bucket.endswith(f"/{corpus.name}") else "peers"

    sizes = Sizes.of(window_sizing(hp))
    expected = {role: {k: Counter({op: getattr(r, op) for op in OPERATIONS}) for k, r in
                       made(hp, sizes, role, miners=2).items()} for role in ("miner", "lead")}
    # the lead's checkpoint uploads and cleanup run in the background
    upkeep = ("v4/checkpoint/", "v4/aggregate/", "v4/inputs/", "v4/progress/", "v4/peers/")
    lead_lists = 0
    made_by: dict[tuple[str, str], Counter[str]] = {}
    made_by.update({(m, b): Counter() for m in ("m1", "m2") for b in expected["miner"] if b != "data"})
    pages: Counter[str] = Counter()  # ranged GETs of the corpus over the steady windows, by node
    for i in range(windows):
        window = first + i
        counted: dict[str, dict[str, Counter]] = {}
        polls: Counter[str] = Counter()  # a follower reads the lead's inputs until they are published
        # and an overlapped miner its progress record of the step it just took (its sync check, `SyncCheck`)
        progress_polls: Counter[str] = Counter()
        for r in requests[marks[i]:marks[i + 1]]:
            if r.actor == "lead" and (r.key.startswith("v4/checkpoint/") or (r.op in ("list", "delete") and r.key.startswith(upkeep))):
                lead_lists += r.op == "list"
                continue
            if r.actor != "lead" and r.op == "get" and r.key.startswith("v4/inputs/"):
                polls[r.actor] += 1
                if polls[r.actor] > 1:
                    continue
            if r.actor != "lead" and r.op == "get" and r.key.startswith("v4/progress/"):
                progress_polls[r.actor] += 1
                if progress_polls[r.actor] > 1:
                    continue
            counted.setdefault(r.actor, {}).setdefault(where(r.bucket, r.actor), Counter())[r.op] += 1
        # the lead publishes its inputs the moment its gather ends: a follower there first polls a few times
        assert all(1 <= n <= 1 + MAX_INPUT_POLLS for n in polls.values()), (window, polls)
        assert all(n <= 1 + MAX_PROGRESS_POLLS for n in progress_polls.values()), (window, progress_polls)
        assert all(c["list"] == 0 for by in counted.values() for c in by.values()), (window, counted)
        if i < steady_from:
            continue
        stale = window - hp.windows.max_allowed_stale - 2  # the window a miner deletes (none before window 0)
        for actor in ("m1", "m2", "lead"):
            pages[actor] += counted[actor].get("data", Counter())["get"]
        for miner in ("m1", "m2"):
            for bucket in expected["miner"]:
                if bucket == "data":
                    continue  # next window's pages are read ahead in the background: counted over all windows
                got = Counter({op: counted[miner].get(bucket, Counter())[op] for op in OPERATIONS})
                if bucket == "own" and stale < 0:
                    got["delete"] += expected["miner"]["own"]["delete"]
                made_by[(miner, bucket)].update(got)
        got = Counter({op: counted["lead"].get("peers", Counter())[op] for op in OPERATIONS})
        assert got == expected["lead"]["peers"], (window, got)
        own = [r.op for r in requests[marks[i]:marks[i + 1]] if r.actor == "lead" and r.bucket.startswith("own:")
               and not r.key.startswith("v4/checkpoint/") and not (r.op in ("list", "delete") and r.key.startswith(upkeep))]
        # inputs, aggregate, peers, progress (each create-only), the index; its inputs, peers and index read
        assert Counter(own) == Counter(put=5, get=3), (window, own)
    steady = windows - steady_from
    # An overlapped miner's compute half of the next window (its sync check, its commitment) runs while this
    # window's exchange ends, on either side of a window's end on virtual time: counted over all windows.
    for (miner, bucket), got in made_by.items():
        ops = expected["miner"][bucket]
        assert all(abs(got[op] - steady * ops[op]) <= ops[op] for op in OPERATIONS), (miner, bucket, got, steady, ops)
    for actor, role in (("m1", "miner"), ("m2", "miner"), ("lead", "lead")):
        per_window = expected[role]["data"]["get"]  # a read-ahead may fall on either side of a window's end
        assert abs(pages[actor] - steady * per_window) <= per_window, (actor, pages[actor], steady, per_window)
    checkpoints = sum(r.key == "v4/checkpoint/latest.json" and r.op == "put" for r in requests)
    assert checkpoints >= 2 and lead_lists == 5 * checkpoints, (checkpoints, lead_lists)
