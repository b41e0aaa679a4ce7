"""LossScore evaluation: matches a deep-copy reference and leaves θ_t untouched."""

import copy

import pytest
import torch

from templar.core.config import load_hparams
from templar.core.model import build_model, causal_lm_loss
from templar.runtime.train import accumulate_gradients, gradients
from templar.validator.evaluate import Evaluator


def _reference_delta(model, signs, beta, batch):
    trial = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in trial.named_parameters():
            p.sub_(signs[name], alpha=beta)
        return causal_lm_loss(model, batch).item() - causal_lm_loss(trial, batch).item()


def test_scores_match_reference_and_restore_model(tiny_pages):
    hp = load_hparams("tiny")
    model = build_model(hp)
    honest_data = tiny_pages.batch([10, 11])
    random_data = tiny_pages.batch([500])
    accumulate_gradients(model, honest_data, 8)
    honest = {n: torch.sign(g) for n, g in gradients(model).items()}
    lazy_data = tiny_pages.batch([900, 901])
    accumulate_gradients(model, lazy_data, 8)
    lazy = {n: torch.sign(g) for n, g in gradients(model).items()}
    model.zero_grad(set_to_none=True)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    beta = 1e-3
    scores = Evaluator(model, micro_batch_size=8, position_ranges=4).score_peers(
        {"honest": honest, "lazy": lazy}, {"honest": honest_data, "lazy": honest_data}, random_data, beta
    )
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name
    ref = _reference_delta(model, honest, beta, honest_data)
    assert abs(scores["honest"].delta_assigned - ref) < 1e-4
    # trained on exactly this data: the update helps there more than a lazy peer's does
    assert scores["honest"].delta_assigned > 0
    assert scores["honest"].delta_assigned > scores["lazy"].delta_assigned
    assert scores["honest"].loss_rand_before == scores["lazy"].loss_rand_before


def _scaled_payloads():
    """A maker of payloads of one compressed update at a given scale (only the size differs)."""
    from templar.compress import DCTCompressor
    from templar.wire import Gradient

    comp = DCTCompressor(64, 32)
    torch.manual_seed(0)
    base = torch.randn(128, 128)

    def payload(hotkey: str, scale: float) -> Gradient:
        return Gradient(window=1, global_step=0, hotkey=hotkey, warmup=False,
                        tensors={"w": comp.compress(base * scale)}, probes={}, digest=b"", nbytes=0)

    return payload


def test_norm_outliers_flag_only_shouting_peers_against_the_aggregates_typical_size():
    from templar.validator.fast_eval import norm_outliers, typical_payloads
    from templar.wire import Gradient

    payload = _scaled_payloads()

    def sizes(listed: list[Gradient], paid: dict[str, float]) -> tuple[str, str, int]:
        found = typical_payloads(listed, paid)
        assert found is not None
        return found.smaller.hotkey, found.larger.hotkey, found.peers

    a, b, c = payload("a", 1.0), payload("b", 2.0), payload("c", 1.5)
    faint = {f"faint{i}": payload(f"faint{i}", 1e-6) for i in range(6)}
    uploads = {"a": a, "b": b, "new": payload("new", 1e-3), "shout": payload("shout", 1e4), **faint}
    assert sizes([a, b, c], {}) == ("c", "c", 3)  # the lower median of the aggregate's three
    assert norm_outliers(uploads, c, 1000.0) == ["shout"]  # the quiet newcomer is not flagged
    # the yardstick is the aggregate's, not the window's: six near-zero uploads (most of the window) made
    # the median of the uploads 1e-6 of an update, and every honest upload was `scale`
    assert sizes(list(uploads.values()), {})[1] == "faint4"  # the lower median of ten
    assert norm_outliers(uploads, faint["faint4"], 1000.0) == ["a", "b", "new", "shout"]
    assert typical_payloads([], {}) is None and norm_outliers(uploads, None, 1000.0) == []
    # near-zero hotkeys holding half of the list's slots but none of its pay: the counted median is theirs
    # (the size the outer step clips to, so a trial step's), the scale check judges by the paid one
    listed = [a, b, faint["faint0"], faint["faint1"]]
    assert sizes(listed, {}) == ("faint1", "faint1", 4)
    assert sizes(listed, {"a": 0.5, "b": 0.5, "faint0": 1e-14}) == ("faint1", "a", 4)
    assert sizes(listed, {"a": 0.2, "b": 0.2, "faint0": 0.3, "faint1": 0.3}) == ("faint1", "faint1", 4)  # half the pay
    # an upload three times as loud, rated in a window without a reference, holding most of the pay: the
    # weighted median is its own, the counted one an honest peer's; a trial step is clipped to the smaller
    loud = payload("loud", 3.0)
    assert sizes([a, b, c, loud], {"loud": 0.58, "a": 0.14, "b": 0.14, "c": 0.14}) == ("c", "loud", 4)
    assert sizes([loud], {"loud": 1.0}) == ("loud", "loud", 1)
    assert sizes([payload("zero", 0.0), a], {}) == ("a", "a", 1)  # a payload without a norm has no size


def test_a_trial_step_is_held_to_s_t_where_a_group_holds_the_list():
    """`TypicalPayloads.held_to`: 3 hotkeys sending honest work ×5 held 3 of the list's 4 slots, so both of
    the aggregate's medians were theirs; S_t, drawn by the validator among every earning upload, is mostly
    honest, and its lower median holds every trial step (benchmarks/LOG.md §63). Near-zero uploads below
    1/max_norm_ratio of the aggregate's size do not count in S_t's median, nor does S_t lift the hold."""
    from templar.validator.fast_eval import typical_payloads

    payload = _scaled_payloads()
    honest = [payload(f"h{i}", 1.0 + i / 10) for i in range(4)]
    loud = [payload(f"loud{i}", 5.0) for i in range(3)]
    faint = [payload(f"faint{i}", 1e-6) for i in range(8)]
    captured = typical_payloads([*loud, honest[0]], {"loud0": 0.3, "loud1": 0.3, "loud2": 0.3, "h0": 0.1})
    assert captured is not None and captured.smaller.hotkey.startswith("loud")  # the list's medians: the group's
    assert captured.held_to([*honest, *loud], 1000.0).hotkey == "h3"  # S_t's median of 7: an honest size
    assert captured.held_to([*honest, *loud, *faint], 1000.0).hotkey == "h3"  # 8 of 15 near zero: not counted
    assert captured.held_to([*loud, honest[0]], 1000.0).hotkey == captured.smaller.hotkey  # a group most of S_t
    assert captured.held_to([], 1000.0) is captured.smaller
    fair = typical_payloads(honest, {})
    assert fair is not None and fair.held_to([*honest, *loud], 1000.0) is fair.smaller  # S_t never lifts it


def test_a_first_scored_window_tries_every_trial_step_at_s_ts_own_typical_size():
    """`fast_eval.trial_size`: a run's first scored window has no aggregate to read a typical size from;
    every trial step is tried at S_t's lower median, so a ×5 pair beside two honest miners is tried at an
    honest size, not as sent (it took 0.448 each of that window's weight, benchmarks/LOG.md §62, §67). An
    upload beyond the scale check's bound above the median is tried as sent (no later window rates it), and
    so is every honest upload where near-zero ones are most of S_t. With an aggregate the size is
    `TypicalPayloads.held_to`'s, as before."""
    from templar.validator.fast_eval import trial_size, typical_payloads

    payload = _scaled_payloads()

    def of(*payloads):
        return {g.hotkey: g for g in payloads}

    honest = [payload("h0", 1.0), payload("h1", 1.1)]
    pair = [payload("loud0", 5.0), payload("loud1", 5.0)]
    found = trial_size(None, of(*pair, *honest), 1000.0)
    assert found.typical is not None and found.typical.hotkey == "h1" and not found.as_sent  # an honest size
    group = [*pair, payload("loud2", 5.0)]
    found = trial_size(None, of(*group, *honest), 1000.0)
    assert found.typical is not None and found.typical.hotkey.startswith("loud")  # most of S_t: its size, for all
    scaled = payload("scaled", 1e4)
    assert trial_size(None, of(scaled, *honest, payload("h2", 0.9)), 1000.0).as_sent == {"scaled"}
    faint = [payload(f"faint{i}", 1e-6) for i in range(3)]
    found = trial_size(None, of(*faint, *honest), 1000.0)
    assert found.typical is not None and found.typical.hotkey.startswith("faint") and found.as_sent == {"h0", "h1"}
    assert trial_size(None, of(payload("zero", 0.0), honest[0]), 1000.0).typical is honest[0]  # no norm, no size
    assert trial_size(None, {}, 1000.0).typical is None and trial_size(None, of(payload("zero", 0.0)), 1000.0) == (
        None, frozenset())
    sizes = typical_payloads([*group, honest[0]], {})
    assert sizes is not None
    assert trial_size(sizes, of(*honest, *group), 1000.0) == (sizes.held_to([*honest, *group], 1000.0), frozenset())


@pytest.mark.slow(seconds=3)
def test_an_untrained_page_is_credited_nothing_even_when_the_mean_hides_it(tiny_pages):
    """Page-by-page credit (docs/scoring.md §4): a peer that trained on 1 of its 2 assigned pages (hard, so
    the mean of both still shows a clear gap) drew the full +1 from the mean; page by page its untrained page
    earns no credit, so its credit is about half an honest peer's."""
    from templar.gauntlet import page_credit
    from templar.gauntlet.scores import update_mu

    hp = load_hparams("tiny")
    model = build_model(hp)
    per_page = hp.data.sequences_per_page
    trained, untrained = tiny_pages.batch([10]), tiny_pages.batch([11])
    accumulate_gradients(model, torch.cat([trained, trained, trained]), 8)
    partial = {n: torch.sign(g) for n, g in gradients(model).items()}
    model.zero_grad(set_to_none=True)
    accumulate_gradients(model, torch.cat([trained, untrained]), 8)
    honest = {n: torch.sign(g) for n, g in gradients(model).items()}
    model.zero_grad(set_to_none=True)
    assigned = torch.cat([trained, untrained])
    scores = Evaluator(model, micro_batch_size=8, position_ranges=4).score_peers(
        {"partial": partial, "honest": honest}, {"partial": assigned, "honest": assigned},
        tiny_pages.batch([500, 501]), 2e-3, per_page)
    p, h = scores["partial"], scores["honest"]
    assert len(p.page_deltas) == 2 and abs(sum(p.page_deltas) / 2 - p.delta_assigned) < 1e-5
    margin = hp.gauntlet.proof_margin
    # The mean hides the untrained page: judged as one number, the partial worker earns the full credit.
    assert update_mu(0.0, p.delta_assigned, p.delta_rand, 0.5, margin) == 0.5
    # Page by page: the trained page earns +1, the untrained one nothing.
    assert page_credit(p.page_deltas[:1], p.delta_rand, margin) == 1.0
    assert page_credit(p.page_deltas[1:], p.delta_rand, margin) <= 0.0
    assert page_credit(p.page_deltas, p.delta_rand, margin) <= 0.5
    assert page_credit(h.page_deltas, h.delta_rand, margin) == 1.0


def test_evaluation_records_no_autograd_graph(tiny_pages):
    """A scoring forward keeps no activations for a backward that never comes: with a graph, the
    1.2B validator's peak was 58.5 GB on an H200 instead of a forward's working set."""
    model = build_model(load_hparams("tiny"))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t):
        scores = Evaluator(model, micro_batch_size=8, position_ranges=4).score_peers(
            {"p": {n: torch.ones_like(p) for n, p in model.named_parameters()}},
            {"p": tiny_pages.batch([10])}, tiny_pages.batch([500]), 1e-3)
    assert saved == [] and scores["p"].loss_rand_before > 0
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.slow(seconds=5)
def test_common_steps_take_each_units_generic_gain_out_of_the_proof_and_nothing_else(tiny_pages):
    """`gauntlet.proof_baseline_groups` (docs/scoring.md §4): the LossScores are unchanged; the units'
    δs the proof reads are each less its share of the generic gain, so the random units (which no
    peer trained) scatter less around δ_rand, and a peer's own pages still show their gap."""
    import statistics

    hp = load_hparams("tiny")
    model = build_model(hp)
    steps, assigned = {}, {}
    for i, pages in enumerate(([10], [20], [30])):
        assigned[f"p{i}"] = tiny_pages.batch(pages)
        accumulate_gradients(model, assigned[f"p{i}"], 8)
        steps[f"p{i}"] = {n: torch.sign(g) for n, g in gradients(model).items()}
        model.zero_grad(set_to_none=True)
    random_data = tiny_pages.batch([500, 501, 502])
    plain = Evaluator(model, micro_batch_size=8, position_ranges=4).score_peers(
        steps, assigned, random_data, 2e-3, hp.data.sequences_per_page)
    common = Evaluator(model, micro_batch_size=8, position_ranges=4, baseline_groups=3).score_peers(
        steps, assigned, random_data, 2e-3, hp.data.sequences_per_page)
    for peer in steps:
        p, c = plain[peer], common[peer]
        assert (p.loss_assigned_before, p.loss_assigned_after, p.loss_rand_before, p.loss_rand_after) == \
               (c.loss_assigned_before, c.loss_assigned_after, c.loss_rand_before, c.loss_rand_after)
        assert statistics.pstdev(c.random_deltas) < 0.8 * statistics.pstdev(p.random_deltas), peer
        assert abs(statistics.fmean(c.random_deltas) - statistics.fmean(p.random_deltas)) < 1e-9
        assert statistics.fmean(c.sequence_deltas) > c.delta_rand, peer   # trained pages still gain more
        assert len(c.page_deltas) == 1


@pytest.mark.slow(seconds=5)
def test_the_other_peers_steps_take_each_units_generic_gain_out_and_too_few_leave_the_papers(tiny_pages):
    """`gauntlet.proof_baseline` "others" (docs/scoring.md §4): each peer's step runs over every
    unit once, serving as its own trial (the LossScores are the plain evaluation's, to rounding: the
    same sequences in other micro-batches) and as the others' baselines; the random units scatter
    less around δ_rand, trained pages still gain more, another peer's step moves a peer's baseline
    (its own never enters it: tests/gauntlet/test_baseline.py), and too few others leave δ_rand."""
    import statistics

    hp = load_hparams("tiny")
    model = build_model(hp)
    steps, assigned = {}, {}
    for i, pages in enumerate(([10], [20], [30], [40])):
        assigned[f"p{i}"] = tiny_pages.batch(pages)
        accumulate_gradients(model, assigned[f"p{i}"], 8)
        steps[f"p{i}"] = {n: torch.sign(g) for n, g in gradients(model).items()}
        model.zero_grad(set_to_none=True)
    random_data = tiny_pages.batch([500, 501, 502])
    score = lambda s, **rules: Evaluator(model, micro_batch_size=8, position_ranges=4, **rules).score_peers(  # noqa: E731
        s, assigned, random_data, 2e-3, hp.data.sequences_per_page)
    plain, others = score(steps), score(steps, baseline="others")
    for peer in steps:
        p, o = plain[peer], others[peer]
        assert (o.loss_assigned_before, o.loss_rand_before) == (p.loss_assigned_before, p.loss_rand_before)
        assert o.loss_assigned_after == pytest.approx(p.loss_assigned_after, rel=1e-5)
        assert o.loss_rand_after == pytest.approx(p.loss_rand_after, rel=1e-5)
        assert statistics.fmean(o.sequence_deltas) > o.delta_rand, peer   # trained pages still gain more
    # the random units scatter less: 0.70-0.94 of the plain scatter peer by peer here (0.79 on average;
    # the groups, whose mean holds the peer's own step, 0.35-0.82), so a bound on the mean over peers
    scatter = [statistics.pstdev(others[p].random_deltas) / statistics.pstdev(plain[p].random_deltas) for p in steps]
    assert statistics.fmean(scatter) < 0.9, scatter
    # another peer's step is part of p1's baseline (its units' δ' move), though p1's own LossScores do not
    louder = score({**steps, "p0": {n: 3 * t for n, t in steps["p0"].items()}}, baseline="others")
    assert louder["p1"].delta_rand == pytest.approx(others["p1"].delta_rand, rel=1e-9)
    assert louder["p1"].sequence_deltas != others["p1"].sequence_deltas
    # too few others (3 peers, 2 others each, 3 needed): every unit is judged against δ_rand, as in the paper
    three = {k: steps[k] for k in ("p0", "p1", "p2")}
    few = Evaluator(model, micro_batch_size=8, position_ranges=4, baseline="others").score_peers(
        three, {k: assigned[k] for k in three}, random_data, 2e-3, hp.data.sequences_per_page)
    assert few["p0"].random_deltas == pytest.approx(plain["p0"].random_deltas, rel=1e-4, abs=1e-6)


def test_the_sequences_read_are_taken_page_by_page_and_a_short_batch_is_left_whole():
    from templar.validator.evaluate import read_sequences

    batch = torch.arange(12).view(6, 2)                                 # 2 pages of 3 sequences
    assert read_sequences(batch, [[0, 2], [1]]).tolist() == [[0, 1], [4, 5], [8, 9]]
    assert read_sequences(batch, [[0, 1, 2], [0, 1, 2]]) is batch         # every sequence: as it is
    empty = batch[:0]
    assert read_sequences(empty, [[0], [1]]) is empty                     # a page the bucket could not serve
    assert read_sequences(batch[:5], [[0], [1]]).size(0) == 5             # not whole pages: left whole


def test_a_trial_step_that_overflows_the_model_scores_minus_inf_and_scoring_goes_on(tiny_pages):
    """A finite trial step large enough to overflow the model's activations makes its losses NaN. The units
    already read that as −inf (the update broke the model), but δ_assigned and δ_rand were NaN, and
    `record_primary` refuses a NaN LossScore: one peer's payload raised out of the window's scoring, so
    nobody in S_t was scored. Now its δs are −inf like its units: it ranks last, earns nothing, the rest
    are scored."""
    from templar.core.verdicts import FastVerdict, Status
    from templar.gauntlet import PrimaryResult, ScoreBook, score_window

    hp = load_hparams("tiny")
    model = build_model(hp)
    assigned, random_data = tiny_pages.batch([10]), tiny_pages.batch([500])
    accumulate_gradients(model, assigned, 8)
    honest = {n: torch.sign(g) * 1e-3 for n, g in gradients(model).items()}
    model.zero_grad(set_to_none=True)
    broken = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    broken["model.norm.weight"].fill_(-3e38)  # finite, as the wire demands; the forward overflows
    peers = {"honest": honest, "other": {n: -s for n, s in honest.items()}, "broken": broken}
    scores = Evaluator(model, micro_batch_size=8, position_ranges=4).score_peers(
        peers, dict.fromkeys(peers, assigned), random_data, 1.0)
    assert scores["broken"].delta_assigned == scores["broken"].delta_rand == float("-inf")
    assert scores["honest"].delta_assigned == scores["honest"].loss_assigned_before - scores[
        "honest"].loss_assigned_after  # a finite loss reads as before, to the bit
    losses = {hk: PrimaryResult(s.delta_assigned, s.delta_rand, s.page_deltas, s.sequence_deltas,
                                random_units=s.random_deltas) for hk, s in scores.items()}
    book = ScoreBook()
    out = score_window(book, load_hparams().gauntlet, 3, {"honest": 0, "other": 1, "broken": 2},
                       dict.fromkeys(peers, FastVerdict(Status.OK)), losses)
    assert out.weights["broken"] == 0.0 and book.peers["broken"].primary_evals == 1


def test_the_leads_ceiling_on_the_step_is_the_paid_typical_size_of_what_it_drew():
    """`step_ceiling`: the clip level every node takes is the step's own payloads' lower median, so 3
    hotkeys sending honest work ×5 that hold 3 of the list's 4 slots set the step's size (benchmarks/LOG.md
    §64). The lead's ceiling is the pay-weighted lower median of the uploads it drew (F_t, the list among
    them): an honest size unless the group holds most of the pay. Unpaid uploads (near zero, flooding)
    do not count, and with nothing paid there is no ceiling (a run's first windows)."""
    from templar.validator.fast_eval import payload_norm, step_ceiling

    payload = _scaled_payloads()
    honest = [payload(f"h{i}", 1.0 + i / 10) for i in range(4)]
    loud = [payload(f"loud{i}", 5.0) for i in range(3)]
    faint = [payload(f"faint{i}", 1e-6) for i in range(8)]
    paid_alike = {g.hotkey: 1 / 7 for g in [*honest, *loud]}
    assert step_ceiling([*honest, *loud], paid_alike) == payload_norm(honest[3])  # 4th of 7: honest
    assert step_ceiling([*honest, *loud, *faint], paid_alike) == payload_norm(honest[3])  # unpaid: not counted
    assert step_ceiling([*loud, honest[0]], paid_alike) == payload_norm(loud[0])  # F_t drew mostly the group
    assert step_ceiling([*honest[:2], *loud], {**paid_alike, "h0": 0.5, "h1": 0.5}) == payload_norm(honest[1])
    assert step_ceiling([*honest, *loud], {}) is None and step_ceiling([], paid_alike) is None
    assert step_ceiling([payload("zero", 0.0), honest[0]], {"zero": 1.0, "h0": 0.1}) == payload_norm(honest[0])
