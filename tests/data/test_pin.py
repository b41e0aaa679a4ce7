"""`templar data pin`: the published manifest, read through the corpus' read locator, pinned in the
run's hparams; a corpus that does not fit the run is refused and nothing is written."""

from __future__ import annotations

import json

from templar.cli import main
from templar.core.config import PRESETS_DIR, REPO_ROOT, load_hparams

SHARDS = REPO_ROOT / "assets" / "shards"


def test_pin_writes_a_new_run_and_updates_an_existing_one(tmp_path, assets_dir, capsys):
    run = tmp_path / "run.json"
    corpus = f"local:{SHARDS}"
    assert main(["data", "pin", corpus, "--hparams", str(run), "--base", "tiny"]) == 0
    hp = load_hparams(run)
    tiny = load_hparams("tiny")
    assert hp.data.manifest == tiny.data.manifest and hp.data.corpus == corpus and hp.name == "run"
    assert hp.digest() in capsys.readouterr().out
    body = json.loads(run.read_text())
    body["optimizer"]["learning_rate"] = 0.001
    body["data"]["manifest"] = "3" * 64
    run.write_text(json.dumps(body))
    assert main(["data", "pin", corpus, "--hparams", str(run)]) == 0
    again = json.loads(run.read_text())
    assert again["optimizer"]["learning_rate"] == 0.001 and again["data"]["manifest"] == tiny.data.manifest


def test_pin_refuses_a_corpus_that_does_not_fit_and_writes_nothing(tmp_path, assets_dir, capsys):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"base": str(PRESETS_DIR / "tiny.json"), "data": {"sequences_per_page": 8}}))
    run = tmp_path / "run.json"
    assert main(["data", "pin", f"local:{SHARDS}", "--hparams", str(run), "--base", str(other)]) == 1
    assert "does not fit the run" in capsys.readouterr().out and not run.exists()
    assert not list(tmp_path.glob(".*.tmp"))
    assert main(["data", "pin", f"local:{SHARDS}", "--hparams", str(run)]) == 1  # no file and no --base
    assert main(["data", "pin", f"local:{tmp_path}", "--hparams", str(run), "--base", "tiny"]) == 1  # no manifest
    assert "cannot read manifest.json" in capsys.readouterr().out


def test_a_pinned_run_file_names_nothing_of_this_machine(tmp_path, assets_dir, capsys):
    """The file `pin` writes is the one the launch page publishes: no path of this clone (no `base`
    pointing into it), the same run wherever it is copied, and a warning for a corpus only this
    machine can read."""
    run = tmp_path / "run.json"
    assert main(["data", "pin", str(SHARDS), "--hparams", str(run), "--base", "tiny"]) == 0
    text = run.read_text()
    assert str(REPO_ROOT) not in text and str(tmp_path) not in text and '"base"' not in text, text
    hp = load_hparams(run)
    assert hp.data.corpus == "assets/shards" and hp.digest() == load_hparams("tiny").digest()
    elsewhere = tmp_path / "another" / "machine" / "run.json"
    elsewhere.parent.mkdir(parents=True)
    elsewhere.write_text(text)
    assert load_hparams(elsewhere).digest() == hp.digest()
    assert "warning" not in capsys.readouterr().out
    assert main(["data", "pin", f"local:{SHARDS}", "--hparams", str(tmp_path / "local.json"), "--base", "tiny"]) == 0
    assert "warning: the corpus local:" in capsys.readouterr().out
