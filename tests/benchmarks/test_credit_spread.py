"""`benchmarks/incentive/credit_spread.py` replays the proof's credit exactly as the validator's score
book gave it, and splits its spread as its docstring says."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from benchmarks.incentive import credit_spread
from benchmarks.incentive.localnet_consensus import PRESET
from templar.core.config import load_hparams
from templar.gauntlet.book import PrimaryResult, ScoreBook

PAGES, SEQUENCES, RANGES = 2, 2, 4
MINERS = {"h0": "honest", "h1": "honest", "h2": "honest", "lz": "lazy"}


def _run(root: Path, windows: int = 6, seed: int = 0, levels: tuple[float, float] = (0.5, 2.0),
         unit_noise: float = 0.08) -> Path:
    """A localnet's out folder as the tool reads it: one validator that evaluated 3 honest miners and a
    lazy one every window (2 pages of 2 sequences of 4 ranges each), and the μ its real score book gave
    them (`scores.jsonl`)."""
    rng = random.Random(seed)
    rules = load_hparams(PRESET).gauntlet
    book = ScoreBook()
    nodes = [{"name": "validator0", "hotkey": "v", "role": "validator", "strategy": "lead"}]
    nodes += [{"name": name, "hotkey": name, "role": "miner", "strategy": strategy} for name, strategy in MINERS.items()]
    (root / "nodes" / "validator0").mkdir(parents=True)
    (root / "nodes.json").write_text(json.dumps(nodes))
    evaluations, scores = [], []
    for window in range(windows):
        level = rng.uniform(*levels)  # what a window shares
        results = {}
        for uid, (hotkey, strategy) in enumerate(MINERS.items()):
            book.get_or_create(hotkey, uid, window)
            rand = 1.0 + rng.gauss(0, 0.05)
            gain = 0.1 * level if strategy == "honest" else 0.0
            units = [rand + gain + rng.gauss(0, unit_noise) for _ in range(PAGES * SEQUENCES * RANGES)]
            per_page = SEQUENCES * RANGES
            pages = [sum(units[p * per_page:(p + 1) * per_page]) / per_page for p in range(PAGES)]
            results[hotkey] = PrimaryResult(sum(pages) / PAGES, rand, pages=tuple(pages), sequences=tuple(units))
            evaluations.append({"window": window, "hotkey": hotkey, "delta_assigned": sum(pages) / PAGES,
                                "delta_rand": rand, "pages": pages, "units": units, "random_units": [rand] * 8,
                                "work": 1.0, "declared_units": 0})
        book.record_primary(rules, results, window=window)
        scores += [{"window": window, "hotkey": h, "mu": book.peers[h].mu} for h in MINERS]
    (root / "nodes" / "validator0" / "evaluations.jsonl").write_text("\n".join(map(json.dumps, evaluations)))
    (root / "nodes" / "validator0" / "scores.jsonl").write_text("\n".join(map(json.dumps, scores)))
    return root


def test_the_replay_is_the_books_credit_and_the_spread_is_split(tmp_path: Path) -> None:
    run = _run(tmp_path)
    rules = load_hparams(PRESET).gauntlet
    evaluations = credit_spread.replay([run], rules)
    assert len(evaluations) == 6 * len(MINERS) and {e.pages for e in evaluations} == {PAGES}
    checked, worst = credit_spread.replay_matches_the_book([run], evaluations, rules.mu_gamma)
    assert checked == 5 * 3 and worst < 1e-12  # every honest update after the first window
    wrong = credit_spread.replay([run], rules, full_gap=rules.proof_full_gap * 3)
    assert credit_spread.replay_matches_the_book([run], wrong, rules.mu_gamma)[1] > 1e-3  # the check can fail
    relative = credit_spread.by_strategy(evaluations)
    assert relative["honest"] == 1.0 and abs(relative["lazy"]) < 0.3
    spread = credit_spread.spread(evaluations, RANGES)
    assert spread["evaluations"] == 18 and spread["sampling_share"] > 0 and 0 <= spread["window_share"] <= 1
    parts = credit_spread.components(evaluations, RANGES)
    assert parts is not None and parts["sequences_per_page_read"] == SEQUENCES and parts["range"] > 0
    sd = parts["sampling_sd"]
    assert sd["every sequence of the crowded localnet's 8 pages"] < sd["the crowded localnet (8 pages, 1 sequence each)"]


def test_what_a_window_shares_and_what_the_sequences_sample_are_told_apart(tmp_path: Path) -> None:
    """Honest gains that differ only by window, measured on quiet units, spread by window; the same
    gain in every window on noisy units spreads by the sampling of the sequences read."""
    rules = load_hparams(PRESET).gauntlet
    by_window = credit_spread.spread(credit_spread.replay([_run(tmp_path / "a", 24, levels=(0.02, 0.3),
                                                               unit_noise=0.005)], rules), RANGES)
    by_units = credit_spread.spread(credit_spread.replay([_run(tmp_path / "b", 24, levels=(1.0, 1.0),
                                                              unit_noise=0.3)], rules), RANGES)
    assert by_window["window_share"] > 0.6 and by_window["sampling_share"] < 0.3, by_window
    assert by_units["window_share"] < 0.3 and by_units["sampling_share"] > 0.6, by_units


def test_the_command_writes_its_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path / "run", windows=3, seed=1)
    out = tmp_path / "credit.json"
    assert credit_spread.main(["--runs", str(run), "--full-gap", "1", "--results", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["replay_checked"][0] == 2 * 3 and written["replay_checked"][1] < 1e-12
    assert set(written["full_gap"]) == {"1.0"} and written["components"]["sequences_per_page_read"] == SEQUENCES
    assert "confirm the replay" in capsys.readouterr().out
