"""The run's rules for unit tests that exercise one rule at a time.

Every rule that changes a score, a weight or a verdict is a field of the run's hparams
(`templar.core.config`), passed to the code that applies it. A test states the values it depends
on as overrides of production's section; what it does not name is production's (the `paper`
variant: the paper's scoring, as a score book applied it when nothing else was set).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from templar.core.config import GauntletConfig, load_hparams

PAPER_SCORING: dict[str, Any] = {
    "proof_margin": 0.0, "proof_credit": "sign", "proof_full_gap": 1.0, "loss_rating": "openskill",
    "mu_prior_evals": None, "mu_tie_band": 0.0, "rating_tie_band_below": 0.0, "selection_sharpness": 0.0,
    "newcomer_evals": 0, "newcomer_first_evals": 0,
}
"""The paper's proof of computation (a sign, no margin), OpenSkill LossRating, plain μ read as it is, uniform draws."""


@cache
def _production() -> GauntletConfig:
    return load_hparams().gauntlet


def gauntlet_rules(**overrides: Any) -> GauntletConfig:
    """Production's gauntlet section with the paper's scoring, then `overrides` (not validated, so
    a test may switch a check off with an infinite threshold)."""
    return _production().model_copy(update={**PAPER_SCORING, **overrides})
