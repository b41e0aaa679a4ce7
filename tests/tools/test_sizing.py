"""Per-window sizing (`templar hparams`): the production run's inner steps fill most of the window a
miner has for training, and a validator's evaluation fits inside the window at the stated MFU."""

from templar.cli import main
from templar.core.config import load_hparams
from templar.tools.sizing import window_sizing


def test_production_window_matches_the_paper_budget_and_fits():
    s = window_sizing(load_hparams())
    assert 1.1e9 < s["parameters"] < 1.3e9
    assert s["tokens_per_window_per_peer"] == 16 * 64 * 2048  # 16 pages in H = 16 inner steps
    assert s["tokens_per_window_per_peer"] // load_hparams().inner.steps == 64 * 2048  # one page's worth a step
    assert s["page_bytes"] == 256 * 1024
    assert s["h100_train_seconds"] < s["window_seconds"]
    assert 0.8 < s["miner_compute_utilisation"] <= 1.0  # the GPU trains most of the time a window leaves it
    assert s["h100_validator_eval_seconds"] < s["window_seconds"] / 2
    assert s["miner_gpu_memory_gb"] < 78  # one H100


def test_hparams_command_prints_the_figures(capsys):
    assert main(["hparams", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "tokens per window per peer" in out and "1,024" in out and "H100 training time" in out
