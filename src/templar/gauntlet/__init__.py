"""The Gauntlet incentive (docs/scoring.md): pure scoring formulas and the persistent ScoreBook.

Read in this order: `scores` (the paper's equations), `rating` (OpenSkill LossRating),
`selection` (who is evaluated each window), `duplicates` (copy detection), `borrowed` (copies
of earlier windows' public work), `extra_work` (declared pages and the paid level), `saturation` (μ
read against that level), `records` (what the book remembers), `book` (the state the rules
update), `window` (one window's draws and scoring, the steps the validator and the simulator share). Fast
evaluation's typed verdict is `templar.core.verdicts` (re-exported here), so that record readers
(the dashboard, the metrics) know what a status means without importing torch.
No model code and no I/O here except `ScoreBook.save`/`load`; the validator computes losses.
"""

from templar.core.verdicts import FastVerdict, Status, label_meaning
from templar.gauntlet.book import PeerRecord, PrimaryResult, ScoreBook, ScoreBookError
from templar.gauntlet.duplicates import (
    Upload,
    find_copies,
    find_pools,
    fingerprint,
    one_per_pool,
    shared_positions,
    shares_work,
)
from templar.gauntlet.extra_work import declared_work, trained_multiple, work_factor
from templar.gauntlet.rating import DEFAULT_RATING, Rating, competition_ranks, loss_rating, rate_match
from templar.gauntlet.scores import (
    is_synced,
    loss_score,
    normalise,
    page_credit,
    peer_score,
    penalise,
    size_credit,
    sync_steps,
    top_g,
    typical_gap,
    update_mu,
    window_gap,
)
from templar.gauntlet.selection import (
    eval_sequences_read,
    evaluated_pages,
    select_eval_pages,
    select_eval_peers,
    select_eval_sequences,
    selection_priority,
)
from templar.gauntlet.window import WindowDraw, WindowScores, draw_window, score_window

__all__ = [
    "DEFAULT_RATING",
    "FastVerdict",
    "PeerRecord",
    "PrimaryResult",
    "Rating",
    "ScoreBook",
    "ScoreBookError",
    "Status",
    "Upload",
    "WindowDraw",
    "WindowScores",
    "competition_ranks",
    "declared_work",
    "draw_window",
    "eval_sequences_read",
    "evaluated_pages",
    "find_copies",
    "find_pools",
    "fingerprint",
    "is_synced",
    "label_meaning",
    "loss_rating",
    "loss_score",
    "normalise",
    "one_per_pool",
    "page_credit",
    "peer_score",
    "penalise",
    "rate_match",
    "score_window",
    "select_eval_pages",
    "select_eval_peers",
    "select_eval_sequences",
    "selection_priority",
    "shared_positions",
    "shares_work",
    "size_credit",
    "sync_steps",
    "top_g",
    "trained_multiple",
    "typical_gap",
    "update_mu",
    "window_gap",
    "work_factor",
]
