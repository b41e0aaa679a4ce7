"""FSDP2: shard the model per transformer block, then the root; find each rank's rows.

`fully_shard` turns every parameter into a DTensor sharded on dim 0 (torch.chunk layout: each
rank holds `ceil(rows / N)` rows, the last ranks fewer, possibly none). Each block's parameters
are all-gathered just before its forward/backward and freed after, so a rank holds one block's
full weights at a time plus its 1/N shard of everything; gradients are reduce-scattered.

θ, gradients, the error feedback and the outer step stay float32 on every device. On GPU the
forward/backward run on bf16 copies (FSDP's mixed-precision policy, gradients reduced in float32);
on CPU everything is float32.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from templar.core.model import checkpoint_activations as enable_checkpointing
from templar.distributed.group import Group

__all__ = ["blocks", "local", "local_rows", "mixed_precision", "reshard", "rows_per_rank", "shard_model", "units"]


def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (LLaMA decoder layers): one FSDP unit each."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers to shard per block")
    return list(layers)


def units(model: nn.Module) -> list[nn.Module]:
    """The FSDP units below the root: every transformer block, and the input embedding and the
    output head as units of their own when they are not tied (each is as large as a block at
    8B/70B; in the root they would be all-gathered together). The root keeps the final norm."""
    out = blocks(model)
    if not getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        for attr in ("get_input_embeddings", "get_output_embeddings"):
            module = getattr(model, attr, lambda: None)()
            if isinstance(module, nn.Module):
                out.append(module)
    return out


def mixed_precision(device: torch.device) -> MixedPrecisionPolicy | None:
    """GPU: bf16 compute copies, float32 gradient reduction and float32 master θ (the paper's
    setting; autocast alone would keep every block's bf16 weight copy alive until backward).
    CPU: none, everything float32, as the 1-process CPU node."""
    if device.type == "cuda":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return None


def shard_model(model: nn.Module, group: Group, *, checkpoint_activations: bool = False) -> nn.Module:
    """Move `model` to the group's device and shard it in place (units, then root); returns it.

    Every rank must build the identical model first (`build_model` is deterministic from the
    run's seed), so the shards together are exactly the 1-process θ. `checkpoint_activations`
    (the miner's `--memory.checkpoint_activations`) recomputes each block in backward instead of
    keeping its activations: a node-local memory/time trade (gradients unchanged, bit for bit on
    CPU), needed for 70B (docs/mining.md §12).
    """
    if checkpoint_activations:
        enable_checkpointing(model)
    model.to(group.device)
    policy = mixed_precision(group.device)
    kwargs = {"mp_policy": policy} if policy is not None else {}
    for unit in units(model):
        fully_shard(unit, **kwargs)
    # The root too is resharded after forward: a no-grad forward (evaluation) must not leave the
    # module holding unsharded copies, or an in-place update of the shards would be lost.
    fully_shard(model, reshard_after_forward=True, **kwargs)
    return model


def reshard(model: nn.Module) -> None:
    """Free every unsharded copy, so that `named_parameters()` are the DTensor shards again."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly DTensor) parameter or gradient."""
    return t.to_local() if isinstance(t, DTensor) else t


def rows_per_rank(rows: int, world_size: int) -> int:
    return math.ceil(rows / world_size) if rows else 0


def local_rows(shape: torch.Size | tuple[int, ...], group: Group) -> tuple[int, int]:
    """[start, end) of dim 0 that this rank holds of a parameter of `shape` (FSDP2 layout)."""
    rows = shape[0]
    per = rows_per_rank(rows, group.world_size)
    start = min(group.rank * per, rows)
    return start, min(start + per, rows)


def check_layout(model: nn.Module, group: Group) -> None:
    """Raise if FSDP's local shards are not the rows `local_rows` predicts (a torch change)."""
    for name, p in model.named_parameters():
        start, end = local_rows(p.shape, group)
        got = local(p).shape[0] if p.dim() else 1
        if p.dim() and got != end - start:
            raise RuntimeError(f"{name}: local shard has {got} rows, expected {end - start}")
