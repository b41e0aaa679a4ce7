"""Shared fixtures: the offline corpus and tokenizer built by scripts/build_assets.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def assets_dir() -> Path:
    """The sample corpus and tokenizer; built on first use if a bare checkout lacks them."""
    assets = ROOT / "assets"
    if not (assets / "BUILT").exists() or not (assets / "shards" / "manifest.json").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_assets.py"), "--out", str(assets)], check=True)
    return assets


@pytest.fixture(scope="session")
def tiny_pages(assets_dir: Path):
    """The tiny preset's pages: the sample corpus as prepared by build_assets (digest pinned)."""
    from templar.config import load_hparams, resolve_asset
    from templar.data import LocalCorpus

    hp = load_hparams("tiny")
    return LocalCorpus(resolve_asset(hp.data.corpus), digest=hp.data.manifest)
