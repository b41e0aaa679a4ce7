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
    if not (assets / "BUILT").exists():
        subprocess.run([sys.executable, str(ROOT / "scripts" / "build_assets.py"), "--out", str(assets)], check=True)
    return assets


@pytest.fixture(scope="session")
def tiny_pages(assets_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The tiny preset's pages over the sample corpus (tokenized once per session, cached)."""
    from templar.config import load_hparams
    from templar.data import PageStore

    hp = load_hparams("tiny")
    return PageStore.from_corpus(
        assets_dir / "corpus", assets_dir / "tokenizer", text_field=hp.data.text_field,
        sequence_length=hp.data.sequence_length, sequences_per_page=hp.data.sequences_per_page,
    )
