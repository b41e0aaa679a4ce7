"""`benchmarks/incentive/subnet_sim.py` stays runnable: a few windows of the real Gauntlet code through Yuma."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from tests.rules import gauntlet_rules

from benchmarks.incentive import subnet_sim, subnet_sim_fit


def test_quick_simulation_pays_honest_peers_and_reports_every_metric() -> None:
    """64 uids, 2 validators, 16 windows: honest peers earn most of the incentive, cheats little."""
    base = replace(subnet_sim.SimConfig(), uids=64, per_class=2, fast_eval_uids=16, windows=16, join_window=6)
    for cfg in (base, replace(base, **subnet_sim.CHOSEN)):
        outcome = subnet_sim.simulate(cfg, keep_series=True)
        m = outcome.metrics
        share = m["share"]
        assert sum(share.values()) == pytest.approx(1.0, abs=1e-6)
        assert share["honest"] + share["moredata"] + share["newcomer"] > 0.8
        assert sum(share[c] for c in subnet_sim.CHEATS) < 0.2
        assert 0.0 <= m["agreement_mean"] <= 1.0 and 0.0 <= m["vtrust_min"] <= 1.0
        assert m["newcomer_first_weight_windows"] is not None
        assert len(outcome.series["agreement"]) == cfg.windows


def test_fit_file_holds_every_strategy_the_draws_need() -> None:
    fit = subnet_sim.fit()
    assert {"honest", "moredata", "lazy", "noise"} <= set(fit["samples"])
    assert all(len(pairs) >= 20 for pairs in fit["samples"].values())


def test_freak_draw_scales_both_loss_scores() -> None:
    """The jump scenario's freak evaluation is the calm draw times `freak_scale` (same rng state)."""
    import random

    calm = subnet_sim_fit.draw("honest", random.Random(3))
    rng = random.Random(3)
    freak = subnet_sim_fit.draw("honest", rng, freak_rate=1.0, freak_scale=3.0)
    assert freak.delta_rand == pytest.approx(3.0 * calm.delta_rand)
    assert freak.delta_assigned == pytest.approx(3.0 * calm.delta_assigned)


def test_a_replayed_clip_is_passed_in_as_the_rules() -> None:
    """`rating_clip_high` replays an older clip inside one simulation only: it reaches the book as
    the rules every window is scored by, and no module holds a setting that outlives the run."""
    from templar.gauntlet import window as window_module

    seen = []
    original = window_module.ScoreBook.record_primary

    def spy(book, rules, results, **kwargs):
        seen.append((rules.relative_clip_low, rules.relative_clip_high))
        return original(book, rules, results, **kwargs)

    cfg = replace(subnet_sim.SimConfig(), uids=13, validators=2, per_class=1, fast_eval_uids=16, uids_per_window=10,
                  windows=2, join_window=1, rating_clip_high=4.0, **subnet_sim.CHOSEN)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(window_module.ScoreBook, "record_primary", spy)
        subnet_sim.simulate(cfg)
    assert seen and all(clip == (-1.0, 4.0) for clip in seen)
    assert replace(cfg, rating_clip_high=None).gauntlet().relative_clip_high == 2.0  # production's


def test_newcomers_join_over_one_tempo_and_reach_the_median_within_rounding() -> None:
    """With epochs every tempo, newcomers register at evenly spread points of the epoch cycle, and
    an incentive equal to the honest median up to float rounding counts as at the median (the
    exact `>=` read identical peers' 1e-16 differences as 'below' for whole epochs)."""
    import random

    import numpy as np

    cfg = replace(subnet_sim.SimConfig(), uids=16, validators=1, per_class=2, windows=40, join_window=10,
                  tempo_windows=10)
    assert [subnet_sim.join_window(cfg, i) for i in range(cfg.per_class)] == [10, 15]
    assert subnet_sim.join_window(replace(cfg, tempo_windows=1), 1) == 10  # every window an epoch: all at once
    peers = subnet_sim.build_peers(cfg, random.Random(0))
    newcomers = [p for p in peers if p.strategy == "newcomer"]
    honest = [p.uid for p in peers if p.strategy == "honest"]
    inc = np.zeros((cfg.windows, cfg.uids))
    lead = np.zeros((cfg.windows, cfg.uids))
    inc[:, honest] = 0.1
    for p in newcomers:
        lead[p.joins + 2:, p.uid] = 0.1  # the lead weights it 2 windows after it joins
    inc[20:, newcomers[0].uid] = 0.1 * (1 - 1e-15)  # the epoch at 20: the median, up to rounding
    inc[30:, newcomers[1].uid] = 0.1 * 0.9  # below the median: never counted as there
    m = subnet_sim.metrics(cfg, peers, inc, [1.0] * cfg.windows, np.ones((cfg.windows, 1)), lead)
    # 20 - 10 for the first; the second never gets there and counts as the rest of the run (30)
    assert m["newcomer_honest_median_windows_worst"] == 30 and m["newcomers_never_at_median"] == 1
    assert m["newcomer_first_lead_weight_windows"] == 2
    # what each is paid at the first epoch that pays it, over the honest median then: 1.0 and 0.9
    assert m["newcomer_first_pay_over_median"] == pytest.approx(0.95)
    assert m["newcomer_first_pay_over_median_range"] == pytest.approx([0.9, 1.0])
    # one newcomer of two at the median at its first paid epoch; every incumbent at the median then
    assert m["newcomers_at_median_first_pay"] == 0.5 and m["incumbents_at_median_at_newcomers_first_pay"] == 1.0
    # The placebo: one incumbent per newcomer, read from the window the newcomer was first paid in (20 and 30)
    # and counted from its join (10 and 15): at the median at once, 10 and 15 windows, median 12.5 ...
    assert m["placebo_honest_median_windows"] == 12.5
    # ... and the first newcomer's incumbent below the median until window 25: 15 and 15
    inc[:25, honest[0]] = 0.09
    m = subnet_sim.metrics(cfg, peers, inc, [1.0] * cfg.windows, np.ones((cfg.windows, 1)), lead)
    assert m["placebo_honest_median_windows"] == 15


def test_epochs_read_the_weights_last_submitted(monkeypatch) -> None:
    """`weights_windows`: the validators submit every N windows (finney: 15) and an epoch in between
    reads the last submission, so incentive holds still until the next one; every window: it moves."""
    import numpy as np

    seen = {}
    original = subnet_sim.metrics

    def spy(cfg, peers, inc, *rest):
        seen[cfg.weights_windows] = inc.copy()
        return original(cfg, peers, inc, *rest)

    monkeypatch.setattr(subnet_sim, "metrics", spy)
    base = replace(subnet_sim.SimConfig(), uids=24, per_class=1, fast_eval_uids=16, windows=12, join_window=4,
                   **subnet_sim.CHOSEN)
    for every in (1, 5):
        subnet_sim.simulate(replace(base, weights_windows=every))
    held, live = seen[5], seen[1]
    for start in (0, 5, 10):  # submissions at 0, 5, 10: each holds until the next
        stop = min(start + 5, base.windows)
        assert all(np.array_equal(held[w], held[start]) for w in range(start, stop))
    assert any(not np.array_equal(live[w], live[w - 1]) for w in range(1, 5))
    assert np.array_equal(held[0], live[0]) and np.array_equal(held[5], live[5])


def test_the_validators_submit_when_production_does_counted_back_from_each_epoch() -> None:
    """At finney's cadence (an epoch every 51 windows, here at 102 and 153; weights every 15) the simulator
    submits with production's `WeightsCadence`: the epoch at 153 reads the book of window 151."""
    cfg = replace(subnet_sim.SimConfig(), tempo_windows=51, weights_windows=15)
    assert [w for w in range(102, 153) if subnet_sim.weights_cadence(cfg).due(w)] == [121, 136, 151]
    before = replace(cfg, weights_at_epochs=False)
    assert [w for w in range(102, 153) if subnet_sim.weights_cadence(before).due(w)] == [105, 120, 135, 150]


def test_the_weighed_windows_candidate_counts_a_noisy_window_less() -> None:
    """`WeighedWindowsBook` (simulator-only) and the production `ScoreBook` see the same relative
    LossScores; after a calm window and a noisy one, production's mean moves by the EMA's weight,
    the candidate's by the noisy window's precision share, and with equal spreads they agree."""
    from templar.gauntlet import PrimaryResult, ScoreBook

    rules = gauntlet_rules(loss_rating="relative", rating_gamma=0.9, rating_tie_band=3.5, rating_exponent=10.0,
                           rating_cap=None, mu_gamma=0.9, openskill_beta=25 / 6, openskill_tau=25 / 300)

    def run(book, windows):
        for uid, hotkey in enumerate("abcd"):
            book.get_or_create(hotkey, uid, window=0)
        for window, values in enumerate(windows):
            book.record_primary(rules, {hk: PrimaryResult(v + 0.01, v) for hk, v in zip("abcd", values, strict=True)},
                                window=window)
        return book

    calm, noisy = (0.100, 0.102, 0.098, 0.100), (0.010, 0.020, 0.004, 0.010)  # b: 1.02, then 2.0
    production, weighed = run(ScoreBook(), (calm, noisy)), run(subnet_sim.WeighedWindowsBook(), (calm, noisy))
    assert production.peers["b"].relative_delta == pytest.approx(1.02 + 0.98 * 0.1 / (1 - 0.81))
    # calm: spread 1.4826·0.01, precision 1/0.014826²; noisy: spread 0.4448 → mean moves by 0.98·(p2/W)
    p1, p2 = 1 / 0.014826**2, 1 / 0.44478**2
    mean, weight, _ = weighed.weighed[1]
    assert weight == pytest.approx(0.9 * p1 + p2, rel=1e-3)
    assert mean == pytest.approx(1.02 + 0.98 * p2 / (0.9 * p1 + p2), rel=1e-3)
    same = run(subnet_sim.WeighedWindowsBook(), (calm, calm))
    again = run(ScoreBook(), (calm, calm))
    assert {hk: same.loss_rating(rules, hk) for hk in "abcd"} == pytest.approx(
        {hk: again.loss_rating(rules, hk) for hk in "abcd"})
    cfg = replace(subnet_sim.SimConfig(), uids=24, per_class=1, fast_eval_uids=16, windows=6, join_window=2,
                  window_noise=0.94, **subnet_sim.CHOSEN)
    for weighed_windows in (False, True):  # both run end to end with noisy windows
        metrics = subnet_sim.simulate(replace(cfg, weighed_windows=weighed_windows)).metrics
        assert 0.0 <= metrics["agreement_mean"] <= 1.0


def test_gpu_noise_comes_from_the_committed_measurement() -> None:
    """`subnet_sim_gpu_noise` reads the simulator's noise from the GPU run's noise phase, and the
    bracket at production's pages shrinks it by √(29 / the pages the GPU's peers trained)."""
    import json
    import math

    from benchmarks.incentive import subnet_sim_gpu_noise as gpu_noise

    measured = gpu_noise.measured_noise()
    noise = json.loads(gpu_noise.GPU_RESULT.read_text())["phases"]["noise"]
    assert measured["noise"] == noise["subnet_sim_noise"] > 1.0
    assert measured["noise_at_production_pages"] == pytest.approx(
        measured["noise"] * math.sqrt(measured["pages_per_peer"] / gpu_noise.PRODUCTION_PAGES))
    assert 0.0 < measured["gap_over_rand"] < 0.05  # 1.2B, 48 steps from θ0: the assigned pages' extra gain is small


def _evaluations_run(root, seed: int):
    """A localnet folder as `--record-evaluations` leaves it: nodes.json and one validator's
    evaluations.jsonl, 6 windows of honest, moredata (twice the pages, declared), lazy and noise."""
    import json
    import random

    rng = random.Random(seed)
    strategies = {"miner0": "honest", "miner1": "honest", "moredata0": "moredata", "lazy0": "lazy", "noise0": "noise"}
    nodes = [{"name": "validator0", "role": "validator", "hotkey": "hv", "strategy": "lead"}]
    nodes += [{"name": n, "role": "miner", "hotkey": f"h{n}", "strategy": s} for n, s in strategies.items()]
    run = root / f"run{seed}"
    (run / "nodes" / "validator0").mkdir(parents=True)
    (run / "nodes.json").write_text(json.dumps(nodes))
    gaps = {"honest": 0.01, "moredata": 0.006, "lazy": 0.0, "noise": 0.0}
    lines = []
    for window in range(6):
        for name, strategy in strategies.items():
            rand = (0.0005 if strategy == "noise" else 0.02) + rng.gauss(0, 0.001)
            declared = 8 if strategy == "moredata" else 0
            units = [rand + gaps[strategy] + rng.gauss(0, 0.004) for _ in range(8 + declared)]
            lines.append(json.dumps({"window": window, "hotkey": f"h{name}", "uid": 1, "delta_rand": rand,
                                     "delta_assigned": sum(units) / len(units), "pages": [sum(units) / len(units)],
                                     "units": units, "random_units": [rand + rng.gauss(0, 0.004) for _ in range(8)],
                                     "work": 2.0 if declared else 1.0, "declared_units": declared}))
    (run / "nodes" / "validator0" / "evaluations.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_a_fit_of_whole_evaluations_drives_the_score_book_with_every_unit(tmp_path) -> None:
    """`fit_from_evaluations` keeps every unit relative to the window's honest δ_rand, `draw` hands
    the score book a PrimaryResult with them (declared work too), and a simulation runs on it."""
    import json
    import random

    from benchmarks.incentive.subnet_sim_fit import fit_from_evaluations

    fitted = fit_from_evaluations([_evaluations_run(tmp_path, s) for s in (0, 1)], "synthetic")
    assert set(fitted["evaluations"]) == {"honest", "moredata", "lazy", "noise"}
    assert fitted["summary"]["honest"]["rand_mean_sd"][0] == pytest.approx(1.0, abs=1e-3)
    *_, units, random_units, work, declared = fitted["evaluations"]["moredata"][0]
    assert (len(units), work, declared, len(random_units)) == (16, 2.0, 8, 8)
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(fitted))

    result = subnet_sim_fit.draw("moredata", random.Random(0), source=fitted)
    assert len(result.sequences) == 16 and result.work == 2.0 and result.declared_units == 8
    assert result.delta_rand > 0 and len(result.random_units) == 8
    wider = subnet_sim_fit.draw("moredata", random.Random(0), noise=2.0, source=fitted)
    assert wider.delta_rand - subnet_sim_fit.LOSS_SCALE * fitted["summary"]["moredata"]["rand_mean_sd"][0] == \
        pytest.approx(2.0 * (result.delta_rand - subnet_sim_fit.LOSS_SCALE * fitted["summary"]["moredata"]["rand_mean_sd"][0]))

    cfg = replace(subnet_sim.SimConfig(), **subnet_sim.CHOSEN, uids=64, per_class=2, fast_eval_uids=16, windows=16,
                  join_window=6, fit_file=str(path))
    share = subnet_sim.simulate(cfg).metrics["share"]
    assert share["honest"] + share["moredata"] + share["newcomer"] > 0.8
    assert share["lazy"] + share["noise"] < 0.1


def test_a_newcomers_first_epoch_is_read_as_each_validator_scores_it() -> None:
    """`book_readings` says what a validator's book lacked to pay a peer as the median: not yet
    evaluated, its μ̃ (the proof) or its LossRating; `first_epoch_metrics` counts them per validator,
    the newcomers' and the incumbents' of the same submissions apart."""
    from collections import Counter

    from benchmarks.incentive.subnet_sim_first_epoch import (
        at_median_share,
        book_readings,
        first_epoch_metrics,
    )
    from templar.core.config import load_hparams
    from templar.gauntlet import ScoreBook

    rules = load_hparams().gauntlet
    book = ScoreBook(relative_noise=(0.05, 20))
    states = {"h0": (0.6, 1.0), "h1": (0.6, 1.0), "h2": (0.6, 1.0), "same": (0.6, 1.0), "lazy": (0.05, 1.0),
              "short": (0.6, 0.5)}
    for uid, (hotkey, (mu, relative)) in enumerate(states.items()):
        record = book.get_or_create(hotkey, uid, 0)
        record.mu, record.primary_evals, record.relative_delta, record.relative_evals = mu, 20, relative, 20
    readings = book_readings(book, rules, ["same", "lazy", "short", "unseen"], ["h0", "h1", "h2"])
    assert readings == ["at the median", "proof", "rating", "not evaluated"]
    assert book_readings(book, rules, ["h0", "h1", "h2"], ["h0", "h1", "h2"]) == ["at the median"] * 3
    incumbents = Counter({"at the median": 5, "rating": 1})
    counts = first_epoch_metrics({"a": ("at the median", "at the median"), "b": ("at the median", "rating")}, incumbents)
    assert counts["newcomers_at_median_first_epoch"] == 1 and counts["newcomers_with_first_epoch"] == 2
    assert counts["newcomer_first_epoch_readings"] == {"at the median": 3, "proof": 0, "rating": 1, "not evaluated": 0}
    assert counts["incumbent_first_epoch_readings"] == {"at the median": 5, "proof": 0, "rating": 1, "not evaluated": 0}
    assert at_median_share(counts["newcomer_first_epoch_readings"]) == 0.75
    assert at_median_share(counts["incumbent_first_epoch_readings"]) == 5 / 6


def test_the_quick_run_reads_every_newcomers_first_epoch_in_every_book() -> None:
    base = replace(subnet_sim.SimConfig(), uids=64, per_class=2, fast_eval_uids=16, windows=40, join_window=10,
                   tempo_windows=8, weights_windows=3, **subnet_sim.CHOSEN)
    m = subnet_sim.simulate(base).metrics
    assert m["newcomers_with_first_epoch"] == base.per_class
    assert sum(m["newcomer_first_epoch_readings"].values()) == base.per_class * base.validators
    assert 0 <= m["newcomers_at_median_first_epoch"] <= base.per_class
    # Beside them, every identical incumbent in every book of each submission a newcomer's first epoch read.
    honest = sum(p.strategy == "honest" for p in subnet_sim.build_peers(base, random.Random(base.seed)))
    incumbents = sum(m["incumbent_first_epoch_readings"].values())
    assert incumbents > 0 and incumbents % (honest * base.validators) == 0


def test_a_strategy_evaluated_once_is_fitted_with_no_spread(tmp_path, monkeypatch) -> None:
    """A crowded run's `scaled` upload is evaluated once (in the window before any typical size) and then
    fails fast evaluation: the fit keeps its one evaluation with a spread of 0 instead of stopping, and
    `subnet_sim_refit --spread` reads the other strategies' spread and passes over it."""
    import json

    from benchmarks.incentive.subnet_sim_fit import fit_from_evaluations

    run = _evaluations_run(tmp_path, 0)
    nodes = json.loads((run / "nodes.json").read_text())
    (run / "nodes.json").write_text(json.dumps([*nodes, {"name": "s", "role": "miner", "hotkey": "hs",
                                                         "strategy": "scaled"}]))
    once = {"window": 0, "hotkey": "hs", "uid": 9, "delta_rand": -5.0, "delta_assigned": -6.0, "pages": [-6.0],
            "units": [-6.0] * 8, "random_units": [-5.0] * 8, "work": 1.0, "declared_units": 0}
    with (run / "nodes" / "validator0" / "evaluations.jsonl").open("a") as f:
        f.write(json.dumps(once) + "\n")
    fitted = fit_from_evaluations([run], "synthetic")
    assert fitted["summary"]["scaled"]["n"] == 1 and fitted["summary"]["scaled"]["rand_mean_sd"][1] == 0.0
    assert fitted["summary"]["honest"]["rand_mean_sd"][1] > 0
    # drawn at another size than the fit read (production's), it is the one evaluation as measured
    from benchmarks.incentive.subnet_sim_fit import EvalSize, draw, size_scales

    production = EvalSize(16, 64, 4)
    assert size_scales(fitted, "scaled", production) == (1.0, 1.0)
    assert draw("scaled", random.Random(0), source=fitted, size=production).delta_rand == \
        draw("scaled", random.Random(0), source=fitted).delta_rand

    from benchmarks.incentive import subnet_sim_refit

    units = tmp_path / "units.json"
    units.write_text(json.dumps(fitted))
    monkeypatch.setattr(subnet_sim_refit, "RESULTS_DIR", tmp_path)
    assert subnet_sim_refit.spread(units) == 0
    rows = json.loads((tmp_path / "subnet_sim_refit_spread.json").read_text())["strategies"]
    assert "scaled" not in rows and rows["honest"]["evaluations"] > 1
