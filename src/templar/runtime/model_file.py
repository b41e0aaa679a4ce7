"""θ as one plain safetensors file: the lead's published checkpoint, loadable by any node.

One check decides whether a file is this run's model (`check_model_file`): every name, shape and
dtype of the model, and finite values. A one-process node loads it here (`load_model_file`); a
node over torchrun's ranks runs the same check on rank 0 and scatters the rows
(`templar.distributed.compute`), so both kinds of node refuse exactly the same files.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from templar.comms import CheckpointError
from templar.core.atomic import atomic_write

__all__ = ["check_model_file", "load_model_file", "write_model_file"]


def check_model_file(path: Path, expected: dict[str, torch.Tensor]) -> str | None:
    """None when `path` holds exactly `expected`'s tensors (names, shapes, dtypes) with finite
    values; else what is wrong, in one line."""
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            if names != set(expected):
                return f"{path.name}: tensor names differ from the model ({len(names ^ set(expected))} mismatched)"
            for name in names:
                t = f.get_tensor(name)
                ref = expected[name]
                if tuple(t.shape) != tuple(ref.shape) or t.dtype != ref.dtype:
                    return f"{path.name}: {name} is {t.dtype}{tuple(t.shape)}, expected {ref.dtype}{tuple(ref.shape)}"
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    return f"{path.name}: {name} holds non-finite values"
    except (SafetensorError, OSError) as exc:
        return f"{path.name}: not a valid safetensors file: {exc}"
    return None


@torch.no_grad()
def load_model_file(model: torch.nn.Module, path: Path) -> None:
    """Load a checkpoint into `model` after `check_model_file`; CheckpointError (model untouched)
    when the file does not fit."""
    expected = model.state_dict()
    problem = check_model_file(path, expected)
    if problem is not None:
        raise CheckpointError(problem)
    device = next(model.parameters()).device
    with safe_open(str(path), framework="pt") as f:
        model.load_state_dict({name: f.get_tensor(name).to(device) for name in expected})


def write_model_file(model: torch.nn.Module, path: Path) -> None:
    """θ of a one-process node as the file `load_model_file` reads (atomic: temp file, fsync, rename).

    Every tensor is copied, as the node's state file copies it (`runtime.state`): tied weights
    (`model.tie_word_embeddings`, the embedding and the LM head one tensor under two names) are then
    written under both names, which safetensors refuses for tensors that share memory."""
    tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp)))
