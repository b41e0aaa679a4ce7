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
        scores += [{"window": window, "hotkey": h, "mu": book.peers[h].mu, "evaluated": True, "in_top_g": False,
                    "status": "ok"} for h in MINERS]
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


def _declaring_run(root: Path, windows: int, unit_noise: float, seed: int = 0) -> Path:
    """A validator that evaluated, every window, an honest miner, `moredata` (twice the pages, trained:
    half the gain on every unit) and `overclaim` (twice the pages declared, the assigned ones trained
    only), each on 2 assigned and 2 declared pages of 2 sequences of 4 ranges, and what its real score
    book kept of their page classes (`scorebook.json`)."""
    rng = random.Random(seed)
    rules = load_hparams(PRESET).gauntlet
    book = ScoreBook()
    miners = {"h0": "honest", "md": "moredata", "oc": "overclaim"}
    nodes = [{"name": "validator0", "hotkey": "v", "role": "validator", "strategy": "lead"}]
    nodes += [{"name": name, "hotkey": name, "role": "miner", "strategy": strategy} for name, strategy in miners.items()]
    (root / "nodes" / "validator0").mkdir(parents=True)
    (root / "nodes.json").write_text(json.dumps(nodes))
    per_class = PAGES * SEQUENCES * RANGES
    evaluations = []
    for window in range(windows):
        results = {}
        for uid, (hotkey, strategy) in enumerate(miners.items()):
            book.get_or_create(hotkey, uid, window)
            rand = 1.0 + rng.gauss(0, 0.02)
            gain = {"honest": (0.1, None), "moredata": (0.05, 0.05), "overclaim": (0.1, 0.0)}[strategy]
            units = [rand + gain[0] + rng.gauss(0, unit_noise) for _ in range(per_class)]
            if gain[1] is not None:
                units += [rand + gain[1] + rng.gauss(0, unit_noise) for _ in range(per_class)]
            work, declared = (1.0, 0) if gain[1] is None else (2.0, per_class)
            randoms = [rand + rng.gauss(0, unit_noise) for _ in range(8)]
            results[hotkey] = PrimaryResult(sum(units) / len(units), rand, sequences=tuple(units), work=work,
                                            declared_units=declared, random_units=tuple(randoms))
            pages = [sum(units[i:i + SEQUENCES * RANGES]) / (SEQUENCES * RANGES)
                     for i in range(0, len(units), SEQUENCES * RANGES)]
            evaluations.append({"window": window, "hotkey": hotkey, "delta_assigned": sum(units) / len(units),
                                "delta_rand": rand, "pages": pages, "units": units, "random_units": randoms,
                                "work": work, "declared_units": declared})
        book.record_primary(rules, results, window=window)
    (root / "nodes" / "validator0" / "evaluations.jsonl").write_text("\n".join(map(json.dumps, evaluations)))
    peers = {h: {"assigned_credit": r.assigned_credit, "declared_credit": r.declared_credit} for h, r in book.peers.items()}
    (root / "nodes" / "validator0" / "scorebook.json").write_text(json.dumps({"peers": peers}))
    return root


def test_declared_classes_are_the_books_and_their_separation_is_counted(tmp_path: Path) -> None:
    """The page classes replayed are the book's EMAs (and would not be under another γ); trained declared
    pages show credit and untrained ones none; on quiet units a few evaluations tell them apart, on noisy
    units the EMA never does under production's γ."""
    rules = load_hparams(PRESET).gauntlet
    quiet = credit_spread.replay([_declaring_run(tmp_path / "quiet", 12, unit_noise=0.01)], rules)
    work = credit_spread.declared_work(quiet, rules)
    assert {row["strategy"] for row in work["peers"]} == {"moredata", "overclaim"}
    assert all(row["book_difference"] < 1e-12 and row["evaluations"] == 12 for row in work["peers"]), work["peers"]
    other_gamma = rules.model_copy(update={"mu_gamma": 0.5})
    assert all(row["book_difference"] > 1e-3 for row in credit_spread.declared_work(quiet, other_gamma)["peers"])
    by = work["strategies"]
    assert by["moredata"]["declared_mean"] > 0.5 and abs(by["overclaim"]["declared_mean"]) < 0.2, by
    trained = {row["strategy"]: row["trained_multiple"] for row in work["peers"]}
    assert trained["moredata"] > 1.9 and trained["overclaim"] < 1.2, trained
    separation = work["separation"]
    assert separation["difference"] > 0.5 and separation["evaluations_needed"] is not None
    assert separation["evaluations_needed"] <= 3, separation

    noisy = credit_spread.replay([_declaring_run(tmp_path / "noisy", 12, unit_noise=0.8)], rules)
    far = credit_spread.declared_work(noisy, rules)["separation"]
    assert far["n_eff_needed"] > far["n_eff_bound"] and far["evaluations_needed"] is None, far


def test_an_honest_miners_evaluations_follow_its_windows_in_the_top_g(tmp_path: Path) -> None:
    nodes = [{"name": "validator0", "hotkey": "v", "role": "validator", "strategy": "lead"},
             {"name": "a", "hotkey": "a", "role": "miner", "strategy": "honest"},
             {"name": "b", "hotkey": "b", "role": "miner", "strategy": "honest"},
             {"name": "c", "hotkey": "c", "role": "miner", "strategy": "honest"},
             {"name": "x", "hotkey": "x", "role": "miner", "strategy": "lazy"}]
    (tmp_path / "nodes" / "validator0").mkdir(parents=True)
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    top = {"a": range(8), "b": range(4), "c": (), "x": range(8)}
    evaluated = {"a": {0, 1, 2, 4, 5, 7}, "b": {1, 3, 6, 7}, "c": {2, 5}, "x": {0}}
    left_out = {"a": set(), "b": {5}, "c": {0, 3, 6}, "x": set()}
    rows = [{"window": w, "hotkey": h, "evaluated": w in evaluated[h], "in_top_g": w in top[h],
             "status": "not-sampled" if w in left_out[h] else "ok"} for w in range(8) for h in top]
    (tmp_path / "nodes" / "validator0" / "scores.jsonl").write_text("\n".join(map(json.dumps, rows)))
    follow = credit_spread.evaluations_follow_the_peer_list([tmp_path])
    assert [(r["name"], r["evaluations"], r["top_g_windows"], r["not_sampled_windows"]) for r in follow["miners"]] == [
        ("a", 6, 8, 0), ("b", 4, 4, 1), ("c", 2, 0, 3)]
    assert follow["evaluations_vs_top_g_windows"] > 0.9


def test_levelling_each_credit_by_its_window_takes_out_which_windows_drew_a_miner() -> None:
    """Two miners doing the same work, one drawn in the windows where credit ran high and one where it
    ran low, differ in μ; levelled by the windows' honest credit they do not."""
    level = {w: 0.8 if w % 2 else 0.4 for w in range(8)}
    drawn = {"high": [1, 3, 5, 7], "low": [0, 2, 4, 6], "every": list(range(8))}
    evaluations = [credit_spread.Evaluation(("run", "validator0", w), hotkey, "honest", 1, (level[w],) * 4)
                   for hotkey, windows in drawn.items() for w in windows]
    rows = {r["hotkey"]: r for r in credit_spread.when_evaluated(evaluations, 0.9)}
    assert rows["high"]["mu"] - rows["low"]["mu"] == pytest.approx(0.4)
    assert {round(r["mu_window_levelled"], 9) for r in rows.values()} == {0.6}
    assert rows["every"]["evaluations"] == 8
