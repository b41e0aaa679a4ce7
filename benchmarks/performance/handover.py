"""The lead's hand-over delay (`handover_seconds`, docs/design.md §5): what publishing a window's inputs
takes, and what a dead lead costs each window with the chosen value.

    python -m benchmarks.performance.handover [--publishes 200] [--windows 3]

1. **Publication on a real SeaweedFS** (`weed mini` on 127.0.0.1, the bundled server): sign an inputs
   record naming the production top-G (15 digests), create it (the conditional PUT every history object
   now is), and read it back as a follower does; the wall time of each step, median, 99th percentile and
   maximum, against a plain overwriting PUT of the same bytes in the same process (the baseline).
2. **The protocol on virtual time** (in-process nodes running their real loops on `micro`: two validators,
   two miners, the test harness's 8.4 s windows, handover 0.5 s, settle 0.25 s, skew 0.5 s, the
   succession's order resuming every 4 windows): per window, when the inputs were stored after the
   gather started, and when a miner's outer step was done after the window ended; `--windows` windows
   with the lead, then the lead killed -9 (its task cancelled) for two cadences. Virtual time stands still
   while anything computes, so these are the protocol's own delays: the hand-over window and each
   boundary while the lead is dead wait for its slot to settle, the windows between are led by the
   successor in the first slot. Windows without an outer step are counted in both phases.

Prints JSON lines and writes benchmarks/results/handover.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "handover.json"
CADENCE = 4


def _summary(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {"median_ms": round(statistics.median(ordered) * 1e3, 2), "p99_ms": round(p99 * 1e3, 2),
            "max_ms": round(ordered[-1] * 1e3, 2), "n": len(ordered)}


async def _publish(server, publishes: int) -> dict:
    from bittensor.sp_core import Keypair

    from templar.comms import put_new
    from templar.comms.keys import inputs_key
    from templar.core.config import load_hparams
    from templar.storage import S3Bucket
    from templar.wire import Run, StepInputs, write_inputs

    hp = load_hparams(None)
    key = Keypair.create_from_uri("//Lead")
    run = Run(1, hp.digest())
    peers = tuple((Keypair.create_from_uri(f"//Miner{i}").ss58_address, bytes([i]) * 32) for i in range(hp.gauntlet.top_g))
    server.create_bucket("lead")
    writer = S3Bucket(server.endpoint_url, "lead", server.admin)
    reader = S3Bucket(server.endpoint_url, "lead", server.reader)
    sign, create, read, put = [], [], [], []
    try:
        for window in range(publishes):
            started = time.perf_counter()
            data = write_inputs(StepInputs(window, window, peers), hotkey=key.ss58_address, run=run, sign=key.sign)
            signed = time.perf_counter()
            assert await put_new(writer, inputs_key(window), data)
            created = time.perf_counter()
            assert await reader.get(inputs_key(window), max_bytes=1 << 20) == data
            seen = time.perf_counter()
            await writer.put(f"baseline/{window}", data)
            put.append(time.perf_counter() - seen)
            sign.append(signed - started)
            create.append(created - signed)
            read.append(seen - created)
    finally:
        await writer.aclose()
        await reader.aclose()
    total = [a + b for a, b in zip(sign, create, strict=True)]
    return {"case": "publish_inputs_seaweedfs", "record_bytes": len(data), "sign": _summary(sign),
            "create": _summary(create), "sign_and_create": _summary(total), "follower_read": _summary(read),
            "baseline_put": _summary(put),
            "create_over_put": round(statistics.median(create) / statistics.median(put), 2)}


def _protocol(root: Path, windows: int) -> dict:
    """Two validators and two miners on virtual time: `windows` windows with the lead, then two cadences
    with the lead killed; per window the inputs' stamp and a miner's step, against the landmarks."""
    from templar.chain import create_dev_chain
    from templar.core.clock import loop_time, run_virtual
    from templar.core.config import REPO_ROOT, load_hparams
    from templar.miner.loop import Miner
    from templar.runtime.flags import add_node_args
    from templar.runtime.node import start_node
    from templar.runtime.records import MINER_WINDOWS_FILE, add_listener, remove_listener
    from templar.validator.loop import Validator

    micro = REPO_ROOT / "tests" / "presets" / "micro.json"
    windows_cfg = {"blocks_per_window": 14, "block_time": 0.6, "put_window_seconds": 1.5, "clock_skew_seconds": 0.5,
                   "gather_seconds": 1.5, "windows_per_weights": 2, "checkpoint_frequency": 100,
                   "peer_replacement_frequency": 1, "warmup_windows": 1, "max_allowed_stale": 6,
                   "handover_seconds": 0.5, "handover_settle_seconds": 0.25, "lead_cadence": CADENCE}
    root.mkdir(parents=True, exist_ok=True)
    preset = root / "handover.json"
    preset.write_text(json.dumps({"base": str(micro), "name": "micro-handover",
                                  "data": {"pages_per_window": 1, "eval_pages": 1}, "windows": windows_cfg}))
    hp = load_hparams(preset)
    stakes = {"lead": 100.0, "v1": 50.0, "m0": 0.0, "m1": 0.0}
    create_dev_chain(root / "chain.sqlite", netuid=7, hotkeys=stakes, wallet_path=root / "wallets", wallet_name="b",
                     block_time=hp.windows.block_time, weights_rate_limit=2)
    steps: dict[int, float] = {}

    def on_record(path, record) -> None:
        if path.name == MINER_WINDOWS_FILE and path.parent.name == "m0" and record.peers_aggregated:
            steps[record.window] = asyncio.get_running_loop().time()

    async def node(name: str, role: str):
        parser = argparse.ArgumentParser()
        add_node_args(parser)
        (root / "buckets" / name).mkdir(parents=True, exist_ok=True)
        args = parser.parse_args([
            "--wallet.name", "b", "--wallet.hotkey", name, "--wallet.path", str(root / "wallets"), "--netuid", "7",
            "--subtensor.network", "embedded", "--subtensor.chain_endpoint", str(root / "chain.sqlite"),
            "--hparams", str(preset), "--device", "cpu", "--state.dir", str(root / "nodes" / name),
            "--bucket.locator", f"local:{root / 'buckets' / name}"])
        return await start_node(args, role, time=loop_time(), configure_logging=False)

    async def scenario():
        roles = {name: Validator(await node(name, "validator")) if stakes[name] else Miner(await node(name, "miner"))
                 for name in stakes}
        tasks = {name: asyncio.create_task(role.run(), name=name) for name, role in roles.items()}
        clock = roles["lead"].node.clock
        first = clock.current_window() + 3  # warm-up, then the first peer list
        killed = first + windows + (1 - first - windows) % CADENCE  # just after a boundary
        await clock.sleep_until(clock.times(killed).gather_start - 0.5)
        tasks["lead"].cancel()  # kill -9: nothing saved, nothing closed
        await asyncio.gather(tasks["lead"], return_exceptions=True)
        last = killed + 2 * CADENCE - 1
        await clock.sleep_until(clock.times(last + 1).end)
        for name in ("v1", "m0", "m1"):
            roles[name].node.stop.set()
        await asyncio.gather(*(tasks[n] for n in ("v1", "m0", "m1")), return_exceptions=True)
        times = {w: clock.times(w) for w in range(first, last + 1)}
        for role in roles.values():
            await role.node.aclose()
        return first, killed, last, times

    add_listener(on_record)
    try:
        first, killed, last, times = run_virtual(scenario())
    finally:
        remove_listener(on_record)

    def phase(ws: range, leader: str) -> dict:
        stored = {w: round((root / "buckets" / leader / f"v4/inputs/{w}.safetensors").stat().st_mtime
                           - times[w].gather_start, 3)
                  for w in ws if (root / "buckets" / leader / f"v4/inputs/{w}.safetensors").exists()}
        stepped = {w: round(steps[w] - times[w].end, 3) for w in ws if w in steps}
        return {"windows": [ws.start, ws.stop - 1], "led_by": leader, "inputs_stored_after_gather_start_s": stored,
                "step_done_after_window_end_s": stepped, "windows_without_a_step": [w for w in ws if w not in steps]}

    alive = phase(range(first, killed), "lead")
    dead = phase(range(killed, last + 1), "v1")
    usual = statistics.median(alive["step_done_after_window_end_s"].values())
    delays = {w: round(s - usual, 3) for w, s in dead["step_done_after_window_end_s"].items()}
    window_s = hp.windows.blocks_per_window * hp.windows.block_time
    t = times[first]
    return {"case": "dead_lead_virtual_time", "preset": hp.name, "window_s": window_s, "lead_cadence": CADENCE,
            "handover_s": hp.windows.handover_seconds, "settle_s": hp.windows.handover_settle_seconds,
            "skew_s": hp.windows.clock_skew_seconds, "alive": alive, "dead": dead,
            "step_delay_by_window_s": delays, "delayed_windows": [w for w, d in delays.items() if d > 0.1],
            "dead_lead_cost_per_window_s": round(statistics.mean(delays.values()), 3),
            "dead_lead_cost_share": round(statistics.mean(delays.values()) / window_s, 3),
            "slot0_settled_minus_gather_deadline_s": round(t.slot_settled(0) - t.gather_deadline, 3)}


def production_figures() -> dict:
    """What the chosen values mean at production's landmarks (hparams.json), from the same arithmetic."""
    from templar.core.config import load_hparams
    from templar.runtime.consensus.windows import Clock

    hp = load_hparams(None)
    w = hp.windows
    t = Clock(w, lambda: 0, lambda block: block * w.block_time).times(1)
    window = w.blocks_per_window * w.block_time
    return {"case": "production_landmarks", "window_s": window, "gather_deadline_after_end_s": t.gather_deadline - t.end,
            "slot_deadlines_after_end_s": [t.slot_deadline(k) - t.end for k in range(w.lead_slots)],
            "slot_settled_after_end_s": [t.slot_settled(k) - t.end for k in range(w.lead_slots)],
            "dead_lead_delay_s": t.slot_settled(0) - t.gather_deadline,
            "dead_lead_delay_share": round((t.slot_settled(0) - t.gather_deadline) / window, 3),
            "next_commit_close_after_end_s": t.commit_close + window - t.end}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--publishes", type=int, default=200)
    parser.add_argument("--windows", type=int, default=3, help="windows with the lead (then two cadences without)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from templar.storage.seaweed import SeaweedServer

    results = [production_figures()]
    with tempfile.TemporaryDirectory() as tmp:
        with SeaweedServer(Path(tmp) / "weed") as server:
            results.append(asyncio.run(_publish(server, args.publishes)))
        results.append(_protocol(Path(tmp) / "net", args.windows))
    for result in results:
        print(json.dumps(result), flush=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
