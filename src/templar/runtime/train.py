"""Local training inside a window: gradient accumulation over a miner's pages.

Kept apart from the miner so the convergence benchmark and tests train exactly the same way.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from templar.core.model import causal_lm_loss


@dataclass(frozen=True)
class TrainStats:
    loss: float          # mean loss over the window's sequences
    tokens: int
    seconds: float       # forward + backward time only

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
def sequence_losses(model: torch.nn.Module, batch: torch.Tensor, micro_batch_size: int) -> torch.Tensor:
    """Per-sequence mean next-token loss, float64 on CPU: one pass serves many peers' pages."""
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
        out.append(per_token.mean(dim=1).double().cpu())
    model.train(was_training)
    return torch.cat(out)
