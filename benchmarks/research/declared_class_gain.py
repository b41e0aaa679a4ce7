"""Do a miner's two page classes gain alike from its own inner steps? (benchmarks/LOG.md §42)

    OMP_NUM_THREADS=2 python -m benchmarks.research.declared_class_gain            # 4 draws, about a minute
    OMP_NUM_THREADS=2 python -m benchmarks.research.declared_class_gain --draws 8

In the crowded localnet an honest miner that declares twice the pages (`moredata`) showed a gain on
its declared pages of 0.68–0.95 of the gain on its assigned ones, over six runs, all below 1. This
isolates the inner steps: the crowded localnet's `micro` model (a few plain steps off its start, so it
is not at its initialisation), 8 assigned and 8 declared real pages laid one after the other as the
miner lays them (`Miner.pages`), production's inner loop (`inner_steps`: H AdamW steps, sequences
dealt round-robin), and the pseudo-gradient applied whole, uncompressed. Each class's gain is its
mean per-sequence loss drop over 8 random pages' drop; the ratio is declared over assigned, once with
the assigned pages first and once with the declared ones first. A ratio near 1 either way places
the asymmetry after the inner steps: compression and error feedback, the overlapped base, or the
validator's trial step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

import torch

from templar.core.config import load_hparams, resolve_asset
from templar.core.model import build_model
from templar.data.local import LocalCorpus
from templar.runtime.train import inner_steps, make_inner_optimizer, sequence_losses

PRESET = "benchmarks/presets/micro_gauntlet_8pages_others_quarter.json"
WARM_STEPS = 30
"""Plain AdamW steps on other pages before the draws, so the model is not at its initialisation."""
MICRO_BATCH = 8


def class_gains(model: torch.nn.Module, corpus: LocalCorpus, first: list[int], second: list[int],
                rand: list[int], hp) -> tuple[float, float]:
    """(gain of `first`'s class, gain of `second`'s), each over `rand`'s, after the inner steps on
    `first + second`; the model is put back as it was."""
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    batches = [corpus.batch(pages) for pages in (first, second, rand)]
    before = [sequence_losses(model, b, MICRO_BATCH) for b in batches]
    inner_steps(model, corpus.batch(first + second), MICRO_BATCH, None, inner=hp.inner,
                optimizer=make_inner_optimizer(model, hp.inner), lr=hp.inner.learning_rate)
    with torch.no_grad():  # p.grad holds θ_start − θ_end: the window's pseudo-gradient, applied whole
        for p in model.parameters():
            if p.grad is not None:
                p -= p.grad
    drop = [(b0 - sequence_losses(model, b, MICRO_BATCH)).mean().item() for b0, b in zip(before, batches, strict=True)]
    model.load_state_dict(saved)
    for p in model.parameters():
        p.grad = None
    return drop[0] - drop[2], drop[1] - drop[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=4, help="draws of 8 + 8 + 8 pages")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    hp = load_hparams(PRESET)
    corpus = LocalCorpus(resolve_asset(hp.data.corpus), digest=hp.data.manifest or None)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    model = build_model(hp)
    warm = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(WARM_STEPS):
        batch = corpus.batch(rng.sample(range(corpus.num_pages), 4))
        loss = model(input_ids=batch, labels=batch).loss
        warm.zero_grad()
        loss.backward()
        warm.step()
    ratios: dict[str, list[float]] = {"assigned first": [], "declared first": []}
    for draw in range(args.draws):
        pages = rng.sample(range(corpus.num_pages), 24)
        assigned, declared, rand = pages[:8], pages[8:16], pages[16:]
        gain_a, gain_d = class_gains(model, corpus, assigned, declared, rand, hp)
        ratios["assigned first"].append(gain_d / gain_a)
        gain_d2, gain_a2 = class_gains(model, corpus, declared, assigned, rand, hp)
        ratios["declared first"].append(gain_d2 / gain_a2)
        print(f"draw {draw}: gain over random pages, assigned {gain_a:.4f}, declared {gain_d:.4f} "
              f"(declared first: {gain_a2:.4f}, {gain_d2:.4f})", flush=True)
    for order, values in ratios.items():
        print(f"declared / assigned, {order}: " + ", ".join(f"{v:.2f}" for v in values)
              + f" (median {statistics.median(values):.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
