"""Production as the subnet simulator sees it: the Gauntlet rules of a run's hparams and the size of
one evaluation its validator reads, read from the run's files so that `subnet_sim.CHOSEN` cannot
drift from what ships (`tests/gauntlet/test_subnet_sim_production.py` compares them)."""

from __future__ import annotations

from benchmarks.incentive.subnet_sim_fit import EvalSize
from templar.core.config import HParams, load_hparams
from templar.gauntlet import eval_sequences_read


def production_size(hp: HParams) -> EvalSize:
    """What a run's validator reads in one evaluation: the sequences the proof reads of each of
    `eval_pages` evaluated pages (`eval_sequences_read`), every sequence of as many random pages, and
    `gauntlet.position_ranges` units in each (`validator.evaluate`)."""
    per_page = hp.data.sequences_per_page
    return EvalSize(hp.data.eval_pages * eval_sequences_read(per_page, hp.gauntlet.proof_sequences),
                    hp.data.eval_pages * per_page, min(hp.gauntlet.position_ranges, hp.data.sequence_length - 1))


RULE_FIELDS: dict[str, str] = {
    "power": "power", "mu_gamma": "mu_gamma", "proof_margin": "proof_margin", "proof_credit": "proof_credit",
    "proof_full_gap": "proof_full_gap", "phi": "fast_eval_penalty", "openskill_beta": "openskill_beta",
    "openskill_tau": "openskill_tau", "sharpness": "selection_sharpness", "newcomer_evals": "newcomer_evals",
    "mu_prior_evals": "mu_prior_evals", "rating_gamma": "rating_gamma", "rating_tie_band": "rating_tie_band",
    "rating_exponent": "rating_exponent", "rating_cap": "rating_cap"}
"""`SimConfig` fields that are a Gauntlet rule, and the hparams `gauntlet` key each mirrors (the rating
is `loss_rating`). The subnet's size (`uids_per_window`, `fast_eval_uids`, `top_g`) is the simulated
subnet's own."""


def production_settings(hp: HParams | None = None) -> dict:
    """The `SimConfig` fields a run's hparams set (production's `hparams.json` by default): every
    Gauntlet rule (`RULE_FIELDS`, the rating) and what its validator reads an evaluation
    (`production_size`). Read from the file, not restated, so the simulator runs the rules that ship."""
    hp = hp or load_hparams()
    g = hp.gauntlet
    return {**{name: getattr(g, key) for name, key in RULE_FIELDS.items()},
            "rating": "relative" if g.loss_rating == "relative" else "openskill", "eval_size": production_size(hp)}
