"""A miner's state in host memory, streamed through the GPU around the step that needs it.

`--memory.offload` (`templar.core.memory.MemorySettings`) keeps three things off the GPU between
the moments they are used:

- the θ_t snapshot of the window's inner steps (`HostStore`): copied out once when the window's
  steps start, back in once when Δ = θ_t − θ_H is formed and θ is reset to θ_t;
- the inner optimizer's moments (`StreamedOptimizer`): per parameter group (a decoder layer, the
  embedding, the head), copied in, stepped, copied out, so the GPU holds one group's moments at a
  time;
- the error-feedback buffers (`templar.compress.DeMo` with `offload`): one tensor at a time.

Every copy is exact and every operation runs on the same device, in the same order, on the same
values as without the offload, so payloads and θ are bit-identical (tests/runtime/test_memory_settings.py;
tests/distributed/ under torchrun, where each rank streams its own shards). Host copies are pinned
where CUDA is present, so the transfers run at the link's speed. On a CPU-only machine the "device"
copy is still a separate tensor: the streamed path is the one the tests run.

FSDP2's own `CPUOffloadPolicy` is not used: it moves θ and the gradients too and runs the optimizer
step on the CPU, a different kernel from the GPU's fused AdamW, whose results would not be the
default's bit for bit.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, MutableMapping, Sequence
from typing import Any

import torch
from torch import nn

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed: no sharded parameters either
    DTensor = None  # type: ignore[assignment,misc]

__all__ = ["HostStore", "StreamedOptimizer", "parameter_groups"]

_LAYER = re.compile(r"^(.*\.layers\.\d+)\.")
_MOMENTS = ("exp_avg", "exp_avg_sq")


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly sharded) tensor."""
    return t.to_local() if DTensor is not None and isinstance(t, DTensor) else t


def _pinned() -> bool:
    return torch.cuda.is_available()


def host_copy(t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """`t`'s local values in host memory (pinned where CUDA is present), into `out` when it fits."""
    local = _local(t).detach()
    if out is None or out.shape != local.shape or out.dtype != local.dtype:
        out = torch.empty(local.shape, dtype=local.dtype, device="cpu", pin_memory=_pinned())
    return out.copy_(local, non_blocking=out.is_pinned())


def device_copy(host: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`host`'s values as a new tensor where `like` lives, sharded as `like` is (a DTensor of the
    same mesh, placements, shape and stride when `like` is one)."""
    local = _local(like)
    out = torch.empty(host.shape, dtype=host.dtype, device=local.device)
    out.copy_(host, non_blocking=host.is_pinned())
    if DTensor is not None and isinstance(like, DTensor):
        return DTensor.from_local(out, like.device_mesh, like.placements, run_check=False, shape=like.shape,
                                  stride=like.stride())
    return out


def wait() -> None:
    """Every queued copy into host memory has landed (a no-op without CUDA)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def parameter_groups(model: nn.Module) -> list[list[nn.Parameter]]:
    """The model's trainable parameters in the groups the offload streams: each decoder layer's
    together (`….layers.<i>.…`), every other parameter alone (embedding, final norm, head), in the
    model's order."""
    groups: dict[str, list[nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            match = _LAYER.match(name)
            groups.setdefault(match.group(1) if match else name, []).append(p)
    return list(groups.values())


class HostStore:
    """Host copies of a list of tensors (θ_t's parameters), allocated once and reused every window."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []

    def put(self, tensors: Sequence[torch.Tensor]) -> None:
        """Copy `tensors` (their local shards) out of the GPU."""
        old = self.buffers
        self.buffers = [host_copy(t, old[i] if i < len(old) else None) for i, t in enumerate(tensors)]
        wait()

    def get(self, index: int, like: torch.Tensor) -> torch.Tensor:
        """Tensor `index` back on `like`'s device (sharded like it)."""
        return device_copy(self.buffers[index], like)


class _HostState(MutableMapping):
    """The inner optimizer's state by parameter, as `torch.optim.Optimizer.state` is read and
    written by `runtime.state` and `distributed.checkpoint`: the moments are host tensors (a sharded
    parameter's local rows), written there when assigned."""

    def __init__(self, owner: StreamedOptimizer) -> None:
        self._owner = owner

    def __getitem__(self, p: torch.Tensor) -> dict[str, Any]:
        opt = self._owner.optimizer_of(p)
        if p not in opt.state:
            raise KeyError(p)
        return opt.state[p]

    def __setitem__(self, p: torch.Tensor, value: dict[str, Any]) -> None:
        opt = self._owner.optimizer_of(p)
        opt.state[p] = {k: host_copy(v) if k in _MOMENTS else v for k, v in value.items()}
        wait()

    def __delitem__(self, p: torch.Tensor) -> None:
        del self._owner.optimizer_of(p).state[p]

    def __iter__(self) -> Iterator[torch.Tensor]:
        for opt in self._owner.optimizers:
            yield from list(opt.state)

    def __len__(self) -> int:
        return sum(len(opt.state) for opt in self._owner.optimizers)


class StreamedOptimizer:
    """The inner optimizer with its moments in host memory: one torch optimizer per parameter group
    (`parameter_groups`), each built by `make` with the same settings; `step` copies a group's
    moments to the device, steps that group, and copies them back before the next group's.

    What `runtime.train.inner_steps` and the state files use of a torch optimizer: `param_groups`
    (the learning rate is set there), `step()` and `state` (`_HostState`)."""

    def __init__(self, groups: Sequence[Sequence[nn.Parameter]],
                 make: Callable[[list[nn.Parameter]], torch.optim.Optimizer]) -> None:
        self.optimizers = [make(list(group)) for group in groups if group]
        self.param_groups = [pg for opt in self.optimizers for pg in opt.param_groups]
        self._owner = {id(p): opt for opt in self.optimizers for pg in opt.param_groups for p in pg["params"]}
        self.state = _HostState(self)

    def optimizer_of(self, p: torch.Tensor) -> torch.optim.Optimizer:
        try:
            return self._owner[id(p)]
        except KeyError:
            raise KeyError("not a parameter of this optimizer") from None

    @torch.no_grad()
    def step(self) -> None:
        for opt in self.optimizers:
            params = [p for pg in opt.param_groups for p in pg["params"]]
            host = {p: opt.state[p] for p in params if p in opt.state}
            for p, st in host.items():  # the group's moments onto the device, sharded as its parameters
                opt.state[p] = {k: device_copy(v, p) if k in _MOMENTS else v for k, v in st.items()}
            opt.step()
            for p in params:  # and back into their host buffers (allocated at the group's first step)
                if p in opt.state:
                    old = host.get(p, {})
                    opt.state[p] = {k: host_copy(v, old.get(k)) if k in _MOMENTS else v
                                    for k, v in opt.state[p].items()}
        wait()
