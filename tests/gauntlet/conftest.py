"""Fixtures for the Gauntlet tests: the paper's incentive settings on the CPU preset."""

from __future__ import annotations

import pytest

from templar.core.config import GauntletConfig, load_hparams


@pytest.fixture(scope="session")
def gauntlet_cfg() -> GauntletConfig:
    """`hparams/tiny-paper.json`'s gauntlet section: the paper's rules at tiny's scale (mu_gamma 0.7,
    proof margin 0.3, OpenSkill, top_g 4, power 2, phi 0.75)."""
    return load_hparams("tiny-paper").gauntlet
