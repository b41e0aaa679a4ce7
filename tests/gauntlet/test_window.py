"""One window's scoring (`templar.gauntlet.score_window`): the step the validator and the simulator share."""

from __future__ import annotations

from dataclasses import replace

import pytest

from templar.gauntlet import FastVerdict, PrimaryResult, ScoreBook, Status, score_window

MINERS = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}


def test_verdicts_losses_and_pools_reach_the_book(gauntlet_cfg):
    book = ScoreBook()  # state only: the rules come with every call
    verdicts = {"a": FastVerdict(Status.OK, sync_steps=0.1), "b": FastVerdict(Status.OK),
                "c": FastVerdict(Status.MALFORMED, reason="bad_signature"), "d": FastVerdict(Status.WARMUP),
                "e": FastVerdict(Status.COPY, copied_from="b", pool=("b", "e"))}
    verdicts["b"] = replace(verdicts["b"], pool=("b", "e"))
    losses = {"a": PrimaryResult(0.3, 0.2), "b": PrimaryResult(0.3, 0.2)}
    scores = score_window(book, gauntlet_cfg, 10, MINERS, verdicts, losses)

    peers = book.peers
    assert peers["c"].last_status == "malformed:bad_signature" and peers["c"].fast_eval_fails == 1
    assert peers["d"].fast_eval_passes == 1 and peers["d"].last_status == "warmup"  # no penalty, no pay
    assert peers["a"].primary_evals == 1 and peers["a"].last_primary_window == 10 and peers["a"].mu > 0
    assert peers["a"].last_sync_steps == 0.1
    assert book.pools() == {"b": ["b", "e"], "e": ["b", "e"]}
    assert peers["b"].score == pytest.approx(peers["a"].score / 2)  # a pool is paid once
    assert set(scores.weights) == set(MINERS) and sum(scores.weights.values()) == pytest.approx(1.0)
    assert scores.top_g == ["a", "b"]  # one slot per pool; nobody unproven

    later = score_window(book, gauntlet_cfg, 10 + gauntlet_cfg.pool_memory + 1, MINERS, {"a": FastVerdict(Status.OK)},
                         {})
    assert book.pools() == {} and later.weights["b"] == pytest.approx(later.weights["a"])


def test_a_window_without_evaluations_only_recomputes_weights(gauntlet_cfg):
    book = ScoreBook()  # state only: the rules come with every call
    score_window(book, gauntlet_cfg, 3, MINERS, {"a": FastVerdict(Status.OK), "b": FastVerdict(Status.OK),
                                                 "c": FastVerdict(Status.OK)},
                 {"a": PrimaryResult(0.3, 0.2), "b": PrimaryResult(0.2, 0.2), "c": PrimaryResult(0.1, 0.2)})
    before = book.to_json()
    scores = score_window(book, gauntlet_cfg, 4, MINERS, {}, {})
    assert book.to_json() == before and scores.weights == book.weights(gauntlet_cfg)


def test_inputs_the_rules_cannot_take_are_refused_before_any_change(gauntlet_cfg):
    book = ScoreBook()  # state only: the rules come with every call
    with pytest.raises(ValueError, match="not miners"):
        score_window(book, gauntlet_cfg, 1, MINERS, {"stranger": FastVerdict(Status.OK)}, {})
    with pytest.raises(ValueError, match="cannot earn"):  # a LossScore for an upload fast evaluation failed
        score_window(book, gauntlet_cfg, 1, MINERS, {"a": FastVerdict(Status.DESYNC)}, {"a": PrimaryResult(1.0, 1.0)})
    with pytest.raises(ValueError, match="cannot earn"):  # warm-ups are never evaluated
        score_window(book, gauntlet_cfg, 1, MINERS, {"a": FastVerdict(Status.WARMUP)}, {"a": PrimaryResult(1.0, 1.0)})
    assert len(book) == 0


def test_every_status_knows_whether_it_passes_and_earns():
    assert {s for s in Status if s.earns} == {Status.OK}
    assert {s for s in Status if s.passes} == {Status.OK, Status.WARMUP, Status.NOT_SAMPLED}
    assert all(s.meaning for s in Status)
    assert Status.of_label("malformed:bad_signature") is Status.MALFORMED
    assert Status.of_label("no-such-status") is None
    assert FastVerdict(Status.MALFORMED, reason="oversize").label == "malformed:oversize"


def test_every_gather_failure_is_a_verdict():
    from templar.comms import GatherStatus

    assert {g.value for g in GatherStatus} <= {s.value for s in Status}


def test_the_simulator_scores_windows_with_the_validators_function(benchmark_module, monkeypatch):
    """A simulated result is a statement about production code: every window the simulator scores
    goes through the very function the validator's loop calls, and replaying the simulator's inputs
    through that function into a fresh book under the same rules gives the same book and the same
    weights."""
    import templar.validator.loop as validator_loop

    subnet_sim = benchmark_module("subnet_sim")
    assert subnet_sim.score_window is validator_loop.score_window is score_window
    cfg = replace(subnet_sim.SimConfig(), uids=40, validators=1, per_class=2, fast_eval_uids=12, windows=12,
                  join_window=4, **subnet_sim.CHOSEN)
    calls = []

    def spy(book, rules, window, miners, verdicts, losses):
        calls.append((rules, window, dict(miners), dict(verdicts), dict(losses)))
        result = score_window(book, rules, window, miners, verdicts, losses)
        calls[-1] += (book.to_json(), result)
        return result

    monkeypatch.setattr(subnet_sim, "score_window", spy)
    subnet_sim.simulate(cfg)
    assert len(calls) == cfg.windows

    replayed = ScoreBook()
    for rules, window, miners, verdicts, losses, sim_book, sim_result in calls:
        result = validator_loop.score_window(replayed, rules, window, miners, verdicts, losses)
        assert replayed.to_json() == sim_book
        assert result == sim_result
