"""What one window costs a peer under a preset: tokens, FLOPs, GPU time, memory, network, disk.

Estimates, stated with their formulas so they can be checked:

* FLOPs per token, training: 6·N + 12·L·d·S (PaLM appendix B: weights, plus attention scores);
  evaluation (forward only) a third of that.
* GPU time: FLOPs / (peak · MFU); peak is the H100 SXM's dense bf16 989 TFLOP/s.
* Memory, per GPU and on the host, for each memory setting of the miner (`node_memory`, the one
  function `templar hparams`, docs/mining.md and `templar doctor` read): the arithmetic of
  `templar.core.memory` on the run's model, with the float32 copies of θ the run's settings keep
  (`state_copies`: error feedback, θ_t snapshot, AdamW moments, the outer rule's own state). A
  setting fits a GPU when its estimated peak is at most `USABLE_SHARE` of the GPU's memory. What a
  setting costs in time: the offload's host↔GPU bytes at `PCIE_BYTES_PER_SECOND`, checkpointing's
  recomputed forward (a third of the training FLOPs).
* Compute utilisation: training seconds (forward, backward, the inner optimizer) over the window's
  wall-clock seconds, the figure a miner paying for GPU-hours cares about (the miner's window record
  measures the same: `utilisation`). Beside it, the span a window leaves for training and the share
  of it training fills. A blocking miner (`inner.overlap` blocking) trains window w+1 from the moment
  it holds w's step (the gather starts at `gather_start` and takes the top-G payloads at
  `ASSUMED_BANDWIDTH` plus `ASSUMED_STEP_SECONDS` for the step) until its commitment is due
  (`commit_close`); at the least (a gather that runs to its deadline), from the gather deadline. An
  overlapped miner trains w+1 from w's commitment to w+1's, the whole window, while w's put window,
  gather and step run; the GPU stops training only for its other work (`gpu_overhead_seconds`:
  compressing the update, the outer step, the state file's copy off the GPU). A validator evaluates
  within its window.
* Network: pages in (ranged GETs), one compressed gradient out, the top-G gradients in
  (the wire format's upper bound `max_gradient_bytes`); validators read `fast_eval_uids`.
* Disk: the window's pages land in the page cache (bounded by --data.cache_gb); the state file
  (θ and the float32 copies the node saves), twice while it is replaced, and a checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from templar.core.config import HParams, overlapped
from templar.core.memory import (
    GIB,
    SETTINGS,
    MemorySettings,
    ModelShape,
    NodeMemory,
    StateCopies,
    node_memory,
)

H100_BF16_FLOPS = 989e12
PEAK_BF16_FLOPS = {  # dense bf16 tensor-core peaks (vendor data sheets), by a substring of the device name
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": H100_BF16_FLOPS,   # SXM (HBM3), the sizing table's reference
    "H200": H100_BF16_FLOPS,   # same compute as the H100 SXM, more memory
    "A100": 312e12,
}
DEFAULT_MFU = 0.40
ASSUMED_BANDWIDTH = 125e6
"""Bytes per second a miner downloads the top-G payloads at (1 Gbit/s)."""
ASSUMED_STEP_SECONDS = 1.0
"""The outer step over the top-G on a GPU (decode, aggregate, apply)."""
ASSUMED_COMPRESS_SECONDS = 1.0
"""The DeMo step over the whole model on a GPU (each chunk's transform and top-k, the error feedback
updated): what a window's compute half does after its inner steps, before the next window's begin."""
CARDS_GB = (24, 40, 80)
"""The GPU sizes the memory table answers for, as sold (GiB of memory: 24 GB is 25.8 × 10⁹ bytes)."""
USABLE_SHARE = 0.90
"""The share of a GPU's memory a node's estimated peak may take: the rest is the CUDA context,
cuBLAS workspaces and the allocator's fragmentation."""
PCIE_BYTES_PER_SECOND = 25e9
"""Host↔GPU bytes per second from pinned memory over PCIe 4.0 ×16 (about 80 % of its 32 GB/s; PCIe
5.0 doubles it): what the offload's transfers cost."""
TORCHRUN_RANKS = (2,)
"""Rank counts the memory table adds for a miner under torchrun (FSDP2: per GPU)."""


SHAPES: dict[str, ModelShape] = {
    # the LLaMA-3 8B and 70B shapes, with the run's other settings (`templar hparams --ranks`)
    "8B": ModelShape(vocab=128256, hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, tied=False),
    "70B": ModelShape(vocab=128256, hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672, tied=False),
}


def state_copies(hp: HParams, role: str) -> StateCopies:
    """The float32 copies of θ a `role` node keeps under the run's settings (the outer rule's own
    state from `OuterRule.state_copies`)."""
    from templar.compress.methods import rule_of

    return StateCopies.of(role, inner_optimizer=hp.inner.optimizer, inner_steps=hp.inner.steps,
                          outer=rule_of(hp.optimizer.method).state_copies, overlap=hp.inner.overlap)


def model_memory(hp: HParams, role: str, setting: MemorySettings = SETTINGS[0], ranks: int = 1, *,
                 shape: ModelShape | None = None) -> NodeMemory:
    """The memory of a `role` node of this run under `setting` over `ranks` GPUs: the one function
    behind the memory tables (`templar hparams`, docs/mining.md) and `templar doctor`'s GPU check.
    `shape`: another model trained with the run's other settings (`SHAPES`)."""
    g = hp.gauntlet
    gathered = g.top_g + (g.fast_eval_uids if role != "miner" else 0)  # the peer list; a validator's F_t too
    return node_memory(shape or ModelShape.of(hp.model), state_copies(hp, role), role=role, setting=setting,
                       ranks=ranks, micro_batch=hp.optimizer.micro_batch_size, seq=hp.data.sequence_length,
                       inner_steps=hp.inner.steps, gathered=gathered,
                       kept_share=hp.demo.topk / hp.demo.target_chunk ** 2)


def usable_bytes(gpu_bytes: float) -> float:
    return USABLE_SHARE * gpu_bytes


def fits(memory: NodeMemory, gpu_bytes: float) -> bool:
    return memory.gpu_bytes <= usable_bytes(gpu_bytes)


def recommend(hp: HParams, role: str, gpu_bytes: float, ranks: int = 1) -> NodeMemory | None:
    """The first memory setting (cheapest in time) whose peak fits a GPU of `gpu_bytes`; None when
    none does. A validator's memory does not depend on the settings (they are the miner's)."""
    for setting in SETTINGS if role == "miner" else SETTINGS[:1]:
        memory = model_memory(hp, role, setting, ranks)
        if fits(memory, gpu_bytes):
            return memory
    return None


def fewest_ranks(hp: HParams, role: str, gpu_bytes: float, setting: MemorySettings, most: int = 64) -> int | None:
    """The fewest torchrun ranks whose per-GPU peak fits a GPU of `gpu_bytes` under `setting`."""
    ranks = 2
    while ranks <= most:
        if fits(model_memory(hp, role, setting, ranks), gpu_bytes):
            return ranks
        ranks *= 2
    return None


def setting_seconds(memory: NodeMemory, train_seconds: float) -> tuple[float, float]:
    """What a setting adds to a window, per GPU: (host↔GPU transfer at `PCIE_BYTES_PER_SECOND`, the
    recomputed forward of checkpointing, a share of `train_seconds` spread over the ranks)."""
    return memory.transfer_bytes / PCIE_BYTES_PER_SECOND, memory.recompute_share * train_seconds / memory.ranks


def state_file_bytes(hp: HParams, role: str) -> float:
    """The node's `state.safetensors`: θ and the float32 copies it saves (the same under every setting)."""
    return 4 * ModelShape.of(hp.model).parameters * (1 + state_copies(hp, role).saved)


def node_disk_bytes(hp: HParams, role: str) -> float:
    """The node's own disk: its state file twice (the new one is written before the old one goes;
    `.prev` is a hard link), the lead's checkpoint downloaded to join, and for a validator that may
    lead, the checkpoint it publishes."""
    theta = 4 * ModelShape.of(hp.model).parameters
    return 2 * state_file_bytes(hp, role) + theta + (theta if role == "validator" else 0)


def ranks_table(hp: HParams, ranks: Sequence[int]) -> str:
    """A miner's memory per GPU at each rank count (1: one process; more: torchrun, FSDP2), for the
    run's model and for the 8B and 70B shapes trained with the run's other settings, as markdown
    (`templar hparams --ranks`, docs/mining.md §12)."""
    mb, seq = hp.optimizer.micro_batch_size, hp.data.sequence_length
    lines = [f"Miner memory per GPU in GB (micro-batch {mb} × {seq} tokens, bf16 compute, float32 θ; host memory "
             "per node):", "",
             "| model | params | GPUs | θ | gradients | error feedback | θ_t snapshot + working model + AdamW moments | "
             "activations and transients (peak) | sum | with checkpointing | offload + checkpointing: GPU, host |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, shape in [(hp.name, ModelShape.of(hp.model)), *SHAPES.items()]:
        for n in ranks:
            m, both = (model_memory(hp, "miner", setting, n, shape=shape) for setting in (SETTINGS[0], SETTINGS[2]))
            checkpointed = model_memory(hp, "miner", MemorySettings(checkpoint_activations=True), n, shape=shape)
            g = {k: v / 1e9 for k, v in m.gpu.items()}
            kept = g.get("θ_t snapshot", 0.0) + g.get("working model (overlap)", 0.0) + g.get("AdamW moments", 0.0)
            lines.append(f"| {name} | {shape.parameters / 1e9:.2f} B | {n} | {g['θ']:.2f} | {g['gradients']:.2f} | "
                         f"{g.get('error feedback', 0.0):.2f} | {kept:.2f} | "
                         f"{g['activations and transients (peak)']:.2f} | **{m.gpu_bytes / 1e9:.1f}** | "
                         f"{checkpointed.gpu_bytes / 1e9:.1f} | {both.gpu_bytes / 1e9:.1f}, {both.host_bytes / 1e9:.0f} |")
    return "\n".join(lines)


def memory_rows(hp: HParams, train_seconds: float) -> list[dict[str, Any]]:
    """The memory table: the miner under each setting on one GPU and on `TORCHRUN_RANKS`, and the
    validator, with what each fits and costs."""
    out = []
    cases = [("miner", s, r) for r in (1, *TORCHRUN_RANKS) for s in SETTINGS] + [("validator", SETTINGS[0], 1)]
    for role, setting, ranks in cases:
        m = model_memory(hp, role, setting, ranks)
        transfer_s, recompute_s = setting_seconds(m, train_seconds)
        out.append({"role": role, "ranks": ranks, "setting": setting.name if role == "miner" else "any",
                    "flags": list(setting.flags) if role == "miner" else [],
                    "gpu_gb": m.gpu_bytes / 1e9, "host_gb": m.host_bytes / 1e9,
                    "gpu_parts_gb": {k: v / 1e9 for k, v in m.gpu.items()},
                    "host_parts_gb": {k: v / 1e9 for k, v in m.host.items()},
                    "fits": {gb: fits(m, gb * GIB) for gb in CARDS_GB},
                    "transfer_gb": m.transfer_bytes / 1e9, "transfer_seconds": transfer_s,
                    "recompute_seconds": recompute_s})
    return out


def gpu_overhead_seconds(hp: HParams) -> float:
    """GPU seconds a window spends outside its inner steps that an overlapped miner cannot hide behind
    the exchange: compressing its update (`ASSUMED_COMPRESS_SECONDS`), the outer step over the top-G
    (`ASSUMED_STEP_SECONDS`) and copying the state file off the GPU (at `PCIE_BYTES_PER_SECOND`; the
    disk write runs beside the training). The outer step and the copy run between two inner steps."""
    return ASSUMED_COMPRESS_SECONDS + ASSUMED_STEP_SECONDS + state_file_bytes(hp, "miner") / PCIE_BYTES_PER_SECOND


def compute_span(hp: HParams, gradient_bytes: int, *, gather_to_deadline: bool = False) -> float:
    """Seconds a window leaves a miner for its inner steps (`templar.runtime.consensus.windows`' landmarks).
    Blocking: from holding the previous window's step to the commitment deadline (commit_close −
    gather_start, measured from the previous window's end, minus the gather and the step);
    `gather_to_deadline`: the least it leaves, when the gather runs until its deadline
    (`gather_seconds`). Overlapped: from the previous window's commitment to this one's, the whole
    window, less the GPU's other work (`gpu_overhead_seconds`); the gather's length does not enter
    (the step lands before this window's payload is due: `exchange_slack`)."""
    from templar.runtime.consensus.windows import window_times

    w = hp.windows
    window_s = w.window_seconds
    if overlapped(hp.inner):
        return max(0.0, window_s - gpu_overhead_seconds(hp))
    previous, this = window_times(w, -1, -window_s, 0.0), window_times(w, 0, 0.0, window_s)
    if gather_to_deadline:
        gather = w.gather_seconds
    else:
        gather = hp.gauntlet.top_g * gradient_bytes / ASSUMED_BANDWIDTH + ASSUMED_STEP_SECONDS
    return max(0.0, this.commit_close - previous.gather_start - gather)


def exchange_slack(hp: HParams) -> float:
    """Seconds between the latest a window's outer step lands (its apply deadline) and the next
    window's commitment deadline: an overlapped miner encodes the next window's payload after the
    step (eager: against it), so this must be positive."""
    from templar.runtime.consensus.windows import window_times

    w = hp.windows
    window_s = w.window_seconds
    previous, this = window_times(w, -1, -window_s, 0.0), window_times(w, 0, 0.0, window_s)
    return this.commit_close - previous.apply_deadline


def window_sizing(hp: HParams, *, mfu: float = DEFAULT_MFU) -> dict[str, Any]:
    """The figures of `templar hparams` (and the sizing table of docs/mining.md)."""
    from templar.wire import max_aggregate_bytes, max_bundle_bytes, max_gradient_bytes

    shape = ModelShape.of(hp.model)  # the model's schema without building it (transformers: 3 s of CPU)
    n = shape.parameters
    shapes = shape.parameter_shapes()
    grad_bytes = max_gradient_bytes(shapes, hp)
    # the lead's published update of a window: a signed run's packed signs; a SparseLoCo run's bundle
    # of the top-G payloads it aggregated (templar.wire.bundle)
    aggregate_bytes = max_aggregate_bytes(shapes) if hp.optimizer.method == "signed" else max_bundle_bytes(shapes, hp)
    m, d = hp.model, hp.data
    seq, layers, width = d.sequence_length, m.num_hidden_layers, m.hidden_size
    page_tokens = d.sequence_length * d.sequences_per_page
    page_bytes = page_tokens * (2 if m.vocab_size <= 1 << 16 else 4)
    tokens = d.pages_per_window * page_tokens
    train_per_token = 6 * n + 12 * layers * width * seq
    fwd_per_token = train_per_token / 3
    train_flops = train_per_token * tokens
    window_s = hp.windows.window_seconds
    # LossScore: random pages before (shared) and after each peer's step, assigned pages before and after.
    eval_pages = hp.data.eval_pages
    eval_tokens = page_tokens * (eval_pages + hp.gauntlet.uids_per_window * 3 * eval_pages + hp.data.holdout_eval_pages)
    eval_flops = fwd_per_token * eval_tokens
    train_s = train_flops / (H100_BF16_FLOPS * mfu)
    eval_s = eval_flops / (H100_BF16_FLOPS * mfu)
    span = compute_span(hp, grad_bytes)
    memory = memory_rows(hp, train_s)
    blocking = hp.model_copy(update={"inner": hp.inner.model_copy(update={"overlap": "blocking"})})
    return {
        "parameters": n,
        "page_tokens": page_tokens,
        "page_bytes": page_bytes,
        "tokens_per_window_per_peer": tokens,
        "window_seconds": window_s,
        "train_flops_per_window": train_flops,
        "mfu_assumed": mfu,
        "h100_train_seconds": train_s,
        "inner_steps": hp.inner.steps,
        "inner_optimizer": hp.inner.optimizer,
        "tokens_per_inner_step": tokens // hp.inner.steps,
        "overlap": hp.inner.overlap,
        "miner_compute_span_seconds": span,
        "miner_compute_span_min_seconds": compute_span(hp, grad_bytes, gather_to_deadline=True),
        "miner_compute_utilisation": min(train_s, span) / window_s,
        "miner_span_share": min(1.0, train_s / span) if span > 0 else 0.0,
        "miner_fits_span": train_s <= span,
        "miner_gpu_overhead_seconds": gpu_overhead_seconds(hp),
        "miner_blocking_span_seconds": compute_span(blocking, grad_bytes),
        "exchange_slack_seconds": exchange_slack(hp),
        "miner_sustained_tflops_needed": train_flops / span / 1e12 if span > 0 else float("inf"),
        "validator_eval_tokens_per_window": eval_tokens,
        "validator_eval_flops_per_window": eval_flops,
        "h100_validator_eval_seconds": eval_s,
        "validator_compute_utilisation": min(1.0, eval_s / window_s),
        "miner_gpu_memory_gb": memory[0]["gpu_gb"],   # the default setting, one GPU
        "validator_gpu_memory_gb": memory[-1]["gpu_gb"],
        "memory": memory,
        "usable_share": USABLE_SHARE,
        "pcie_gb_per_second": PCIE_BYTES_PER_SECOND / 1e9,
        "miner_state_file_gb": state_file_bytes(hp, "miner") / 1e9,
        "validator_state_file_gb": state_file_bytes(hp, "validator") / 1e9,
        "miner_disk_gb": node_disk_bytes(hp, "miner") / 1e9,
        "validator_disk_gb": node_disk_bytes(hp, "validator") / 1e9,
        "gradient_upload_max_mb": grad_bytes / 1e6,
        "aggregate_upload_max_mb": aggregate_bytes / 1e6,
        "miner_download_mb_per_window": (d.pages_per_window * page_bytes + hp.gauntlet.top_g * grad_bytes) / 1e6,
        # distinct pages: one assigned set per evaluated peer and the random set (held-out: once, at start)
        "validator_pages_mb_per_window": (hp.gauntlet.uids_per_window + 1) * eval_pages * page_bytes / 1e6,
        "validator_download_mb_per_window": ((hp.gauntlet.uids_per_window + 1) * eval_pages * page_bytes
                                             + hp.gauntlet.fast_eval_uids * grad_bytes) / 1e6,
        "page_cache_mb_per_window": d.pages_per_window * page_bytes / 1e6,
    }


def format_sizing(s: dict[str, Any]) -> str:
    """A human table of `window_sizing`."""
    rows = [
        ("parameters", f"{s['parameters'] / 1e9:.3f} B"),
        ("page", f"{s['page_tokens']:,} tokens ({s['page_bytes'] / 1024:.0f} KiB)"),
        ("tokens per window per peer", f"{s['tokens_per_window_per_peer']:,}"),
        ("window", f"{s['window_seconds']:.0f} s"),
        ("training FLOPs per window", f"{s['train_flops_per_window']:.3g}"),
        (f"H100 training time at {s['mfu_assumed']:.0%} MFU", f"{s['h100_train_seconds']:.2f} s"),
        ("inner steps", f"{s['inner_steps']} × {s['tokens_per_inner_step']:,} tokens ({s['inner_optimizer']})"),
        ("miner compute utilisation", f"{s['miner_compute_utilisation']:.0%} of the window's wall-clock (training "
                                      f"seconds over the window's; {s['overlap']} exchange)"),
        ("span a window leaves for training", _span(s)),
        ("sustained training throughput needed", f"{s['miner_sustained_tflops_needed']:.0f} TFLOP/s"),
        ("validator eval tokens per window", f"{s['validator_eval_tokens_per_window']:,}"),
        (f"H100 validator eval time at {s['mfu_assumed']:.0%} MFU", f"{s['h100_validator_eval_seconds']:.2f} s"),
        ("validator compute utilisation", f"{s['validator_compute_utilisation']:.0%} of the window"),
        ("state file, miner / validator", f"{s['miner_state_file_gb']:.1f} / {s['validator_state_file_gb']:.1f} GB "
                                          f"(node disk {s['miner_disk_gb']:.1f} / {s['validator_disk_gb']:.1f} GB)"),
        ("upload per window (gradient, max)", f"{s['gradient_upload_max_mb']:.2f} MB"),
        ("download per window, miner / validator",
         f"{s['miner_download_mb_per_window']:.1f} / {s['validator_download_mb_per_window']:.1f} MB"),
        ("page cache growth per window", f"{s['page_cache_mb_per_window']:.2f} MB"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows) + "\n\n" + format_memory(s)


def _span(s: dict[str, Any]) -> str:
    """The span a window leaves for training, and what bounds it."""
    share = f"{s['miner_compute_span_seconds']:.1f} s, training fills {s['miner_span_share']:.0%}" + (
        "" if s["miner_fits_span"] else " (too much for it: the commitment would be late)")
    if s["overlap"] == "blocking":
        return f"{share} ({s['miner_compute_span_min_seconds']:.2f} s if the gather runs to its deadline)"
    return (f"{share} (the window less the GPU's other work, {s['miner_gpu_overhead_seconds']:.1f} s; a blocking "
            f"exchange would leave {s['miner_blocking_span_seconds']:.1f} s; the step lands at the latest "
            f"{s['exchange_slack_seconds']:.1f} s before the next payload is due)")


def _fits(row: dict[str, Any]) -> str:
    return " / ".join("yes" if row["fits"][gb] else "no" for gb in CARDS_GB)


def _added(row: dict[str, Any]) -> str:
    parts = []
    if row["transfer_gb"]:
        parts.append(f"{row['transfer_seconds']:.1f} s host↔GPU ({row['transfer_gb']:.0f} GB)")
    if row["recompute_seconds"]:
        parts.append(f"{row['recompute_seconds']:.1f} s recompute")
    return " + ".join(parts) or "none"


def format_memory(s: dict[str, Any]) -> str:
    """The memory table of `window_sizing` for a terminal."""
    cards = " / ".join(str(gb) for gb in CARDS_GB)
    lines = [f"  memory (GB; GPU per GPU, host per node; fits: estimated peak within {s['usable_share']:.0%} of a "
             f"{cards} GB GPU; added per window: H100 at {s['mfu_assumed']:.0%} MFU, PCIe at "
             f"{s['pcie_gb_per_second']:.0f} GB/s)",
             f"  {'node':<10} {'GPUs':>4}  {'setting':<24} {'GPU':>6} {'host':>6}  {'fits ' + cards:<18} added per window"]
    for row in s["memory"]:
        lines.append(f"  {row['role']:<10} {row['ranks']:>4}  {row['setting']:<24} {row['gpu_gb']:>6.1f} "
                     f"{row['host_gb']:>6.1f}  {_fits(row):<18} {_added(row)}")
    lines.append("  flags: " + "; ".join(f"{row['setting']}: {' '.join(row['flags'])}" for row in s["memory"][1:3]))
    return "\n".join(lines)


def memory_markdown(s: dict[str, Any]) -> str:
    """The memory table of `window_sizing` as docs/mining.md carries it (tests/tools/test_sizing.py
    compares the two)."""
    cards = " / ".join(str(gb) for gb in CARDS_GB)
    lines = [f"| node | GPUs | setting (flags) | GPU memory, per GPU | host memory | fits {cards} GB | "
             "added per window |", "|---|---|---|---|---|---|---|"]
    for row in s["memory"]:
        gpus = f"{row['ranks']}" + (" (torchrun)" if row["ranks"] > 1 else "")
        flags = " ".join(f"`{f}`" for f in row["flags"])
        setting = f"{row['setting']} ({flags})" if flags else row["setting"]
        lines.append(f"| {row['role']} | {gpus} | {setting} | {row['gpu_gb']:.1f} GB | {row['host_gb']:.1f} GB | "
                     f"{_fits(row)} | {_added(row)} |")
    return "\n".join(lines)
