"""A 20-window Gauntlet simulation with the CPU preset's settings (mu_gamma 0.7, top_g 4, c = 2).

Peers (LossScores in nats, seeded noise; Figure 2 of the paper is the qualitative reference):
- three honest peers: δ_rand ≈ 0.010, δ_assigned ≈ δ_rand + 0.004 (they trained on their pages);
- a peer with 2× data: better on both, δ_rand ≈ 0.016, δ_assigned ≈ δ_rand + 0.006;
- a lazy peer that trains on random pages only: δ_assigned ≈ δ_rand − 0.003;
- a failing peer: honest for 5 windows, then misses every upload (fails fast eval, never in S_t).
The validator loop below is Algorithm 1: fast eval on F_t (top-G forced in), primary on S_t.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from templar.core.config import GauntletConfig
from templar.gauntlet import PrimaryResult, ScoreBook, select_eval_peers

WINDOWS = 20
FAIL_FROM = 5
SEED = 2024
PEERS = {"5Honest1": 0, "5Honest2": 1, "5Honest3": 2, "5Double": 3, "5Lazy": 4, "5Failing": 5}


def _deltas(hotkey: str, rng: random.Random) -> PrimaryResult:
    if hotkey == "5Double":
        rand = 0.016 + rng.gauss(0, 0.002)
        return PrimaryResult(rand + 0.006 + rng.gauss(0, 0.001), rand)
    if hotkey == "5Lazy":
        rand = 0.010 + rng.gauss(0, 0.002)
        return PrimaryResult(rand - 0.003 + rng.gauss(0, 0.001), rand)
    rand = 0.010 + rng.gauss(0, 0.002)
    return PrimaryResult(rand + 0.004 + rng.gauss(0, 0.001), rand)


def _run(cfg: GauntletConfig, state: Path | None = None) -> tuple[ScoreBook, dict[str, list[float]]]:
    """Simulate; with `state`, save and reload the book every window as a restarting validator would."""
    rng = random.Random(SEED)
    rules = cfg.model_copy(update={"proof_margin": 0.0})  # the bare sign of the paper's eq. 3
    book = ScoreBook()
    mu_history: dict[str, list[float]] = {hotkey: [] for hotkey in PEERS}
    for window in range(WINDOWS):
        if state is not None:
            book = ScoreBook.load(state)
        book.sync_registry(PEERS)
        uploaded = [hk for hk in PEERS if not (hk == "5Failing" and window >= FAIL_FROM)]
        fast = select_eval_peers(SEED, window, list(PEERS), cfg.fast_eval_uids,
                                 always=book.top_g(rules), purpose="fast")
        for hotkey in fast:
            book.get_or_create(hotkey, PEERS[hotkey], window)
            ok = hotkey in uploaded
            book.record_fast_eval(rules, hotkey, ok, "ok" if ok else "missing", sync_steps=0.4 if ok else None)
        primary = select_eval_peers(SEED, window, uploaded, cfg.uids_per_window, purpose="primary")
        book.record_primary(rules, {hk: _deltas(hk, rng) for hk in sorted(primary)})
        book.weights(rules)
        for hotkey in PEERS:
            mu_history[hotkey].append(book.peers[hotkey].mu if hotkey in book else 0.0)
        if state is not None:
            book.save(state)
    return book, mu_history


@pytest.fixture(scope="module")
def simulated(gauntlet_cfg: GauntletConfig) -> tuple[ScoreBook, dict[str, list[float]]]:
    return _run(gauntlet_cfg)


def test_lazy_peer_gets_negative_mu_and_nothing(simulated, gauntlet_cfg: GauntletConfig) -> None:
    book, _ = simulated
    lazy = book.peers["5Lazy"]
    assert lazy.primary_evals >= 8
    assert lazy.mu < 0
    assert lazy.score == 0.0 and lazy.weight == 0.0
    assert "5Lazy" not in book.top_g(gauntlet_cfg)


def test_failing_peer_mu_decays_by_phi_each_window(simulated, gauntlet_cfg: GauntletConfig) -> None:
    book, history = simulated
    failing = book.peers["5Failing"]
    mu_at_failure = history["5Failing"][FAIL_FROM - 1]
    assert mu_at_failure > 0
    # once it stops uploading it is in F_t every window (fast_eval_uids ≥ peers) and never in S_t
    expected = mu_at_failure * gauntlet_cfg.fast_eval_penalty ** (WINDOWS - FAIL_FROM)
    assert failing.mu == pytest.approx(expected, rel=1e-12)
    assert all(b < a for a, b in zip(history["5Failing"][FAIL_FROM - 1 :], history["5Failing"][FAIL_FROM:], strict=False))
    assert failing.fast_eval_fails == WINDOWS - FAIL_FROM and failing.last_status == "missing"
    honest_scores = [book.peers[hk].score for hk in ("5Honest1", "5Honest2", "5Honest3")]
    assert failing.score < 0.05 * min(honest_scores)
    assert "5Failing" not in book.top_g(gauntlet_cfg)


def test_double_data_peer_ranks_first(simulated, gauntlet_cfg: GauntletConfig) -> None:
    book, _ = simulated
    top = book.top_g(gauntlet_cfg)
    assert top[0] == "5Double"
    assert set(top) == {"5Double", "5Honest1", "5Honest2", "5Honest3"}
    weights = {hk: record.weight for hk, record in book.peers.items()}
    assert math.fsum(weights.values()) == pytest.approx(1.0, abs=1e-12)
    assert weights["5Double"] == max(weights.values())
    assert book.peers["5Double"].loss_rating > max(book.peers[hk].loss_rating for hk in top[1:])
    assert all(book.peers[hk].mu > 0.5 for hk in top)


def test_restarting_every_window_loses_nothing(simulated, gauntlet_cfg: GauntletConfig, tmp_path: Path) -> None:
    book, history = simulated
    resumed, resumed_history = _run(gauntlet_cfg, state=tmp_path / "scorebook.json")
    assert resumed == book
    assert resumed_history == history
