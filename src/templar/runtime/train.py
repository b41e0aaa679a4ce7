"""Local training inside a window: a miner's inner steps over its pages, and gradient accumulation.

Kept apart from the miner so the convergence benchmark and tests train exactly the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from templar.core.config import InnerConfig, OptimizerConfig
from templar.core.model import causal_lm_loss
from templar.core.schedule import learning_rate, scheduled_rate
from templar.runtime.offload import HostStore, StreamedOptimizer, parameter_groups


@dataclass(frozen=True)
class TrainStats:
    loss: float          # mean loss over the window's sequences
    tokens: int
    seconds: float       # forward + backward time only (and the inner optimizer's steps)
    scale: float = 1.0
    """What the compressor multiplies the pseudo-gradient left in `p.grad` by: the outer learning
    rate for the paper's plain gradient (and inner SGD, whose steps are that rate), 1 for AdamW's
    θ_t − θ_H, which carries its own."""

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _autocast(device: torch.device):
    """bf16 autocast on GPU (the paper's setting); full precision on CPU."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return nullcontext()


def accumulate_gradients(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int,
                         grad_clip: float | None = None) -> TrainStats:
    """Leave the mean gradient of `batch` ([sequences, length]) in `p.grad`; return stats."""
    device = next(model.parameters()).device
    model.train()
    model.zero_grad(set_to_none=True)
    n = batch.size(0)
    total = 0.0
    started = time.perf_counter()
    if n == 0:  # no usable page this window (data bucket down): zero gradient, loss unknown
        return TrainStats(loss=float("nan"), tokens=0, seconds=0.0)
    for start in range(0, n, micro_batch_size):
        micro = batch[start:start + micro_batch_size].to(device, non_blocking=True)
        with _autocast(device):
            loss = causal_lm_loss(model, micro)
        (loss * (micro.size(0) / n)).backward()
        total += loss.detach().float().item() * micro.size(0)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    return TrainStats(loss=total / n, tokens=int(batch.numel()), seconds=time.perf_counter() - started)


def make_inner_optimizer(model: torch.nn.Module, inner: InnerConfig, *, offload: bool = False
                         ) -> torch.optim.Optimizer | StreamedOptimizer | None:
    """The miner's inner optimizer over `model`'s parameters (None for SGD, which keeps no state).
    `offload`: its moments in host memory, streamed per parameter group (`runtime.offload`)."""
    if inner.optimizer != "adamw":
        return None
    if offload:
        return StreamedOptimizer(parameter_groups(model), lambda params: _adamw(params, inner))
    return _adamw([p for p in model.parameters() if p.requires_grad], inner)


def _adamw(params: list[torch.nn.Parameter], inner: InnerConfig) -> torch.optim.Optimizer:
    on_gpu = all(p.device.type == "cuda" for p in params)  # the fused kernel: one launch per step on a GPU
    return torch.optim.AdamW(params, lr=inner.learning_rate, betas=(inner.beta1, inner.beta2), eps=inner.eps,
                             weight_decay=inner.weight_decay, fused=True if on_gpu else None,
                             foreach=None if on_gpu else False)


def inner_lr(inner: InnerConfig, step: int, outer: OptimizerConfig) -> float:
    """The inner learning rate of the window at global_step `step`: AdamW's peak scaled by the run's
    schedule (`scheduled_rate`: the same warm-up and cosine, whether α follows it or is constant);
    SGD steps at the outer rate α itself."""
    if inner.optimizer == "sgd":
        return learning_rate(step, outer)
    return inner.learning_rate * scheduled_rate(step, outer) / outer.learning_rate


def inner_parts(batch: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """`batch`'s sequences dealt round-robin into `steps` parts: sequence i goes to step i mod H.

    A window's batch holds its pages one after another. Contiguous parts would give the first steps
    the first pages only, and the later steps would partly undo their fit: the validator, which
    checks page by page that a peer trained on each assigned page, would see the early pages' gaps
    shrink, and a miner that adds `--extra-pages` (laid after its assigned ones) would spend its last
    steps on them alone and look as if it skipped its assignment. Dealt round-robin, every step sees
    every page, as a shuffled data loader would give it."""
    return [batch[i::steps] for i in range(steps)]


def window_parts(batch: torch.Tensor, inner: InnerConfig) -> list[torch.Tensor]:
    """The batches of a window's inner steps, in order: the whole batch for the paper's window (H = 1
    with SGD: one gradient of all the pages), else `inner_parts` without the empty ones."""
    if paper_window(inner):
        return [batch]
    return [part for part in inner_parts(batch, inner.steps) if part.size(0)]


def paper_window(inner: InnerConfig) -> bool:
    """H = 1 with SGD: the window is one gradient, its rate the scale (no θ_t kept aside)."""
    return inner.steps == 1 and inner.optimizer == "sgd"


class InnerWindow:
    """A miner's window of inner steps, one step at a time (`begin`, `step` per part of
    `window_parts`, `end`), so a node can do other work between two steps: the overlapped miner takes
    the previous window's outer step there, on the run's θ, while this window trains a working model
    (docs/architecture.md §2). `inner_steps` runs all of it at once; the results are the same bit for
    bit.

    `begin` keeps the model as it is (θ_start) aside; `end` leaves the pseudo-gradient of the steps in
    `p.grad` and θ_start in the model. H = 1 with SGD is the paper's window, computed as it always was:
    the mean gradient of all the pages in `p.grad` and the rate as the scale (so the error feedback
    folds in exactly lr·g, bit for bit). Otherwise `p.grad` becomes Δ (SGD: Σ g_i with scale lr; AdamW:
    θ_start − θ_H with scale 1). `land` (the eager overlap) moves the model and θ_start by the same
    shift mid-window: the pseudo-gradient is then taken against the new θ_start. `step` and
    `accumulate` let a sharded node run the same loop over its ranks; `snapshot` keeps θ_start in host
    memory (`--memory.offload`) instead of on the device, the same values coming back one parameter
    at a time."""

    def __init__(self, model: torch.nn.Module, micro_batch_size: int, grad_clip: float | None, *,
                 inner: InnerConfig, optimizer: torch.optim.Optimizer | StreamedOptimizer | None, lr: float,
                 step: Callable[[], None] | None = None,
                 accumulate: Callable[[torch.Tensor], TrainStats] | None = None,
                 snapshot: HostStore | None = None) -> None:
        self.model = model
        self.inner = inner
        self.optimizer = optimizer
        self.lr = lr
        self.stepper = step
        self.accumulate = accumulate or (lambda part: accumulate_gradients(model, part, micro_batch_size, grad_clip))
        self.snapshot = snapshot
        self.paper = paper_window(inner)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.theta: list[torch.Tensor] | None = None
        self.summed: list[torch.Tensor] | None = None
        self.losses: list[tuple[float, int]] = []
        self.tokens = 0
        self.seconds = 0.0
        self.last: TrainStats | None = None

    def begin(self) -> None:
        """Keep θ_start aside and set the inner rate (nothing to keep for the paper's window)."""
        if self.paper:
            return
        started = time.perf_counter()
        with torch.no_grad():
            if self.snapshot is None:
                self.theta = [p.detach().clone() for p in self.params]
            else:
                self.snapshot.put([p.detach() for p in self.params])
            if self.inner.optimizer == "sgd":
                self.summed = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        if self.optimizer is not None:
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr
        self.seconds += time.perf_counter() - started

    def step(self, part: torch.Tensor) -> None:
        """One inner step on `part` (the paper's window: its one gradient, of the whole batch)."""
        started = time.perf_counter()
        stats = self.accumulate(part)
        self.last = stats
        if self.paper:
            self.seconds += stats.seconds
            return
        self.losses.append((stats.loss, part.size(0)))
        self.tokens += stats.tokens
        with torch.no_grad():
            if self.summed is not None:
                for p, total in zip(self.params, self.summed, strict=True):
                    if p.grad is not None:
                        total.add_(p.grad)
                        p.add_(p.grad, alpha=-self.lr)
            elif self.stepper is not None:
                self.stepper()
            else:
                self.optimizer.step()
        self.seconds += time.perf_counter() - started

    @torch.no_grad()
    def land(self, now: Sequence[torch.Tensor]) -> None:
        """The run's θ moved while this window trained (eager: its previous outer step landed, and
        θ_start was the node's guess of it): add `now` − θ_start to the model, and `now` becomes
        θ_start. `now`: this rank's values of every trainable parameter, in the model's order."""
        if self.paper:
            raise ValueError("the paper's window (H = 1 SGD) has no inner steps to land between")
        started = time.perf_counter()
        for i, (p, new) in enumerate(zip(self.params, now, strict=True)):
            start = self._start(i, p)
            p.add_(new.to(p.device, p.dtype) - start)
            if self.theta is not None:
                self.theta[i].copy_(new)
            else:
                self.snapshot.buffers[i].copy_(_host(new))
            del start
        self.seconds += time.perf_counter() - started

    def _start(self, i: int, p: torch.Tensor) -> torch.Tensor:
        return self.theta[i] if self.theta is not None else self.snapshot.get(i, p)

    def end(self) -> TrainStats:
        """The window's pseudo-gradient into `p.grad` and θ_start back into the model; the stats."""
        if self.paper:
            stats = self.last if self.last is not None else TrainStats(loss=float("nan"), tokens=0, seconds=0.0)
            return TrainStats(loss=stats.loss, tokens=stats.tokens, seconds=self.seconds, scale=self.lr)
        started = time.perf_counter()
        with torch.no_grad():
            for i, p in enumerate(self.params):
                start = self._start(i, p)
                delta = self.summed[i] if self.summed is not None else (start - p.detach()).float()
                p.copy_(start)
                p.grad = delta.to(p.dtype)
                del start
        self.theta = None
        n = sum(size for _, size in self.losses)
        loss = sum(value * size for value, size in self.losses) / n if n else float("nan")
        self.seconds += time.perf_counter() - started
        return TrainStats(loss=loss, tokens=self.tokens, seconds=self.seconds,
                          scale=self.lr if self.summed is not None else 1.0)


def _host(t: torch.Tensor) -> torch.Tensor:
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.detach().cpu()


def inner_steps(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int, grad_clip: float | None, *,
                inner: InnerConfig, optimizer: torch.optim.Optimizer | StreamedOptimizer | None, lr: float,
                step: Callable[[], None] | None = None,
                accumulate: Callable[[torch.Tensor], TrainStats] | None = None,
                snapshot: HostStore | None = None) -> TrainStats:
    """A miner's window: H inner steps from θ_t on `batch` (its sequences dealt into H parts,
    `inner_parts`), leaving the pseudo-gradient in `p.grad` and θ_t in the model (`InnerWindow`, all
    its steps at once). `lr`: the inner rate of this window (`inner_lr`). The returned `scale` is what
    the compressor multiplies `p.grad` by."""
    window = InnerWindow(model, micro_batch_size, grad_clip, inner=inner, optimizer=optimizer, lr=lr, step=step,
                         accumulate=accumulate, snapshot=snapshot)
    window.begin()
    for part in window_parts(batch, inner):
        window.step(part)
    return window.end()


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The accumulated gradients by parameter name (zeros for parameters that got none)."""
    return {name: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
            for name, p in model.named_parameters() if p.requires_grad}


@torch.no_grad()
def evaluate_loss(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int) -> float:
    """Mean next-token loss of `batch` without gradients (used by validators and the report)."""
    device = next(model.parameters()).device
    was_training = model.training
    if batch.size(0) == 0:
        return float("nan")
    model.eval()
    total = 0.0
    for start in range(0, batch.size(0), micro_batch_size):
        micro = batch[start:start + micro_batch_size].to(device, non_blocking=True)
        with _autocast(device):
            total += causal_lm_loss(model, micro).float().item() * micro.size(0)
    model.train(was_training)
    return total / batch.size(0)


@torch.no_grad()
def position_range_means(per_token: torch.Tensor, ranges: int) -> torch.Tensor:
    """[n] mean of each row of per-token losses (`ranges` 1), or [n, ranges] means over `ranges`
    consecutive position ranges of each row (as equal as `tensor_split` makes them)."""
    if ranges == 1:
        return per_token.mean(dim=1)
    return torch.stack([part.mean(dim=1) for part in per_token.tensor_split(ranges, dim=1)], dim=1)


@torch.no_grad()
def sequence_losses(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int, ranges: int = 1
                    ) -> torch.Tensor:
    """Per-sequence mean next-token loss, float64 on CPU: one pass serves many peers' pages. With
    `ranges` > 1, [n, ranges]: the mean over each of that many consecutive position ranges.

    Without gradients: a forward that records its graph keeps a training step's activations alive
    (the 1.2B validator's peak was 58.5 GB on an H200 with it, benchmarks/results/gpu_nvidia_h200.json)."""
    if not 1 <= ranges <= batch.size(1) - 1:
        raise ValueError(f"sequence_losses: {ranges} position ranges for sequences of {batch.size(1)} tokens")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, batch.size(0), micro_batch_size):
        micro = batch[start:start + micro_batch_size].to(device, non_blocking=True)
        with _autocast(device):
            logits = model(input_ids=micro).logits[:, :-1]
        # Class dimension last and contiguous: a transposed [B, V, L] view is ~2x slower on CPU.
        per_token = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(), micro[:, 1:].reshape(-1), reduction="none"
        ).view(micro.size(0), -1)
        out.append(position_range_means(per_token, ranges).double().cpu())
    model.train(was_training)
    return torch.cat(out)
