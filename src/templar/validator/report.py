"""What a validator says about each window: one log line per evaluated peer and the JSONL records
(`scores.jsonl`, `validator_windows.jsonl`, `evaluations.jsonl` with `--record-evaluations`) that
operators, the dashboard and the metrics read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from templar.core.config import GauntletConfig
from templar.core.log import context, short
from templar.gauntlet import FastVerdict, PrimaryResult, ScoreBook, Status, WindowScores
from templar.runtime.records import (
    EVALUATIONS_FILE,
    SCORES_FILE,
    VALIDATOR_WINDOWS_FILE,
    EvaluationRecord,
    PeerScoreRecord,
    ValidatorWindowRecord,
    append_record,
)
from templar.validator.evaluate import LossScores

WINDOW_RECORDS = (SCORES_FILE, EVALUATIONS_FILE, VALIDATOR_WINDOWS_FILE)
"""Every file `record_window` appends to: a restart trims each of them to the committed window
(`templar.runtime.records.drop_uncommitted_records`), or a window recorded before a crash and again
after it would appear twice."""

@dataclass(frozen=True)
class WindowSummary:
    """The window's figures beside the scores (`validator_windows.jsonl`)."""

    global_step: int
    learning_rate: float
    holdout_loss: float
    peers_aggregated: int
    gathered: int
    wall_seconds: float
    weights_set: bool
    gather_seconds: float
    lead: bool = False
    clip_norm: float | None = None


def record_window(state_dir: Path, window: int, book: ScoreBook, rules: GauntletConfig,
                  verdicts: Mapping[str, FastVerdict], losses: Mapping[str, LossScores], scores: WindowScores,
                  summary: WindowSummary, *, primaries: Mapping[str, PrimaryResult] | None = None) -> None:
    """A score record for every peer in the book and one window record; a log line for each peer
    evaluated this window (the LossRating as `rules` read it); with `primaries` (`--record-evaluations`)
    every unit of each primary evaluation (`EvaluationRecord`)."""
    log = context(window=window, phase="score")
    paid = book.paid_mus(rules)
    for hotkey in sorted(book):
        rec = book.peers[hotkey]
        verdict = verdicts.get(hotkey)
        loss = losses.get(hotkey)
        status = verdict.label if verdict else Status.NOT_SAMPLED.value
        weight = scores.weights.get(hotkey, 0.0)
        if verdict or loss:
            log.info(f"peer {short(hotkey)} uid {rec.uid}: {status} | sync "
                     f"{'-' if rec.last_sync_steps is None else f'{rec.last_sync_steps:.2f}'} | "
                     f"δa {'-' if not loss else f'{loss.delta_assigned:+.5f}'} δr "
                     f"{'-' if not loss else f'{loss.delta_rand:+.5f}'} | μ {rec.mu:+.3f} (read {paid[hotkey]:+.3f}) | rating "
                     f"{book.loss_rating(rules, hotkey):.2f} | score {rec.score:.3f} | weight {weight:.3f}")
        append_record(state_dir / SCORES_FILE, PeerScoreRecord(
            window=window, hotkey=hotkey, uid=rec.uid, status=status, evaluated=loss is not None,
            sync_steps=verdict.sync_steps if verdict else None,
            delta_assigned=loss.delta_assigned if loss else None,
            delta_rand=loss.delta_rand if loss else None, mu=rec.mu, rating=book.loss_rating(rules, hotkey),
            score=rec.score, weight=weight, in_top_g=hotkey in scores.top_g, paid_mu=paid[hotkey]))
    for hotkey, result in sorted((primaries or {}).items()):
        append_record(state_dir / EVALUATIONS_FILE, EvaluationRecord(
            window=window, hotkey=hotkey, uid=book.peers[hotkey].uid if hotkey in book.peers else -1,
            delta_assigned=result.delta_assigned, delta_rand=result.delta_rand, pages=list(result.pages),
            units=list(result.sequences), random_units=list(result.random_units), work=result.work,
            declared_units=result.declared_units))
    append_record(state_dir / VALIDATOR_WINDOWS_FILE, ValidatorWindowRecord(
        window=window, global_step=summary.global_step, learning_rate=summary.learning_rate,
        holdout_loss=summary.holdout_loss, peers_aggregated=summary.peers_aggregated, gathered=summary.gathered,
        evaluated=len(losses), wall_seconds=summary.wall_seconds, weights_set=summary.weights_set,
        gather_seconds=summary.gather_seconds, lead=summary.lead, clip_norm=summary.clip_norm))
