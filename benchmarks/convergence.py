"""Convergence on the tiny preset: DeMo + signed top-G aggregation versus AdamW data-parallel.

    python benchmarks/convergence.py            # 60 windows (about 3 minutes on 2 CPU threads)
    python benchmarks/convergence.py --quick    # 15 windows

The paper's claim (§4) is that the Gauntlet's outer step, θ ← θ − α·sign(Σ_p q_p/‖q_p‖ / G) over
DeMo-compressed pseudo-gradients, trains about as well as a synchronous data-parallel baseline.
Both runs here start from the same θ_0 (`build_model`) and see the SAME tokens each window: K = 4
simulated peers, peer k training on `assigned_pages(k, window, pages_per_window)`.

- DeMo: each peer accumulates its gradient on its pages at the shared θ, takes one DeMo step with
  its own error feedback (decay `demo.momentum_decay`, lr folded in as miners do), then all K
  compressed updates are aggregated with w = 1/G (`templar.compress.aggregate`) and applied with
  `apply_signed_update` at the schedule's α (`templar.core.schedule.learning_rate`, preset weight decay).
- AdamW: the K peers' gradients (same pages, same per-micro-batch averaging) are averaged, clipped to
  `optimizer.grad_clip` as one data-parallel gradient, and one AdamW step is taken per window.
  Choice, documented: peak lr 1e-3 (`--adamw-lr`; AdamW's usual small-model value, 1/3 of the
  sign step's 3e-3, since AdamW's per-coordinate steps are ≤ lr but not all equal to it), default
  betas (0.9, 0.999), the preset's weight decay (0.1) and the same warm-up/cosine shape as α.

Held-out loss on `plan.holdout_pages()[:8]` (never assigned) every `--eval-every` windows. Writes
`benchmarks/results/convergence.json` and `convergence.png` (`convergence_quick.*` with --quick);
prints both curves and the ratio final DeMo loss / final AdamW loss.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from _common import RESULTS_DIR, emit, load_tiny, new_demo, peer_update, setup_torch, shapes_of, write_result
from templar.compress import aggregate, apply_signed_update
from templar.core.config import HParams
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.runtime.train import accumulate_gradients, evaluate_loss, gradients

PEERS = 4
HOLDOUT_PAGES = 8


class DemoRun:
    """K peers with their own error feedback around one shared model; signed top-G outer step."""

    def __init__(self, hp: HParams) -> None:
        self.hp = hp
        self.model = build_model(hp)
        self.shapes = shapes_of(self.model)
        self.demos = [new_demo(self.model, hp) for _ in range(PEERS)]

    def window(self, step: int, batches: list[torch.Tensor]) -> float:
        lr = learning_rate(step, self.hp.optimizer)
        updates, losses = [], []
        for demo, batch in zip(self.demos, batches, strict=True):
            compressed, loss = peer_update(self.model, demo, batch, lr, self.hp)
            updates.append(compressed)
            losses.append(loss)
        weight = 1.0 / self.hp.gauntlet.top_g
        signs = aggregate(updates, [weight] * len(updates), self.shapes)
        apply_signed_update(self.model, signs, lr, self.hp.optimizer.weight_decay)
        return sum(losses) / len(losses)


class AdamWRun:
    """Data-parallel AdamW on the same tokens: the mean of the K peers' gradients, one step per window."""

    def __init__(self, hp: HParams, peak_lr: float) -> None:
        self.hp = hp
        self.model = build_model(hp)
        self.opt_cfg = hp.optimizer.model_copy(update={"learning_rate": peak_lr})
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=peak_lr,
                                           weight_decay=hp.optimizer.weight_decay)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def window(self, step: int, batches: list[torch.Tensor]) -> float:
        total = [torch.zeros_like(p) for p in self.params]
        losses = []
        for batch in batches:
            stats = accumulate_gradients(self.model, batch, self.hp.optimizer.micro_batch_size)
            for acc, g in zip(total, gradients(self.model).values(), strict=True):
                acc.add_(g)
            losses.append(stats.loss)
        for p, acc in zip(self.params, total, strict=True):
            p.grad = acc.div_(len(batches))
        torch.nn.utils.clip_grad_norm_(self.params, self.hp.optimizer.grad_clip)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(step, self.opt_cfg)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return sum(losses) / len(losses)


def plot(path, curves: dict[str, tuple[list[int], list[float]]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=90)
    for label, (x, y) in curves.items():
        ax.plot(x, y, marker="o", markersize=3, label=label)
    ax.set_xlabel("window (outer step)")
    ax.set_ylabel("held-out loss (nats)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="15 windows instead of 60")
    parser.add_argument("--windows", type=int, default=None)
    parser.add_argument("--eval-every", type=int, default=None, help="windows between held-out evaluations")
    parser.add_argument("--adamw-lr", type=float, default=1e-3, help="AdamW peak learning rate")
    args = parser.parse_args()
    setup_torch()
    windows = args.windows or (15 if args.quick else 60)
    eval_every = args.eval_every or (3 if args.quick else 5)

    stem = "convergence_quick" if args.quick else "convergence"  # a quick run never overwrites the full figures
    tiny = load_tiny()
    hp = tiny.hp
    holdout = tiny.pages.batch(tiny.plan.holdout_pages()[:HOLDOUT_PAGES])
    mbs = hp.optimizer.micro_batch_size
    runs = {"demo": DemoRun(hp), "adamw": AdamWRun(hp, args.adamw_lr)}
    steps: list[int] = []
    curves: dict[str, list[float]] = {name: [] for name in runs}
    train_loss: dict[str, list[float]] = {name: [] for name in runs}
    seconds = dict.fromkeys(runs, 0.0)

    def evaluate(step: int) -> None:
        steps.append(step)
        record = {"case": "holdout", "window": step}
        for name, run in runs.items():
            curves[name].append(evaluate_loss(run.model, holdout, mbs))
            record[f"{name}_loss"] = curves[name][-1]
        emit(record)

    evaluate(0)
    for window in range(windows):
        batches = [tiny.pages.batch(tiny.plan.assigned_pages(k, window, hp.data.pages_per_window))
                   for k in range(PEERS)]
        for name, run in runs.items():
            started = time.perf_counter()
            train_loss[name].append(run.window(window, batches))
            seconds[name] += time.perf_counter() - started
        if (window + 1) % eval_every == 0 or window + 1 == windows:
            evaluate(window + 1)

    ratio = curves["demo"][-1] / curves["adamw"][-1]
    tokens = windows * PEERS * hp.data.pages_per_window * hp.data.sequences_per_page * hp.data.sequence_length
    summary = {
        "case": "summary", "windows": windows, "peers": PEERS, "tokens": tokens,
        "initial_loss": curves["demo"][0], "final_loss_demo": curves["demo"][-1],
        "final_loss_adamw": curves["adamw"][-1], "final_loss_ratio_demo_over_adamw": ratio,
        "seconds_demo": seconds["demo"], "seconds_adamw": seconds["adamw"],
    }
    emit(summary)
    result = {
        **summary,
        "settings": {"preset": hp.name, "top_g": hp.gauntlet.top_g, "demo_lr_peak": hp.optimizer.learning_rate,
                     "adamw_lr_peak": args.adamw_lr, "adamw_betas": [0.9, 0.999],
                     "weight_decay": hp.optimizer.weight_decay, "warmup_steps": hp.optimizer.warmup_steps,
                     "total_steps": hp.optimizer.total_steps, "holdout_pages": HOLDOUT_PAGES,
                     "target_chunk": hp.demo.target_chunk, "topk": hp.demo.topk,
                     "momentum_decay": hp.demo.momentum_decay},
        "eval_windows": steps, "holdout_loss": curves, "train_loss": train_loss,
    }
    write_result(f"{stem}.json", result)
    plot(RESULTS_DIR / f"{stem}.png",
         {"DeMo + signed top-G (K=4)": (steps, curves["demo"]), f"AdamW DP (lr {args.adamw_lr:g})":
          (steps, curves["adamw"])},
         f"tiny preset, K={PEERS} peers, same tokens; final ratio DeMo/AdamW {ratio:.3f}")

    print(f"\nHeld-out loss ({HOLDOUT_PAGES} pages), K={PEERS} peers, {tokens:,} tokens per run:")
    print("  window " + " ".join(f"{s:>6d}" for s in steps))
    for name in runs:
        print(f"  {name:<6} " + " ".join(f"{v:6.3f}" for v in curves[name]))
    print(f"  final ratio DeMo/AdamW {ratio:.3f}; wall {seconds['demo']:.0f} s (DeMo), {seconds['adamw']:.0f} s (AdamW)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
