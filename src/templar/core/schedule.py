"""Outer learning rate α_t as a pure function of global_step (warm-up, then cosine decay).

Every node evaluates the same function at the same `global_step`, so every node that agrees on the step
agrees on α. The step has one authority (`templar.runtime.consensus.outer.update_step`, docs/design.md §3): a peer's
claim travels in its payload but is checked, never adopted.
"""

from __future__ import annotations

import math

from templar.core.config import OptimizerConfig


def scheduled_rate(step: int, opt: OptimizerConfig) -> float:
    """The run's schedule at outer step `step` (0-based): linear warm-up to lr, cosine down to
    lr·min_lr_factor. What the inner rate follows (`templar.runtime.train.inner_lr`), and α itself
    unless α is constant (`learning_rate`)."""
    if step < 0:
        raise ValueError(f"global_step must be >= 0, got {step}")
    peak = opt.learning_rate
    if opt.warmup_steps and step < opt.warmup_steps:
        return peak * (step + 1) / opt.warmup_steps
    decay_steps = max(1, opt.total_steps - opt.warmup_steps)
    progress = min(1.0, (step - opt.warmup_steps) / decay_steps)
    floor = peak * opt.min_lr_factor
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def learning_rate(step: int, opt: OptimizerConfig) -> float:
    """α at outer step `step` (0-based): the schedule (`scheduled_rate`), or, with `outer_schedule`
    "constant", its warm-up and then lr for good: DiLoCo's outer SGD, where the inner rate alone
    anneals. Under the cosine, a sparseloco step α·mean(Δ) decays twice, since Δ (the inner AdamW
    steps' sum) shrinks with the inner rate (benchmarks/LOG.md §9)."""
    if opt.outer_schedule == "constant" and step >= opt.warmup_steps:
        return opt.learning_rate
    return scheduled_rate(step, opt)
