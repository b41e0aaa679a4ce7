"""A node's own resumable state: model, error feedback, global_step and last applied window.

Everything lives in ONE safetensors file written to a temp name, fsynced and renamed, so a
`kill -9` at any instant leaves either the old state or the new one, never a mix: the restarted
node neither applies an aggregate twice nor skips one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from templar.atomic import atomic_write

_MODEL = "model."
_EF = "ef."


@dataclass
class NodeState:
    window: int                 # last window whose aggregate is applied to `model`
    global_step: int
    extra: dict[str, object] = field(default_factory=dict)


def save_node_state(path: Path, model: torch.nn.Module, error_feedback: dict[str, torch.Tensor],
                    state: NodeState) -> None:
    tensors = {_MODEL + k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}
    tensors.update({_EF + k: v.detach().to("cpu").contiguous() for k, v in error_feedback.items()})
    meta = {"window": str(state.window), "global_step": str(state.global_step),
            "extra": json.dumps(state.extra, sort_keys=True)}
    atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_node_state(path: Path, model: torch.nn.Module) -> tuple[NodeState, dict[str, torch.Tensor]] | None:
    """Restore `model` in place and return (state, error feedback); None when there is no state.

    Raises ValueError when the file does not match the model (another preset, a corrupt file):
    the caller starts fresh rather than training on a silently mismatched model.
    """
    if not path.exists():
        return None
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    tensors = load_file(str(path))
    model_sd = {k[len(_MODEL):]: v for k, v in tensors.items() if k.startswith(_MODEL)}
    expected = model.state_dict()
    if set(model_sd) != set(expected) or any(model_sd[k].shape != expected[k].shape for k in expected):
        raise ValueError(f"{path}: saved model does not match this model's parameters")
    device = next(model.parameters()).device
    model.load_state_dict({k: v.to(device) for k, v in model_sd.items()})
    ef = {k[len(_EF):]: v.to(device) for k, v in tensors.items() if k.startswith(_EF)}
    state = NodeState(window=int(meta["window"]), global_step=int(meta["global_step"]),
                      extra=json.loads(meta.get("extra", "{}")))
    return state, ef
