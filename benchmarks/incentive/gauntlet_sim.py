"""The Gauntlet on real updates (paper Figure 2): does more data earn more, and desync less?

    python -m benchmarks.incentive.gauntlet_sim            # 30 rounds
    python -m benchmarks.incentive.gauntlet_sim --quick    # 10 rounds

One shared model (the tiny-paper preset: tiny with the paper's rules) and five peers, each with its own
DeMo error feedback:
- `baseline`: honest, trains on its assigned pages;
- `double`: honest with 2x data: its assigned pages plus as many extra (unassigned) pages,
  as the production miner's `--extra-pages` does (the localnet's `moredata`);
- `desync`: honest data, but computes its update on the model from 3 windows ago;
- `normal1`, `normal2`: honest, so the top-G aggregate has G = 4 candidates besides the others.
Each round (= window): every peer computes its DeMo update; the validator scores all five with
`Evaluator.score_peers` (LossScore δ on the peer's assigned page and on a random page, the preset's
`eval_pages`, β = eval_lr_factor·α) and updates μ and the LossRating with `ScoreBook.record_primary`
under the preset's rules (its whole gauntlet section: γ, proof credit, LossRating, μ ramp); then the model takes the
signed outer step over the top-G peers by PeerScore (all peers in a round where nobody has a
positive score yet), exactly as honest nodes do.

Writes `benchmarks/results/gauntlet_sim.json` (per round and peer: δ_rand, δ_assigned, μ, LossRating,
PeerScore, in top-G) and a 2-panel `gauntlet_sim.png` (LossScore δ_rand, LossRating); `--quick`
writes `gauntlet_sim_quick.*` instead, so it never overwrites the full figures.
"""

from __future__ import annotations

import argparse
import collections
import sys

import torch

from benchmarks._common import (
    RESULTS_DIR,
    Tiny,
    emit,
    load_tiny,
    new_demo,
    peer_update,
    setup_torch,
    shapes_of,
    write_result,
)
from templar.compress import Compressed, DeMo, aggregate, apply_signed_update
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.gauntlet import PrimaryResult, ScoreBook
from templar.runtime.consensus.outer import peer_weight
from templar.runtime.train import evaluate_loss
from templar.validator.evaluate import Evaluator

PEERS = {"baseline": 0, "double": 1, "desync": 2, "normal1": 3, "normal2": 4}
"""hotkey -> uid (the uid selects the assigned pages)."""
DESYNC_LAG = 3


def training_pages(tiny: Tiny, hotkey: str, window: int) -> list[int]:
    n = tiny.hp.data.pages_per_window
    pages = tiny.plan.assigned_pages(PEERS[hotkey], window, n)
    if hotkey == "double":
        pages += tiny.plan.random_pages(window, n, salt=1000 + PEERS[hotkey], exclude=pages)
    return pages


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def plot(path, rounds: list[int], delta_rand: dict[str, list[float]], rating: dict[str, list[float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), dpi=90)
    for hotkey in PEERS:
        left.plot(rounds, delta_rand[hotkey], label=hotkey, linewidth=1.2)
        right.plot(rounds, rating[hotkey], label=hotkey, linewidth=1.5)
    left.axhline(0.0, color="grey", linewidth=0.6)
    left.set_title("LossScore δ_rand per round", fontsize=10)
    left.set_xlabel("round (window)")
    left.set_ylabel("nats")
    right.set_title("LossRating (OpenSkill mu)", fontsize=10)
    right.set_xlabel("round (window)")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 rounds instead of 30")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--hparams", default="tiny-paper",
                        help="preset name or path (default tiny-paper: the paper's rules, for its Figure 2); a "
                        "layered file with 'base': 'tiny.json' tries gauntlet settings on the same model and data")
    parser.add_argument("--stem", default=None, help="results file name (default gauntlet_sim[_quick])")
    args = parser.parse_args()
    setup_torch()
    rounds = args.rounds or (10 if args.quick else 30)

    stem = args.stem or ("gauntlet_sim_quick" if args.quick else "gauntlet_sim")  # quick never overwrites the full run
    tiny = load_tiny(args.hparams)
    hp = tiny.hp
    g = hp.gauntlet
    model = build_model(hp)
    stale_model = build_model(hp)   # θ from DESYNC_LAG windows ago, for the desync peer
    shapes = shapes_of(model)
    demos: dict[str, DeMo] = {hk: new_demo(model if hk != "desync" else stale_model, hp) for hk in PEERS}
    history: collections.deque[dict[str, torch.Tensor]] = collections.deque(maxlen=DESYNC_LAG + 1)
    evaluator = Evaluator(model, hp.optimizer.micro_batch_size, position_ranges=g.position_ranges)
    book = ScoreBook()  # scored by the preset's rules (`g`): μ start-up ramp, LossRating, proof credit
    holdout = tiny.pages.batch(tiny.plan.holdout_pages()[:hp.data.holdout_eval_pages])
    n_eval = min(hp.data.eval_pages, hp.data.pages_per_window)
    series: dict[str, dict[str, list]] = {hk: collections.defaultdict(list) for hk in PEERS}
    holdout_loss: list[float] = []

    for window in range(rounds):
        history.append(snapshot(model))
        stale_model.load_state_dict(history[0])  # θ_{t-3} (θ_0 for the first rounds)
        lr = learning_rate(window, hp.optimizer)
        updates: dict[str, dict[str, Compressed]] = {}
        for hotkey in PEERS:
            batch = tiny.pages.batch(training_pages(tiny, hotkey, window))
            on = stale_model if hotkey == "desync" else model
            updates[hotkey], _ = peer_update(on, demos[hotkey], batch, lr, hp)

        signs = {hk: aggregate([c], [1.0], shapes) for hk, c in updates.items()}
        assigned = {hk: tiny.pages.batch(tiny.plan.assigned_pages(uid, window, hp.data.pages_per_window)[:n_eval])
                    for hk, uid in PEERS.items()}
        random_batch = tiny.pages.batch(tiny.plan.random_pages(window, hp.data.eval_pages))
        scores = evaluator.score_peers(signs, assigned, random_batch, g.eval_lr_factor * lr,
                                       hp.data.sequences_per_page)
        for hotkey, uid in PEERS.items():
            book.get_or_create(hotkey, uid, window)
        book.record_primary(g, {hk: PrimaryResult(s.delta_assigned, s.delta_rand, s.page_deltas, s.sequence_deltas)
                                for hk, s in scores.items()}, window=window)
        book.weights(g)
        top = book.top_g(g) or sorted(PEERS)
        step = aggregate([updates[hk] for hk in top], [peer_weight(hp)] * len(top), shapes)
        apply_signed_update(model, step, lr, hp.optimizer.weight_decay)
        holdout_loss.append(evaluate_loss(model, holdout, hp.optimizer.micro_batch_size))

        record: dict[str, object] = {"case": "round", "window": window, "holdout_loss": holdout_loss[-1],
                                     "top_g": top}
        for hotkey in PEERS:
            rec, s = book.peers[hotkey], scores[hotkey]
            values = {"delta_rand": s.delta_rand, "delta_assigned": s.delta_assigned, "mu": rec.mu,
                      "rating": book.loss_rating(g, hotkey), "score": rec.score, "weight": rec.weight,
                      "in_top_g": hotkey in top}
            for key, value in values.items():
                series[hotkey][key].append(value)
            record[hotkey] = {k: values[k] for k in ("delta_rand", "rating")}
        emit(record)

    final = {hk: {"mean_delta_rand": sum(series[hk]["delta_rand"]) / rounds,
                  "mean_delta_assigned": sum(series[hk]["delta_assigned"]) / rounds,
                  "rating": series[hk]["rating"][-1], "mu": series[hk]["mu"][-1],
                  "score": series[hk]["score"][-1], "weight": series[hk]["weight"][-1],
                  "rounds_in_top_g": sum(series[hk]["in_top_g"])} for hk in PEERS}
    by_rating = sorted(PEERS, key=lambda hk: -final[hk]["rating"])
    by_delta = sorted(PEERS, key=lambda hk: -final[hk]["mean_delta_rand"])
    summary = {"case": "summary", "rounds": rounds, "rating_order": by_rating, "delta_rand_order": by_delta,
               "double_highest_rating": by_rating[0] == "double", "desync_lowest_rating": by_rating[-1] == "desync",
               "final": final}
    emit(summary)
    write_result(f"{stem}.json", {
        **summary, "peers": PEERS, "desync_lag": DESYNC_LAG,
        "settings": {"preset": hp.name, "top_g": g.top_g, "mu_gamma": g.mu_gamma, "proof_margin": g.proof_margin,
                     "eval_lr_factor": g.eval_lr_factor, "openskill_beta": g.openskill_beta,
                     "openskill_tau": g.openskill_tau, "eval_pages": hp.data.eval_pages,
                     "pages_per_window": hp.data.pages_per_window},
        "holdout_loss": holdout_loss,
        "per_round": {hk: dict(series[hk]) for hk in PEERS},
    })
    plot(RESULTS_DIR / f"{stem}.png", list(range(rounds)), {hk: series[hk]["delta_rand"] for hk in PEERS},
         {hk: series[hk]["rating"] for hk in PEERS})

    print(f"\nGauntlet simulation, {rounds} rounds, tiny preset (G={g.top_g}); held-out loss "
          f"{holdout_loss[0]:.3f} -> {holdout_loss[-1]:.3f}")
    print(f"  {'peer':<9} {'mean δ_rand':>12} {'mean δ_assig':>12} {'rating':>7} {'mu':>6} {'weight':>7} {'in top-G':>8}")
    for hk in by_rating:
        f = final[hk]
        print(f"  {hk:<9} {f['mean_delta_rand']:12.5f} {f['mean_delta_assigned']:12.5f} {f['rating']:7.2f} "
              f"{f['mu']:6.2f} {f['weight']:7.3f} {f['rounds_in_top_g']:>5}/{rounds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
