"""A miner window's computation on 1 vs 2 ranks (torchrun, gloo, CPU): wall time and time in collectives.

    python -m benchmarks.performance.distributed            # 6 timed windows per run, after 1 warm-up window
    python -m benchmarks.performance.distributed --quick    # 3 timed windows
    python -m benchmarks.performance.distributed --one-process 40   # only: 1-process node vs the plain functions, 40 windows

Launches `torch.distributed.run` twice (1 rank with 2 threads, 2 ranks with 1 thread each: the
same 2 cores), each running `templar.distributed.compute.NodeCompute` exactly as a miner does:
rank 0 builds the batch of the window's 2 assigned pages (tiny preset, offline corpus) and drives
train → compress (DeMo split by parameter) → probes → encode → outer step over G=4 peers' payloads
→ state save; rank 1 follows. In the 1-rank run the plain 1-process code, as it ran before the node
went through the compute interface (plain model, `accumulate_gradients`, `DeMo`, `outer_step`,
`save_node_state` called directly), runs the same windows in the same process as the baseline (no
FSDP), alternating window by window with what `python neurons/miner.py` runs now (`LocalCompute`,
the same functions behind the node's compute interface: the "node" column, which must equal the
baseline within noise). Reports per-phase medians, the window's wall time, the seconds rank 0 spent inside
collectives (waiting for the other rank included), and the ratios in one table.

On 2 shared CPU cores a second rank brings no speed (the tiny model is communication-bound and the
two ranks split the same two cores); the figures show what the distributed machinery costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks._common import emit, load_tiny, median, setup_torch, write_result
from templar.compress import DCTCompressor, DeMo
from templar.core.config import REPO_ROOT
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.runtime.consensus.outer import collect_probes, outer_step
from templar.runtime.state import NodeState, save_node_state
from templar.runtime.train import accumulate_gradients, gradients
from templar.wire import Gradient, Run, write_gradient

PHASES = ("train", "compress", "probes", "encode", "outer", "save")

RUN = Run(netuid=0, digest="0" * 64)  # the run these payloads are signed for


def _peers(sent, window: int, step: int) -> list[Gradient]:
    return [Gradient(window=window, global_step=step, hotkey=f"peer{i}", warmup=False, tensors=sent, probes={},
                     digest=b"", nbytes=0) for i in range(4)]


class Laps:
    """Seconds between successive `lap(name)` calls, by name."""

    def __init__(self) -> None:
        self.start = self.last = time.perf_counter()
        self.t: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.t[name], self.last = now - self.last, now


def _nosign(message: bytes) -> bytes:
    return b"\x00" * 64


def _compute_window(compute, tiny, window: int, state: NodeState, path: Path, group=None) -> dict[str, float]:
    """One miner window through a `templar.runtime.compute.Compute` (the ops `Miner.run_window` calls)."""
    hp = tiny.hp
    batch = tiny.pages.batch(tiny.plan.assigned_pages(0, window, hp.data.pages_per_window))
    laps, comm0 = Laps(), group.comm_seconds if group is not None else 0.0
    lap, t, start = laps.lap, laps.t, laps.start
    stats = compute.train(batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip,
                          learning_rate(state.global_step, hp.optimizer))
    lap("train")
    sent = compute.compress(stats.scale)
    lap("compress")
    probes = compute.probes(window)
    lap("probes")
    write_gradient(sent, probes, window=window, global_step=state.global_step, hotkey="h", hp=hp, run=RUN, sign=_nosign)
    lap("encode")
    compute.outer_step(_peers(sent, window, state.global_step), state, keep_signs=False)
    lap("outer")
    state.window = window
    compute.save_state(path, state)
    lap("save")
    t["window"] = time.perf_counter() - start
    t["collectives"] = group.comm_seconds - comm0 if group is not None else 0.0
    return t


def worker(windows: int, out: Path) -> None:
    from templar.distributed.compute import NodeCompute
    from templar.distributed.group import init_group

    group = init_group("cpu")
    torch.set_num_threads(max(1, 2 // group.world_size))
    if not group.is_leader:
        NodeCompute.join(group).follow()
        gc.collect()  # the sharded model (and FSDP's mesh holding the group) before the group
        group.close()
        return
    setup_torch()
    torch.set_num_threads(max(1, 2 // group.world_size))
    tiny = load_tiny()
    hp = tiny.hp
    compute = NodeCompute.lead(build_model(hp), hp, group, role="miner")
    state = NodeState(window=-1, global_step=0)
    tmp = Path(tempfile.mkdtemp())
    rows = []
    for window in range(windows + 1):
        t = _compute_window(compute, tiny, window, state, tmp / "state.safetensors", group)
        if window:  # the first window warms up
            rows.append(t)
    compute.stop()
    result = {"ranks": group.world_size, "fsdp": {k: median([r[k] for r in rows]) for k in rows[0]}}
    if group.world_size == 1:
        base_rows, node_rows = _one_process(tiny, windows, tmp)
        result["baseline"], result["node"] = _medians(base_rows), _medians(node_rows)
    out.write_text(json.dumps(result))
    group.close()


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: median([r[k] for r in rows]) for k in rows[0]}


def _one_process(tiny, windows: int, tmp: Path) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """The plain 1-process code (plain model, the functions called directly) and what
    `python neurons/miner.py` runs now (the node's `LocalCompute`), window by window in
    alternating order, so the machine's drift falls on both alike."""
    from templar.runtime.compute import LocalCompute

    hp = tiny.hp
    compute = LocalCompute(build_model(hp), hp)
    compute.enable_error_feedback()
    node_state = NodeState(window=-1, global_step=0)
    base_rows, node_rows = [], []
    run_base = _baseline(tiny, tmp)
    for window in range(windows + 1):
        order = (0, 1) if window % 2 else (1, 0)
        for which in order:
            if which == 0:
                t = next(run_base)
                if window:
                    base_rows.append(t)
            else:
                t = _compute_window(compute, tiny, window, node_state, tmp / "node.safetensors")
                if window:
                    node_rows.append(t)
    return base_rows, node_rows


def one_process_only(windows: int) -> None:
    """`--one-process`: only the 1-process comparison (the plain functions vs the node's `LocalCompute`),
    in this process, over many windows: medians and the median of the paired per-window ratios."""
    setup_torch()
    torch.set_num_threads(2)
    tiny = load_tiny()
    with tempfile.TemporaryDirectory() as tmp:
        base_rows, node_rows = _one_process(tiny, windows, Path(tmp))
    base, node = _medians(base_rows), _medians(node_rows)
    paired = {k: median([n[k] / b[k] for b, n in zip(base_rows, node_rows, strict=True) if b[k]])
              for k in base if base[k]}
    print(f"{'phase':<12}{'1 process (plain)':>22}{'1 process (node)':>18}{'node/plain':>12}{'paired':>9}")
    for phase in (*PHASES, "window"):
        print(f"{phase:<12}{base[phase]:>20.4f} s{node[phase]:>16.4f} s{node[phase] / base[phase]:>12.3f}"
              f"{paired[phase]:>9.3f}")
    record = {"benchmark": "distributed_one_process", "windows": windows, "baseline_1_process": base,
              "node_1_process": node, "window_ratio_node_vs_baseline": node["window"] / base["window"],
              "window_paired_ratio_median": paired["window"]}
    emit(record)
    write_result("distributed_one_process.json", record)


def _baseline(tiny, tmp: Path):
    """The plain 1-process code on successive windows (no FSDP, no process group, no compute
    interface): yields each window's laps."""
    hp = tiny.hp
    model = build_model(hp)
    demo = DeMo(model, compressor=DCTCompressor(hp.demo.target_chunk, hp.demo.topk), decay=hp.demo.momentum_decay)
    state = NodeState(window=-1, global_step=0)
    window = 0
    while True:
        batch = tiny.pages.batch(tiny.plan.assigned_pages(0, window, hp.data.pages_per_window))
        laps = Laps()
        lap, t, start = laps.lap, laps.t, laps.start

        accumulate_gradients(model, batch, hp.optimizer.micro_batch_size, hp.optimizer.grad_clip)
        lap("train")
        sent = demo.step(gradients(model), learning_rate(state.global_step, hp.optimizer))
        model.zero_grad(set_to_none=True)
        lap("compress")
        probes = collect_probes(model, window, hp)
        lap("probes")
        write_gradient(sent, probes, window=window, global_step=state.global_step, hotkey="h", hp=hp, run=RUN, sign=_nosign)
        lap("encode")
        outer_step(model, _peers(sent, window, state.global_step), state, hp)
        lap("outer")
        state.window = window
        save_node_state(tmp / "plain.safetensors", model, demo.buffers, state)
        lap("save")
        t["window"] = time.perf_counter() - start
        t["collectives"] = 0.0
        yield t
        window += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--one-process", type=int, default=0, metavar="WINDOWS",
                        help="only compare the 1-process node with the plain functions, over this many windows")
    parser.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--windows", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    windows = args.windows or (3 if args.quick else 6)
    if args.worker:
        worker(windows, args.worker)
        return
    if args.one_process:
        one_process_only(args.one_process)
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    runs = {}
    for ranks in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.json"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
                   "-m", __spec__.name, "--worker", str(out), "--windows", str(windows)]
            subprocess.run(cmd, env=env, check=True, cwd=REPO_ROOT, stdout=subprocess.DEVNULL)
            runs[ranks] = json.loads(out.read_text())
    base, node, one, two = runs[1]["baseline"], runs[1]["node"], runs[1]["fsdp"], runs[2]["fsdp"]
    print(f"{'phase':<12}{'1 process (plain)':>22}{'1 process (node)':>18}{'1 rank FSDP':>14}{'2 ranks FSDP':>15}"
          f"{'node/plain':>12}{'1 rank/plain':>14}{'2 ranks / 1 rank':>18}")
    for phase in (*PHASES, "window", "collectives"):
        ratio_n = node[phase] / base[phase] if base[phase] else float("nan")
        ratio_a = one[phase] / base[phase] if base[phase] else float("nan")
        ratio_b = two[phase] / one[phase] if one[phase] else float("nan")
        print(f"{phase:<12}{base[phase]:>20.4f} s{node[phase]:>16.4f} s{one[phase]:>12.4f} s{two[phase]:>13.4f} s"
              f"{ratio_n:>12.2f}{ratio_a:>14.2f}{ratio_b:>18.2f}")
    record = {"benchmark": "distributed", "windows": windows, "baseline_1_process": base, "node_1_process": node,
              "fsdp_1_rank": one, "fsdp_2_ranks": two,
              "window_ratio_node_vs_baseline": node["window"] / base["window"],
              "window_ratio_1rank_vs_baseline": one["window"] / base["window"],
              "window_ratio_2ranks_vs_1rank": two["window"] / one["window"],
              "collective_share_2ranks": two["collectives"] / two["window"]}
    emit(record)
    write_result("distributed_quick.json" if args.quick else "distributed.json", record)


if __name__ == "__main__":
    main()
