"""What one window costs a peer under a preset: tokens, FLOPs, GPU time, memory, network, disk.

Estimates, stated with their formulas so they can be checked:

* FLOPs per token, training: 6·N + 12·L·d·S (PaLM appendix B: weights, plus attention scores);
  evaluation (forward only) a third of that.
* GPU time: FLOPs / (peak · MFU); peak is the H100 SXM's dense bf16 989 TFLOP/s.
* GPU memory, miner: fp32 weights, fp32 gradients (the pseudo-gradient, after the inner steps) and
  the error-feedback buffer (3 × 4·N bytes), with inner steps the θ_t snapshot (4·N) and AdamW's two
  moments (8·N), plus activations of one micro-batch with fused attention (34·S·b·d bytes per layer,
  Korthikanti et al. 2022) and fp32 logits (2 × b·S·V·4). Validators hold a second fp32 copy of θ
  for LossScore rollback and no error feedback. A smaller GPU moves the snapshot, the error
  feedback and the moments to host memory (`offloadable`).
* Compute utilisation: the share of the time a window leaves for compute that training fills. A
  miner trains window w+1 from the moment it holds w's step (the gather starts at `gather_start`
  and takes the top-G payloads at `ASSUMED_BANDWIDTH` plus `ASSUMED_STEP_SECONDS` for the step) until
  its commitment is due (`commit_close`); a validator evaluates within its window.
* Network: pages in (ranged GETs), one compressed gradient out, the top-G gradients in
  (the wire format's upper bound `max_gradient_bytes`); validators read `fast_eval_uids`.
* Disk: the window's pages land in the page cache (bounded by --data.cache_gb).
"""

from __future__ import annotations

from typing import Any

from templar.core.config import HParams

H100_BF16_FLOPS = 989e12
DEFAULT_MFU = 0.40
ASSUMED_BANDWIDTH = 125e6
"""Bytes per second a miner downloads the top-G payloads at (1 Gbit/s)."""
ASSUMED_STEP_SECONDS = 1.0
"""The outer step over the top-G on a GPU (decode, aggregate, apply)."""


def compute_span(hp: HParams, gradient_bytes: int) -> float:
    """Seconds a window leaves a miner for training: from holding the previous window's step to the
    commitment deadline (`templar.runtime.windows`: commit_close − gather_start, measured from the
    previous window's end, minus the gather and the step)."""
    from templar.runtime.windows import window_times

    w = hp.windows
    window_s = w.window_seconds
    previous, this = window_times(w, -1, -window_s, 0.0), window_times(w, 0, 0.0, window_s)
    gather = hp.gauntlet.top_g * gradient_bytes / ASSUMED_BANDWIDTH + ASSUMED_STEP_SECONDS
    return max(0.0, this.commit_close - previous.gather_start - gather)


def window_sizing(hp: HParams, *, mfu: float = DEFAULT_MFU) -> dict[str, Any]:
    """The figures of `templar hparams` (and the sizing table of docs/mining.md)."""
    from templar.core.model import build_model, parameter_count, parameter_shapes
    from templar.wire import max_gradient_bytes

    model = build_model(hp, "meta")
    n = parameter_count(model)
    grad_bytes = max_gradient_bytes(parameter_shapes(model), hp)
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
    b = hp.optimizer.micro_batch_size
    activations = layers * 34 * seq * b * width + 2 * b * seq * m.vocab_size * 4
    inner_steps = hp.inner.optimizer != "sgd" or hp.inner.steps > 1
    snapshot = 4 * n if inner_steps else 0
    moments = 8 * n if hp.inner.optimizer == "adamw" else 0
    miner_gpu = 3 * 4 * n + snapshot + moments + activations
    offloadable = 4 * n + snapshot + moments  # error feedback, θ_t and the moments: touched once per window or step
    validator_gpu = 3 * 4 * n + activations // 3
    train_s = train_flops / (H100_BF16_FLOPS * mfu)
    eval_s = eval_flops / (H100_BF16_FLOPS * mfu)
    span = compute_span(hp, grad_bytes)
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
        "miner_compute_span_seconds": span,
        "miner_compute_utilisation": min(1.0, train_s / span) if span > 0 else 0.0,
        "validator_eval_tokens_per_window": eval_tokens,
        "validator_eval_flops_per_window": eval_flops,
        "h100_validator_eval_seconds": eval_s,
        "validator_compute_utilisation": min(1.0, eval_s / window_s),
        "miner_gpu_memory_gb": miner_gpu / 1e9,
        "miner_gpu_memory_offloaded_gb": (miner_gpu - offloadable) / 1e9,
        "miner_host_memory_offloaded_gb": offloadable / 1e9,
        "validator_gpu_memory_gb": validator_gpu / 1e9,
        "gradient_upload_max_mb": grad_bytes / 1e6,
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
        ("miner compute utilisation", f"{s['miner_compute_utilisation']:.0%} of the {s['miner_compute_span_seconds']:.1f} s "
                                      "a window leaves for training"),
        ("validator eval tokens per window", f"{s['validator_eval_tokens_per_window']:,}"),
        (f"H100 validator eval time at {s['mfu_assumed']:.0%} MFU", f"{s['h100_validator_eval_seconds']:.2f} s"),
        ("validator compute utilisation", f"{s['validator_compute_utilisation']:.0%} of the window"),
        ("GPU memory, miner / validator", f"{s['miner_gpu_memory_gb']:.1f} / {s['validator_gpu_memory_gb']:.1f} GB"),
        ("miner with offload (GPU + host)", f"{s['miner_gpu_memory_offloaded_gb']:.1f} GB + "
                                            f"{s['miner_host_memory_offloaded_gb']:.1f} GB"),
        ("upload per window (gradient, max)", f"{s['gradient_upload_max_mb']:.2f} MB"),
        ("download per window, miner / validator",
         f"{s['miner_download_mb_per_window']:.1f} / {s['validator_download_mb_per_window']:.1f} MB"),
        ("page cache growth per window", f"{s['page_cache_mb_per_window']:.2f} MB"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)
