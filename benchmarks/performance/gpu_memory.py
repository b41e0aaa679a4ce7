"""The memory phase of `benchmarks/performance/gpu.py`: each memory setting's peak, seconds and bit-identity."""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.performance.gpu_bench import MEMORY_STEPS, Bench, free_memory
from templar.compress import DeMo
from templar.runtime.train import gradients, inner_lr, inner_steps, make_inner_optimizer


def _sent_difference(sent: dict[str, tuple[torch.Tensor, torch.Tensor]],
                     reference: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, Any]:
    """How far one update (indices, values per tensor) is from another: tensors whose kept sets or
    values differ, and the largest value difference over the largest value."""
    tensors = values = 0
    worst = 0.0
    for n, (idx, val) in reference.items():
        same_idx = torch.equal(sent[n][0], idx)
        same_val = torch.equal(sent[n][1], val)
        tensors += not (same_idx and same_val)
        if same_idx and not same_val:
            values += 1
            scale = float(val.abs().max()) or 1.0
            worst = max(worst, float((sent[n][1] - val).abs().max()) / scale)
    return {"identical": tensors == 0, "tensors_differing": tensors, "of_tensors": len(reference),
            "values_only": values, "largest_value_gap_over_max": worst}


def phase_memory(b: Bench) -> dict[str, Any]:
    """The miner's peak GPU memory under each memory setting (`templar.core.memory.SETTINGS`), beside
    the sizing table's estimate, and whether every setting sends the default's update bit for bit on
    this device. Each setting runs what the node runs (`inner_steps` with its inner AdamW, streamed
    or not, then the DeMo step) from the same θ and zeroed state, over `MEMORY_STEPS` inner steps of
    one micro-batch each: a window's peak is one micro-batch's forward and backward, or one step, so
    more steps would only cost time; `torch.cuda.max_memory_allocated` is reset before each.

    Each setting runs twice: the first run's peak (and its seconds, which pay for allocating the
    pinned host buffers once), the second's seconds (what every later window costs). The fast
    kernels a GPU node runs are not all deterministic (flash attention's backward, some reductions),
    so the default is compared with its own repeat; then the bit-identity claim is checked where it
    can hold on a GPU: every setting again, one sequence per step, under
    `torch.use_deterministic_algorithms` and the math attention kernel."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from templar.compress.methods import rule_of
    from templar.core.memory import SETTINGS
    from templar.core.model import checkpoint_activations
    from templar.runtime.offload import HostStore
    from templar.tools.sizing import PCIE_BYTES_PER_SECOND, model_memory

    hp, model = b.hp, b.model()
    b.release_demo()
    model.zero_grad(set_to_none=True)
    mb = hp.optimizer.micro_batch_size
    inner = hp.inner.model_copy(update={"steps": MEMORY_STEPS})
    batch = torch.randint(0, hp.model.vocab_size, (MEMORY_STEPS * mb, hp.data.sequence_length),
                          generator=torch.Generator().manual_seed(7))
    rule = rule_of(hp.optimizer.method)

    def run(setting: Any, sequences: int) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], float, float]:
        b.restore_theta0()  # every setting from the same θ
        checkpoint_activations(model, setting.checkpoint_activations)
        free_memory()
        b.reset_peak()
        demo = DeMo(model, compressor=rule.compressor(hp.demo.target_chunk, hp.demo.topk),
                    decay=hp.demo.momentum_decay, offload=setting.offload)
        optimizer = make_inner_optimizer(model, inner, offload=setting.offload)
        snapshot = HostStore() if setting.offload else None
        stats, train_s = b.timed(inner_steps, model, batch[:MEMORY_STEPS * sequences], sequences,
                                 hp.optimizer.grad_clip, inner=inner, optimizer=optimizer,
                                 lr=inner_lr(inner, hp.optimizer.warmup_steps, hp.optimizer), snapshot=snapshot)
        sent, compress_s = b.timed(demo.step, gradients(model), stats.scale)
        model.zero_grad(set_to_none=True)
        sent = {n: (c.indices.cpu(), c.values.cpu()) for n, c in sent.items()}
        del demo, optimizer, snapshot
        return sent, train_s + compress_s, train_s

    out: dict[str, Any] = {"inner_steps": MEMORY_STEPS, "micro_batch": mb, "settings": {}}
    reference = None
    for setting in SETTINGS:
        sent, seconds, train_s = run(setting, mb)
        row: dict[str, Any] = {"flags": list(setting.flags), "peak_memory_gb": b.peak_gb(),
                               "estimate_gb": model_memory(hp, "miner", setting).gpu_bytes / 1e9,
                               "first_seconds": seconds, "first_train_seconds": train_s}
        repeat, row["seconds"], row["train_seconds"] = run(setting, mb)
        reference = reference if reference is not None else sent
        row["repeat_identical"] = _sent_difference(repeat, sent)["identical"]
        row["versus_default"] = _sent_difference(sent, reference)
        row["update_identical_to_default"] = row["versus_default"]["identical"]
        out["settings"][setting.name] = row
        del sent, repeat
    base = out["settings"]["default"]
    for row in out["settings"].values():  # what a setting adds to this many steps, once its buffers exist
        row["added_seconds"] = row["seconds"] - base["seconds"]
    out["pcie_gb_per_second_assumed"] = PCIE_BYTES_PER_SECOND / 1e9
    out["all_identical"] = all(r["update_identical_to_default"] for r in out["settings"].values())

    if b.device.type == "cuda" and b.left() > 20:
        deterministic: dict[str, Any] = {"sequences_per_step": 1, "attention": "math", "settings": {}}
        was = torch.are_deterministic_algorithms_enabled()
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            with sdpa_kernel(SDPBackend.MATH):
                reference = None
                for setting in SETTINGS:
                    sent, _, _ = run(setting, 1)
                    reference = reference if reference is not None else sent
                    row = {"versus_default": _sent_difference(sent, reference)}
                    if setting is SETTINGS[0]:
                        repeat, _, _ = run(setting, 1)
                        row["repeat_identical"] = _sent_difference(repeat, sent)["identical"]
                    deterministic["settings"][setting.name] = row
        finally:
            torch.use_deterministic_algorithms(was)
        deterministic["all_identical"] = all(r["versus_default"]["identical"]
                                             for r in deterministic["settings"].values())
        out["deterministic"] = deterministic
    checkpoint_activations(model, False)
    return out
