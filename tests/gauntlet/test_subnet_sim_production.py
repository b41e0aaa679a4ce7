"""The subnet simulator speaks for production: its rules are read from the run's hparams, and a fit
of whole evaluations is drawn at the size production's validator reads, changing only the part of
an evaluation's spread that is the sampling of the sequences read."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.incentive import subnet_sim, subnet_sim_fit, subnet_sim_production
from benchmarks.incentive.subnet_sim_fit import EvalSize
from templar.core.config import load_hparams
from templar.gauntlet import eval_sequences_read

PRESETS = Path(__file__).resolve().parents[2] / "benchmarks" / "presets"


def test_the_simulators_production_is_the_shipped_hparams() -> None:
    """`CHOSEN` is read from hparams.json, so the rules a simulation scores with are production's
    field for field, and a preset's settings give that preset's rules."""
    production = load_hparams()
    assert subnet_sim_production.production_settings(production) == subnet_sim.CHOSEN
    assert subnet_sim.SimConfig(**subnet_sim.CHOSEN).gauntlet() == production.gauntlet
    crowded = load_hparams(str(PRESETS / "micro_gauntlet_8pages.json"))
    settings = subnet_sim_production.production_settings(crowded)
    rules = subnet_sim.SimConfig(**settings).gauntlet()
    assert all(getattr(rules, key) == getattr(crowded.gauntlet, key) for key in subnet_sim_production.RULE_FIELDS.values())
    assert rules.loss_rating == crowded.gauntlet.loss_rating


def test_production_reads_16_sequences_of_one_page_and_the_crowded_fit_what_it_recorded() -> None:
    """Production's validator reads 16 of its evaluated page's 64 sequences and the random page whole,
    4 units each; the crowded preset 1 of each of 8 pages' 4 sequences, as its fit recorded."""
    assert subnet_sim_production.production_size(load_hparams()) == EvalSize(16, 64, 4)
    assert [eval_sequences_read(64, n) for n in (0, 16, 64, 99)] == [64, 16, 64, 64]
    with pytest.raises(ValueError):
        eval_sequences_read(4, -1)
    crowded = subnet_sim_production.production_size(load_hparams(str(PRESETS / "micro_gauntlet_8pages.json")))
    spread = subnet_sim_fit.spread_sources(subnet_sim_fit.fit(subnet_sim_fit.UNITS_FIT_FILE), "honest", crowded.ranges)
    assert (spread["assigned_sequences"], spread["random_sequences"]) == (crowded.assigned_sequences,
                                                                          crowded.random_sequences) == (8, 32)
    source = subnet_sim_fit.fit(subnet_sim_fit.UNITS_FIT_FILE)
    assert subnet_sim_fit.size_scales(source, "honest", crowded) == (1.0, 1.0)


def _fit(between: float, within: float, sequences: int, n: int = 2000, seed: int = 0) -> dict:
    """A synthetic fit of whole evaluations: each evaluation's level lies `between` from the mean,
    its sequences `within` from its level (one unit per sequence), its random units alike."""
    rng = random.Random(seed)
    evaluations = []
    for _ in range(n):
        level, rand_level = rng.gauss(0, between), rng.gauss(0, between)
        units = [1.0 + level + rng.gauss(0, within) for _ in range(sequences)]
        random_units = [1.0 + rand_level + rng.gauss(0, within) for _ in range(sequences)]
        rand = statistics.fmean(random_units)
        evaluations.append([rand, statistics.fmean(units) - rand, [], units, random_units, 1.0, 0])
    gaps, rands = [e[1] for e in evaluations], [e[0] for e in evaluations]
    return {"summary": {"honest": {"rand_mean_sd": [statistics.fmean(rands), statistics.stdev(rands)],
                                   "gap_mean_sd": [statistics.fmean(gaps), statistics.stdev(gaps)]}},
            "evaluations": {"honest": evaluations}}


def test_more_sequences_quieten_only_the_sampling_part_of_the_spread() -> None:
    """All spread from sampling: twice the sequences scale it by √½; none from sampling: nothing
    changes; fewer sequences than fitted widen it; the measured share sets the scale in between."""
    sampling_only = _fit(between=0.0, within=0.2, sequences=8)
    gap, rand = subnet_sim_fit.size_scales(sampling_only, "honest", EvalSize(16, 16, 1))
    assert gap == pytest.approx(0.5 ** 0.5, abs=0.03) and rand == pytest.approx(0.5 ** 0.5, abs=0.03)
    assert subnet_sim_fit.size_scales(sampling_only, "honest", EvalSize(4, 4, 1))[0] > 1.3
    no_sampling = _fit(between=0.2, within=0.0, sequences=8, seed=1)
    assert subnet_sim_fit.size_scales(no_sampling, "honest", EvalSize(16, 16, 1)) == (1.0, 1.0)
    mixed = _fit(between=0.1, within=0.2 * 8 ** 0.5 / 2, sequences=8, seed=2)  # half-ish of it sampling
    gap, _ = subnet_sim_fit.size_scales(mixed, "honest", EvalSize(16, 16, 1))
    assert 0.5 ** 0.5 + 0.03 < gap < 0.97


def test_a_draw_at_production_size_keeps_the_means_and_each_units_own_scatter() -> None:
    """At another size the evaluation's level moves toward the strategy's mean by the size's scale
    and every unit keeps its offset from that level: the mean is production's, the units measured."""
    source = _fit(between=0.0, within=0.2, sequences=8, seed=3)
    size = EvalSize(32, 32, 1)
    as_fitted = subnet_sim_fit.draw("honest", random.Random(5), source=source)
    resized = subnet_sim_fit.draw("honest", random.Random(5), source=source, size=size)
    gap_scale, rand_scale = subnet_sim_fit.size_scales(source, "honest", size)
    (mr, _), (mg, _) = source["summary"]["honest"]["rand_mean_sd"], source["summary"]["honest"]["gap_mean_sd"]
    scale = subnet_sim_fit.LOSS_SCALE
    assert resized.delta_rand / scale - mr == pytest.approx((as_fitted.delta_rand / scale - mr) * rand_scale)
    gap = (as_fitted.delta_assigned - as_fitted.delta_rand) / scale
    assert (resized.delta_assigned - resized.delta_rand) / scale - mg == pytest.approx((gap - mg) * gap_scale)
    offsets = [(u - as_fitted.delta_assigned) for u in as_fitted.sequences]
    assert [(u - resized.delta_assigned) for u in resized.sequences] == pytest.approx(offsets)


def test_a_simulation_at_production_size_runs_on_the_committed_fit() -> None:
    """Production's fit at production's size, a few windows: honest peers are paid, cheats are not."""
    cfg = replace(subnet_sim.SimConfig(), **subnet_sim.CHOSEN, uids=64, per_class=2, fast_eval_uids=16, windows=16,
                  join_window=6, fit_file=str(subnet_sim_fit.UNITS_FIT_FILE))
    assert cfg.eval_size == EvalSize(16, 64, 4)
    share = subnet_sim.simulate(cfg).metrics["share"]
    assert share["honest"] + share["moredata"] + share["newcomer"] > 0.8
    assert sum(share[c] for c in subnet_sim.CHEATS) < 0.1


def _localnet(tmp_path: Path, honest_weights: list[float]) -> Path:
    """A localnet's out folder as `fair_pay.summarise` reads it: a validator, honest miners with the
    given weight in every window, `moredata`, a pool of 3 and a `partial` miner (never evaluated)."""
    import json

    miners = [(f"honest{i}", "honest", w) for i, w in enumerate(honest_weights)]
    miners += [("moredata0", "moredata", 0.3), ("pooled0-a", "pooled", 0.1), ("pooled0-b", "pooled", 0.0),
               ("pooled0-c", "pooled", 0.0), ("partial0", "partial", 0.0)]
    nodes = [{"name": "validator0", "role": "validator", "strategy": "honest", "hotkey": "v"}]
    nodes += [{"name": n, "role": "miner", "strategy": s, "hotkey": n} for n, s, _ in miners]
    peers = [{"name": n, "role": "miner", "strategy": s, "trained_tokens": 1000,
              "weight_history": [[w, weight] for w in range(8)]} for n, s, weight in miners]
    (tmp_path / "nodes.json").write_text(json.dumps(nodes))
    (tmp_path / "report.json").write_text(json.dumps({"peers": peers}))
    return tmp_path


def test_a_localnets_shape_runs_through_the_simulator_and_its_residual_is_measured(tmp_path) -> None:
    """`subnet_sim_residuals`: a localnet's mix is drawn by the fit's strategies (one hotkey of a pool
    rated, never-evaluated miners as copycats), simulated at its shape, and the localnet's figures are
    set against the simulator's: the residual is the localnet's less the simulator's median."""
    from benchmarks.incentive import subnet_sim_residuals as residuals

    run = _localnet(tmp_path, [0.2, 0.25, 0.3, 0.2])
    source = subnet_sim_fit.fit(subnet_sim_fit.UNITS_FIT_FILE)
    evaluated = residuals.drawn_as_themselves(source)
    assert len(source["evaluations"]["scaled"]) == 1 and "scaled" not in evaluated and "honest" in evaluated
    mix = dict(residuals.localnet_mix(run, evaluated))
    assert mix == {"honest": 4, "moredata": 1, "pooled": 1, "copycat": 3}
    assert dict(residuals.localnet_mix(run, evaluated | {"partial"}))["copycat"] == 2
    peers = subnet_sim.build_peers(replace(subnet_sim.SimConfig(), validators=1, uids=10,
                                           mix=tuple(sorted(mix.items()))), random.Random(0))
    assert sorted(p.strategy for p in peers[1:]) == sorted(s for s, n in mix.items() for _ in range(n))

    rows = residuals.residuals([run], str(PRESETS / "micro_gauntlet_8pages.json"), sims=4)
    spread = rows[run.name]["honest_max_over_min"]
    assert spread["localnet"] == pytest.approx(1.5)
    assert spread["residual"] == pytest.approx(spread["localnet"] - spread["simulator_median"])
    assert spread["simulator_median"] >= 1.0 and 0.0 <= spread["simulator_at_or_below_localnet"] <= 1.0
    assert rows[run.name]["moredata_over_honest"]["simulator_median"] > 0
    pooled = rows[run.name]["per_token_over_weakest_honest"]["pooled"]  # every miner trained as many tokens here
    assert 0.0 <= pooled["simulator_median"] <= pooled["simulator_max"]
    assert 0.0 <= pooled["simulator_above_weakest_honest"] <= 1.0
    assert residuals.work_shares(run) == {"honest": 1.0, "moredata": 1.0, "pooled": 1.0, "partial": 1.0}
    above = rows[run.name]["any_adversary_above"]
    assert 0.0 <= above["weakest_honest"] <= above["verdict_ceiling"] <= 1.0


def test_the_share_of_seeds_an_adversary_is_paid_above_the_verdicts_ceiling_leaves_out_honest_compute() -> None:
    """`subnet_sim_residuals.adversaries_above`: a seed counts when any adversary the crowded localnet's verdict
    holds to its ceiling is paid more per token than it (or than the weakest honest miner); `moredata` and
    `overfit`, honest compute, never count."""
    from benchmarks.incentive import subnet_sim_residuals as residuals
    from benchmarks.incentive.fair_pay import CHEAT_PER_TOKEN_MAX

    sims = [{"per_token_over_weakest_honest": tokens} for tokens in (
        {"thin": 0.1, "short": CHEAT_PER_TOKEN_MAX + 0.01},  # above the ceiling, below the weakest honest miner
        {"thin": 1.2},                                        # above both
        {"overfit": 3.0, "moredata": 2.0, "pooled": 0.2},    # honest compute far above: no count
        {"thin": CHEAT_PER_TOKEN_MAX})]                       # at the ceiling: within it
    assert residuals.adversaries_above(sims) == {"verdict_ceiling": 0.5, "weakest_honest": 0.25}
