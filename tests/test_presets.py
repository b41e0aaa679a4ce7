"""A preset that says it runs production's rules does: its Gauntlet and its inner loop are hparams.json's.

Calibrations are run on small presets (`tiny`, the `micro` test model) and quoted for production, so a
preset whose name says production, or that the docs call production's rules on a small model, must
resolve to production's incentive and inner optimiser (a preset named for production once ran the
paper's sign proof and one SGD inner step). A few settings scale with the model, the subnet or the
localnet's length and may differ; each is listed with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from templar.core.config import PRESETS_DIR, REPO_ROOT, load_hparams

PRESET_DIRS = (PRESETS_DIR, REPO_ROOT / "benchmarks" / "presets", REPO_ROOT / "tests" / "presets")
DESCRIBED_AS_PRODUCTION = {"tiny.json", "micro-gauntlet.json", "micro_gauntlet_8pages.json"}
"""Presets the docs call production's rules on a small model (README, docs/scoring.md, the suite's localnets)."""

GAUNTLET_SCALE = {
    "top_g": "G follows the subnet's size: 15 of 256 uids, 4 of a localnet's handful of miners",
    "uids_per_window": "S_t follows the subnet's size (a localnet has a handful of miners)",
    "fast_eval_uids": "F_t follows the subnet's size (64 of 256 uids; 16 of a localnet)",
    "sync_max_steps": "a localnet lasts tens of windows: a stale model must show within a few of them",
    "proof_sequences": "the proof reads a secret quarter of each page where that is a sample (production's 16 of 64; "
                       "1 of 4 over the crowded localnet's 8 evaluated pages), every sequence where a quarter would "
                       "be 1 or 2 sequences an evaluation (tiny's pages hold 4)",
}
INNER_SCALE = {
    "steps": "H follows the window's sequences (production's pages; a localnet's window holds 8 to 32)",
    "learning_rate": "tuned to the model's size and the run's length",
    "weight_decay": "tuned to the model's size and the run's length",
}


def _production_presets() -> list[Path]:
    found = []
    for folder in PRESET_DIRS:
        for path in sorted(folder.glob("*.json")):
            if "production" in path.stem or path.name in DESCRIBED_AS_PRODUCTION or "production" in load_hparams(path).name:
                found.append(path)
    return found


def test_the_presets_that_say_production_are_found():
    assert {path.name for path in _production_presets()} >= DESCRIBED_AS_PRODUCTION


@pytest.mark.parametrize("path", _production_presets(), ids=lambda p: p.name)
def test_a_preset_that_says_production_runs_production_s_gauntlet_and_inner_loop(path: Path):
    production, preset = load_hparams(), load_hparams(path)
    gauntlet = {key: (value, getattr(preset.gauntlet, key)) for key, value in production.gauntlet.model_dump().items()
                if key not in GAUNTLET_SCALE and getattr(preset.gauntlet, key) != value}
    assert not gauntlet, f"{path.name} differs from production's gauntlet section (production, preset): {gauntlet}"
    inner = {key: (value, getattr(preset.inner, key)) for key, value in production.inner.model_dump().items()
             if key not in INNER_SCALE and getattr(preset.inner, key) != value}
    assert not inner, f"{path.name} differs from production's inner loop (production, preset): {inner}"
    assert preset.inner.steps > 1, f"{path.name}: production takes several inner steps per window"
    assert preset.optimizer.method == production.optimizer.method, path.name
    assert preset.sync == production.sync, path.name
    share = preset.gauntlet.proof_sequences / preset.data.sequences_per_page
    assert share in (0, production.gauntlet.proof_sequences / production.data.sequences_per_page), \
        f"{path.name}: the proof reads every sequence or production's share of them"
