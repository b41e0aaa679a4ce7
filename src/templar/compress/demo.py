"""DeMo error feedback for a whole model (Algorithm 2, `DeMoPseudoGradient`).

Per parameter, with `e` the error-feedback buffer:

    e <- decay * e + lr * g        # accumulate (the paper's line 4, with the LR folded in as in the reference)
    q  = topk(DCT(e))              # what is sent
    e <- e - iDCT(q)               # what was not sent stays in e

So `e_before * decay + lr * g == e_after + decompress(q)` up to float rounding.

With `offload`, the buffers live in host memory (pinned where CUDA is present) and each is streamed
to its parameter's device for its own step and back: the same operations on the same values, so
the same coefficients and the same buffer bits, for 4 bytes per parameter of host memory instead of
GPU memory and one round trip of the buffer per window.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from templar.compress.compressor import Compressed, DCTCompressor

__all__ = ["DeMo"]


class DeMo:
    """Error-feedback buffers (float32, on each parameter's device, or in host memory with
    `offload`) and the compression step, which runs on each parameter's device."""

    def __init__(
        self,
        params: Mapping[str, torch.Tensor] | nn.Module,
        *,
        compressor: DCTCompressor,
        decay: float,
        offload: bool = False,
    ) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"decay must be in [0, 1], got {decay}")
        if isinstance(params, nn.Module):
            params = {n: p for n, p in params.named_parameters() if p.requires_grad}
        self.compressor = compressor
        self.decay = decay
        self.offload = offload
        self.devices = {name: p.device for name, p in params.items()}
        pin = offload and torch.cuda.is_available()
        self.buffers: dict[str, torch.Tensor] = {
            name: torch.zeros(p.shape, dtype=torch.float32, device="cpu" if offload else p.device, pin_memory=pin)
            for name, p in params.items()
        }

    @torch.no_grad()
    def step(self, grads: Mapping[str, torch.Tensor | None], lr: float) -> dict[str, Compressed]:
        """Fold `lr * grads` into the buffers and return every parameter's compressed update.

        A parameter missing from `grads` (or mapped to None) has a zero gradient this step; its
        buffer still decays and is still sent, so every payload carries every parameter.
        Raises ValueError, before touching any buffer, on unknown names or non-finite gradients.
        """
        unknown = set(grads) - set(self.buffers)
        if unknown:
            raise ValueError(f"gradients for unknown parameters: {sorted(unknown)[:5]}")
        for name, g in grads.items():
            if g is None:
                continue
            if g.shape != self.buffers[name].shape:
                raise ValueError(f"{name}: gradient shape {tuple(g.shape)} != {tuple(self.buffers[name].shape)}")
            if not bool(torch.isfinite(g).all()):
                raise ValueError(f"{name}: non-finite gradient")
        out: dict[str, Compressed] = {}
        for name, stored in self.buffers.items():
            e = self._working(name, stored)
            e.mul_(self.decay)
            g = grads.get(name)
            if g is not None:
                e.add_(g.to(device=e.device, dtype=torch.float32), alpha=lr)
            out[name] = self.compressor.compress_residual_(e)
            if e is not stored:
                stored.copy_(e, non_blocking=stored.is_pinned())
        if self.offload and torch.cuda.is_available():
            torch.cuda.synchronize()  # every host buffer holds its new value before anyone reads it
        return out

    def _working(self, name: str, stored: torch.Tensor) -> torch.Tensor:
        """The buffer to step: itself, or with `offload` a copy on its parameter's device (a separate
        tensor even when that device is the CPU, so the streamed path is the one tests run)."""
        if not self.offload:
            return stored
        work = torch.empty(stored.shape, dtype=torch.float32, device=self.devices[name])
        return work.copy_(stored, non_blocking=stored.is_pinned())

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors (name -> buffer, detached copies), ready for `safetensors.torch.save`."""
        return {name: e.detach().clone() for name, e in self.buffers.items()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore buffers; names and shapes must match exactly (ValueError otherwise)."""
        if set(state) != set(self.buffers):
            missing = sorted(set(self.buffers) - set(state))[:5]
            extra = sorted(set(state) - set(self.buffers))[:5]
            raise ValueError(f"error-feedback state mismatch: missing {missing}, unexpected {extra}")
        for name, e in self.buffers.items():
            src = state[name]
            if src.shape != e.shape:
                raise ValueError(f"{name}: state shape {tuple(src.shape)} != {tuple(e.shape)}")
            if not bool(torch.isfinite(src).all()):
                raise ValueError(f"{name}: non-finite error-feedback state")
        for name, e in self.buffers.items():
            e.copy_(state[name].to(device=e.device, dtype=torch.float32))
