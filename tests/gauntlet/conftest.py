"""Fixtures for the Gauntlet tests: the CPU preset's incentive settings."""

from __future__ import annotations

import pytest

from templar.core.config import GauntletConfig, load_hparams


@pytest.fixture(scope="session")
def gauntlet_cfg() -> GauntletConfig:
    """`hparams/tiny.json` gauntlet section (mu_gamma 0.7, top_g 4, power 2, phi 0.75)."""
    return load_hparams("tiny").gauntlet
