"""One validator window's record: what its phases (`templar.validator.loop.Validator.run_window`)
hand to the next, and what the role in force (`templar.validator.roles`) acts on."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from templar.comms import GatherResult
from templar.core.config import GauntletConfig, HParams
from templar.core.log import context, short
from templar.gauntlet import FastVerdict, PrimaryResult, ScoreBook, WindowDraw, WindowScores
from templar.runtime.consensus.outer import OuterStep, aggregation_weights
from templar.runtime.consensus.peers import aggregate_payloads
from templar.runtime.consensus.succession import Decision
from templar.runtime.consensus.windows import WindowTimes
from templar.validator.evaluate import LossScores
from templar.validator.fast_eval import TypicalPayloads, payload_norm, step_ceiling, typical_payloads
from templar.validator.replays import Sighting
from templar.wire import Gradient


@dataclass
class ValidatorWindow:
    """What one window's phases hand to the next."""

    window: int
    times: WindowTimes
    started: float
    """`time.perf_counter()` when the gather could start (the window's wall time is counted from it)."""
    evaluate: bool
    """Whether peers are scored this window (a replayed or out-of-sync window is only stepped)."""
    miners: dict[str, int] = field(default_factory=dict)
    peer_list: list[str] = field(default_factory=list)
    learning_rate: float = 0.0
    draw: WindowDraw | None = None
    """F_t, and S_t once F_t is judged (`templar.gauntlet.draw_window`)."""
    results: dict[str, GatherResult[Gradient]] = field(default_factory=dict)
    gather_seconds: float = 0.0
    replayed: Mapping[str, Sighting] = field(default_factory=dict)
    sizes: TypicalPayloads | None = None
    """The typical sizes of the window's aggregate (`fast_eval.typical_payloads`): the scale check's
    yardstick and the trial reference."""
    verdicts: dict[str, FastVerdict] = field(default_factory=dict)
    losses: dict[str, LossScores] = field(default_factory=dict)
    primaries: dict[str, PrimaryResult] = field(default_factory=dict)
    """What the score book received of each primary evaluation (`score`), for `--record-evaluations`."""
    scores: WindowScores | None = None
    decision: Decision | None = None
    """The window's applied inputs and who led it (`templar.runtime.consensus.succession`)."""
    step: OuterStep | None = None
    applied: list[Gradient] = field(default_factory=list)
    early_aggregate: asyncio.Task[bool] | None = None
    """Our aggregate of the window, uploading since our inputs went out (`WindowPublisher.publish_bundle_early`)."""
    holdout_loss: float = 0.0
    weights_set: bool = False
    wall_seconds: float = 0.0

    def aggregated(self, hp: HParams) -> list[Gradient]:
        """The window's aggregate as this validator gathered it: the payloads of the peer list in effect
        that enter it (`aggregation_weights`), what a candidate publishes and what judges a payload's size."""
        return aggregation_weights(aggregate_payloads(self.peer_list, self.results), hp)[0]

    def typical_sizes(self, hp: HParams, book: ScoreBook) -> TypicalPayloads | None:
        """The typical sizes of the window's aggregate, one counting each payload alike, one weighting each
        by its uploader's pay in the book (`fast_eval.typical_payloads`); None without an aggregate."""
        return typical_payloads(self.aggregated(hp), {hk: r.weight for hk, r in book.peers.items()})

    def step_ceiling(self, hp: HParams, book: ScoreBook) -> float | None:
        """The ceiling a lead publishes on its step's clip level (`fast_eval.step_ceiling` of F_t's
        uploads that would enter an aggregate, weighted by the book's pay); None under the sign rule,
        which no size reaches."""
        if hp.optimizer.method == "signed" or self.draw is None:
            return None
        drawn = [r.value for hk, r in self.results.items() if hk in self.draw.fast and r.ok and r.value is not None]
        ceiling = step_ceiling(aggregation_weights(drawn, hp)[0], {hk: r.weight for hk, r in book.peers.items()})
        sizes = sorted(size for size in map(payload_norm, self.aggregated(hp)) if size > 0)
        median = sizes[(len(sizes) - 1) // 2] if sizes else None
        if ceiling is not None and median is not None and ceiling < median:
            context(window=self.window, phase="lead").info(
                f"{sum(size > ceiling for size in sizes)} of the step's {len(sizes)} payloads are above the typical "
                f"paid upload drawn ({ceiling:.4g}); the step clips to it, not to the list's median ({median:.4g})")
        return ceiling

    def premium(self, rules: GauntletConfig) -> bool:
        """Whether a δ_rand above S_t's median rates above it (`score_window`'s `premium`): only when the
        trial steps were held to a typical size read from `norm_check_min_peers` payloads or more. Before
        that (a run's first windows) a trial step is the upload as it is, and a louder upload gains more."""
        return self.sizes is not None and self.sizes.peers >= rules.norm_check_min_peers

    def done_line(self, global_step: int) -> str:
        """The window's one-line summary, said when it is committed."""
        assert self.scores is not None
        gathered = sum(r.ok for r in self.results.values())
        return (f"window done in {self.wall_seconds:.1f}s | held-out loss {self.holdout_loss:.4f} | gathered "
                f"{gathered}/{len(self.results)} | evaluated {len(self.losses)} | aggregated "
                f"{self.step.peers if self.step else 0} | step {global_step} | top-G "
                + ",".join(short(h) for h in self.scores.top_g))
