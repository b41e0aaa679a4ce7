"""A node's own resumable state: model, error feedback, global_step and last applied window.

Everything lives in ONE safetensors file written to a temp name, fsynced and renamed, so a
`kill -9` at any instant leaves either the old state or the new one, never a mix: the restarted
node neither applies an aggregate twice nor skips one. The state before it is kept as
`<name>.prev` (a hard link, so free), and `load_node_state_or_previous` falls back to it when the
newest file is unreadable (a truncated or corrupted disk): one window is redone, none is lost.
The state file is a window's commit point: records of a window are appended before it, and
`trim_records` drops those of windows the restored state never committed.
"""

from __future__ import annotations

import contextlib
import errno as errno_module
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from templar.core.atomic import Writer, atomic_write

STATE_FILE = "state.safetensors"

_MODEL = "model."
_EF = "ef."
MODEL_PREFIX, EF_PREFIX = _MODEL, _EF  # the state file's tensor-name prefixes (templar.distributed reads them)
INNER_PREFIX = "inner."
"""The inner optimizer's state (a miner's AdamW moments and step count) in the state file."""
_INNER_FIELDS = ("step", "exp_avg", "exp_avg_sq")


def inner_tensors(optimizer: torch.optim.Optimizer | None, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The inner optimizer's state as named tensors (`inner.<param>.<field>`), host copies of their
    own, {} when it keeps none yet (no step taken) or there is no inner optimizer."""
    if optimizer is None:
        return {}
    out = {}
    by_param = {id(p): name for name, p in model.named_parameters()}
    for p, state in optimizer.state.items():
        name = by_param.get(id(p))
        if name is None or set(state) != set(_INNER_FIELDS):
            continue
        for key in _INNER_FIELDS:
            value = state[key]
            value = value if isinstance(value, torch.Tensor) else torch.tensor(float(value))
            value = value.detach().to("cpu", torch.float32, copy=True)  # not the live moments: see state_tensors
            out[f"{INNER_PREFIX}{name}.{key}"] = (value.reshape(1) if key == "step" else value).contiguous()
    return out


def load_inner_tensors(optimizer: torch.optim.Optimizer | None, model: torch.nn.Module,
                       tensors: dict[str, torch.Tensor]) -> bool:
    """Restore the inner optimizer from `inner_tensors`' names; False (optimizer untouched) when
    the file holds none, or not exactly one state of the right shapes for every parameter."""
    if optimizer is None or not tensors:
        return False
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    wanted = {f"{INNER_PREFIX}{name}.{key}" for name in params for key in _INNER_FIELDS}
    if set(tensors) != wanted:
        return False
    for name, p in params.items():
        for key in ("exp_avg", "exp_avg_sq"):
            t = tensors[f"{INNER_PREFIX}{name}.{key}"]
            if t.shape != p.shape or not bool(torch.isfinite(t).all()):
                return False
    for name, p in params.items():
        optimizer.state[p] = {
            "step": tensors[f"{INNER_PREFIX}{name}.step"].reshape(()).clone(),
            "exp_avg": tensors[f"{INNER_PREFIX}{name}.exp_avg"].to(p.device, p.dtype).clone(),
            "exp_avg_sq": tensors[f"{INNER_PREFIX}{name}.exp_avg_sq"].to(p.device, p.dtype).clone(),
        }
    return True


@dataclass
class NodeState:
    window: int                 # last window whose aggregate is applied to `model`
    global_step: int
    extra: dict[str, object] = field(default_factory=dict)


def save_node_state(path: Path, model: torch.nn.Module, error_feedback: dict[str, torch.Tensor],
                    state: NodeState, inner: dict[str, torch.Tensor] | None = None) -> None:
    """θ, the error feedback and the inner optimizer's state (`inner_tensors`) in one atomic file."""
    write_state_tensors(path, state_tensors(model, error_feedback, inner), state)


def state_tensors(model: torch.nn.Module, error_feedback: dict[str, torch.Tensor],
                  inner: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The state file's tensors as host copies of their own: what the node computes next (an inner
    step, an outer step) cannot change them while the file is written."""
    tensors = {_MODEL + k: v.detach().to("cpu", copy=True).contiguous() for k, v in model.state_dict().items()}
    tensors.update({_EF + k: v.detach().to("cpu", copy=True).contiguous() for k, v in error_feedback.items()})
    tensors.update(inner or {})  # `inner_tensors` are copies already
    return tensors


def write_state_tensors(path: Path, tensors: dict[str, torch.Tensor], state: NodeState) -> None:
    """`state_tensors` into the state file (`write_state_file`: `.prev` kept, atomic)."""
    write_state_file(path, lambda tmp: save_file(tensors, str(tmp), metadata=state_metadata(state)))


def state_metadata(state: NodeState) -> dict[str, str]:
    """The state file's metadata strings (window, global_step, extra)."""
    return {"window": str(state.window), "global_step": str(state.global_step),
            "extra": json.dumps(state.extra, sort_keys=True)}


class StateWriteError(Exception):
    """The node's state file could not be written: a full disk, a file-size limit, a read-only or
    forbidden directory. The message is one line naming the path and the error (errno and its name
    where the system gave one); the previous state file is untouched."""

    def __init__(self, path: Path, exc: BaseException) -> None:
        code = getattr(exc, "errno", None)
        if code is None and (found := re.search(r"os error (\d+)", str(exc))):  # safetensors' Rust I/O errors
            code = int(found.group(1))
        name = errno_module.errorcode.get(code, "") if isinstance(code, int) else ""
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        super().__init__(f"cannot write the node's state {path}: {f'errno {code} ({name}) ' if name else ''}"
                         f"{str(why)[:160]}")
        self.path = path
        self.errno = code


def write_state_file(path: Path, writer: Writer) -> None:
    """The one way a node's state file is replaced, by one process or by a sharded node's rank 0:
    the current file is kept as `.prev`, then `writer` fills a temporary file that `atomic_write`
    fsyncs and renames over `path`. `StateWriteError` for any local disk failure."""
    try:
        _remove_dead_writers_temps(path)
        if path.exists():
            _keep_previous(path)
        atomic_write(path, writer)
    except (OSError, SafetensorError) as exc:
        raise StateWriteError(path, exc) from exc


def _remove_dead_writers_temps(path: Path) -> None:
    """Delete the temporary files `atomic_write` named `.<name>.<pid>.<8 hex>.tmp` beside `path`.

    Why: a `kill -9` during a save skips `atomic_write`'s cleanup and leaves a temporary file the
    size of a whole state (GBs on a real model) that nothing else removes, so every crash mid-save
    costs that much disk for good, until the saves fail. Safe: one process holds a state directory
    (`node.lock`) and saves its state one at a time, so a temporary file of `path` that exists
    before a save belongs to a writer that died.
    """
    temp = re.compile(re.escape(f".{path.name}.") + r"[0-9]+\.[0-9a-f]{8}\.tmp")
    try:
        names = [entry.name for entry in os.scandir(path.parent)]
    except FileNotFoundError:
        return
    for name in filter(temp.fullmatch, names):
        with contextlib.suppress(OSError):  # best effort: the save itself says what is wrong
            (path.parent / name).unlink(missing_ok=True)


def previous_path(path: Path) -> Path:
    return path.with_name(path.name + ".prev")


def _keep_previous(path: Path) -> None:
    """`path.prev` becomes the current state (a hard link; a copy where links are unsupported)."""
    prev, tmp = previous_path(path), path.with_name(path.name + ".prev.tmp")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:
        shutil.copyfile(path, tmp)
    os.replace(tmp, prev)


Loaded = tuple[NodeState, dict[str, torch.Tensor]]


def load_node_state_or_previous(path: Path, model: torch.nn.Module, *,
                                load: Callable[[Path], Loaded | None] | None = None,
                                ) -> tuple[Loaded | None, str]:
    """The newest readable state and where it came from ("state", "previous state (…)", or
    "nothing"). Raises ValueError only when neither file is usable. `load` reads one file into
    the model (default `load_node_state`; a sharded node passes its collective loader, which
    raises the same ValueError on every rank, so every rank takes the same branch here)."""
    load = load or (lambda p: load_node_state(p, model))
    try:
        return load(path), "state"
    except (ValueError, SafetensorError, OSError, KeyError) as exc:
        problem = f"{path.name} unreadable ({str(exc)[:120]})"
    prev = previous_path(path)
    try:
        loaded = load(prev)
    except (ValueError, SafetensorError, OSError, KeyError) as exc:
        raise ValueError(f"{problem}; {prev.name} unreadable too ({str(exc)[:120]})") from exc
    if loaded is None:
        raise ValueError(f"{problem}; no previous state")
    return loaded, f"previous state ({problem})"


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
    try:  # before the model is touched: a file refused here must leave it as it was
        state = NodeState(window=int(meta["window"]), global_step=int(meta["global_step"]),
                          extra=json.loads(meta.get("extra", "{}")))
    except (KeyError, ValueError) as exc:  # json's errors are ValueErrors
        raise ValueError(f"{path}: unreadable state metadata ({exc!r})") from exc
    if not isinstance(state.extra, dict):
        raise ValueError(f"{path}: unreadable state metadata (extra is not an object)")
    tensors = load_file(str(path))
    model_sd = {k[len(_MODEL):]: v for k, v in tensors.items() if k.startswith(_MODEL)}
    expected = model.state_dict()
    if set(model_sd) != set(expected) or any(model_sd[k].shape != expected[k].shape for k in expected):
        raise ValueError(f"{path}: saved model does not match this model's parameters")
    device = next(model.parameters()).device
    model.load_state_dict({k: v.to(device) for k, v in model_sd.items()})
    ef = {k[len(_EF):]: v.to(device) for k, v in tensors.items() if k.startswith(_EF)}
    ef.update({k: v for k, v in tensors.items() if k.startswith(INNER_PREFIX)})  # the caller splits them off
    return state, ef
