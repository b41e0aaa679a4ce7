"""A sharded node's own state: the one safetensors file of `templar.runtime.state`, for any rank count.

Choice: gathered safetensors rather than torch.distributed.checkpoint. Rank 0
gathers θ (FSDP rows) and the error feedback (from each parameter's owner), one tensor in flight
at a time, and streams them into the same atomic file (temp + fsync + rename) a 1-process node
writes: the header is written first (every name, dtype and shape is known), then each tensor as
it arrives, so rank 0 never holds more than one tensor. The file is replaced by the 1-process
node's own rule (`runtime.state.write_state_file`: `.prev` kept, `core.atomic.atomic_write`),
and loading falls back to `.prev` the same way. A `kill -9` of any rank at any instant
leaves the old or the new file, a torchrun restart resumes exactly, and the node may even restart
with a different rank count (or as one process). The cost is time: every byte goes through rank
0 and its disk (about 16 bytes per parameter: 19 GB at 1.2B, 128 GB at 8B, 1.1 TB at 70B); DCP's
per-rank files would write in parallel but tie the file to the sharding (not built here).

Loading: rank 0 reads one tensor at a time (lazy `safe_open`) and scatters θ's rows; error
feedback goes to its owner. Every check (names, shapes, finiteness) runs on rank 0 before
anything is modified, and its verdict is broadcast, so all ranks raise the same ValueError.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from templar.core.atomic import atomic_write
from templar.distributed.demo import ShardedDeMo
from templar.distributed.fsdp import local, local_rows
from templar.distributed.group import Group, scatter_rows
from templar.runtime.state import (
    EF_PREFIX,
    INNER_PREFIX,
    MODEL_PREFIX,
    NodeState,
    state_metadata,
    write_state_file,
)

__all__ = ["full_model_state", "gather_model", "load_sharded_state", "save_sharded_state", "stream_safetensors",
           "write_stream"]


def gather_model(model: nn.Module, group: Group, dst: int) -> Iterator[tuple[str, torch.Tensor | None]]:
    """(key, full CPU tensor on `dst` / None elsewhere) for θ's state_dict, one collective each."""
    for key, value in model.state_dict().items():
        part = local(value).detach()
        if value.dim() and part is not value:
            full = group.gather_rows(part, value.shape[0], dst=dst)
        else:
            full = part if group.rank == dst else None
        yield key, None if full is None else full.view(value.shape).cpu()


def full_model_state(model: nn.Module, group: Group, dst: int = 0) -> dict[str, torch.Tensor] | None:
    """θ (the model's state_dict) gathered on `dst` as plain CPU tensors; None elsewhere."""
    out = dict(gather_model(model, group, dst))
    return out if group.rank == dst else None


def _inner_params(model: nn.Module, inner: torch.optim.Optimizer | None) -> list[tuple[str, nn.Parameter]]:
    """The parameters whose inner-optimizer state is saved: all of them once the optimizer has
    stepped (every rank steps together, so every rank answers alike), none before."""
    if inner is None:
        return []
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return params if all(p in inner.state and "exp_avg" in inner.state[p] for _, p in params) else []


def _gather_sharded(t: torch.Tensor, p: torch.Tensor, group: Group, dst: int) -> torch.Tensor | None:
    """A state tensor of parameter `p` (sharded as `p` is: its local rows, a DTensor or, with the
    offload, a plain host tensor) gathered whole on `dst` (CPU); None elsewhere."""
    part = local(t).detach()
    if p.dim() and local(p) is not p:
        full = group.gather_rows(part, p.shape[0], dst=dst)
    else:
        full = part if group.rank == dst else None
    return None if full is None else full.view(p.shape).cpu()


def save_sharded_state(path: Path, model: nn.Module, demo: ShardedDeMo | None, state: NodeState,
                       group: Group, inner: torch.optim.Optimizer | None = None,
                       inner_model: nn.Module | None = None) -> None:
    """Collective: rank 0 writes the node's state file (see module doc); `demo` None: no error
    feedback (a validator's state); `inner`: the miner's inner optimizer, whose moments are
    gathered like θ's rows (its parameters are `inner_model`'s: θ's, or an overlapped miner's
    working model). Rank 0 streams each tensor to disk as it arrives, so it never holds more than
    one of them."""
    entries = [(MODEL_PREFIX + k, v.dtype, tuple(v.shape)) for k, v in model.state_dict().items()]
    names = list(demo.shapes) if demo is not None else []
    entries += [(EF_PREFIX + n, torch.float32, tuple(demo.shapes[n])) for n in names]
    moments = _inner_params(inner_model or model, inner)
    for name, p in moments:
        entries += [(f"{INNER_PREFIX}{name}.step", torch.float32, (1,)),
                    (f"{INNER_PREFIX}{name}.exp_avg", torch.float32, tuple(p.shape)),
                    (f"{INNER_PREFIX}{name}.exp_avg_sq", torch.float32, tuple(p.shape))]

    def tensors() -> Iterator[torch.Tensor | None]:
        for _, full in gather_model(model, group, 0):
            yield full
        for name in names:
            yield demo.gather_one(name, 0)
        for _, p in moments:
            st = inner.state[p]
            step = st["step"] if isinstance(st["step"], torch.Tensor) else torch.tensor(float(st["step"]))
            yield step.detach().to("cpu", torch.float32).reshape(1)
            yield _gather_sharded(st["exp_avg"], p, group, 0)
            yield _gather_sharded(st["exp_avg_sq"], p, group, 0)

    stream = tensors()
    try:
        if group.is_leader:  # the one state-file rule: `.prev` kept, then an atomic write
            write_state_file(path, lambda tmp: write_stream(tmp, entries, state_metadata(state), stream))
    finally:
        for _ in stream:  # take part in every gather (rank 0 too, if its write failed early)
            pass
        group.barrier()  # nobody runs ahead of a save that a restart would depend on (nor hangs if it failed)


_DTYPE_NAMES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
                torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def stream_safetensors(path: Path, entries: list[tuple[str, torch.dtype, tuple[int, ...]]], metadata: dict[str, str],
                       tensors: Iterator[torch.Tensor | None]) -> None:
    """Replace `path` atomically (`templar.core.atomic.atomic_write`) by a safetensors file
    written tensor by tensor (`write_stream`)."""
    atomic_write(path, lambda tmp: write_stream(tmp, entries, metadata, tensors))


def write_stream(path: Path, entries: list[tuple[str, torch.dtype, tuple[int, ...]]], metadata: dict[str, str],
                 tensors: Iterator[torch.Tensor | None]) -> None:
    """Write a safetensors file at `path` tensor by tensor (header first: every shape is known up
    front); the caller makes it atomic (`atomic_write` fsyncs and renames). `tensors` yields the
    entries' tensors in order. A write error is raised only after `tensors` is exhausted, so the
    other ranks' collectives inside it still pair up."""
    header: dict[str, object] = {}
    offset = 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    error: Exception | None = None
    f = None
    try:
        f = open(path, "wb")  # noqa: SIM115 - closed below, after the iterator is drained
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
    except OSError as exc:
        error = exc
    for (name, dtype, shape), t in zip(entries, tensors, strict=True):
        if error is not None:
            continue
        try:
            if t is None or t.dtype != dtype or tuple(t.shape) != shape:
                raise ValueError(f"{name}: got {None if t is None else (t.dtype, tuple(t.shape))}, "
                                 f"expected {(dtype, shape)}")
            f.write(memoryview(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()))
        except (OSError, ValueError) as exc:
            error = exc
    if f is not None:
        try:
            f.close()
        except OSError as exc:
            error = error or exc
    if error is not None:
        raise error


def _check_file(path: Path, model: nn.Module, demo: ShardedDeMo | None,
                inner: torch.optim.Optimizer | None = None) -> tuple[str | None, dict | None]:
    """(error, metadata) on rank 0: None error when the file matches this model exactly. The inner
    optimizer's state is optional (a file saved before the first step, or by a validator) but, when
    present and wanted, must be whole; metadata["inner"] says whether it is loaded."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            keys = set(f.keys())
            saved_inner = {k for k in keys if k.startswith(INNER_PREFIX)}
            keys -= saved_inner
            wanted_inner = {f"{INNER_PREFIX}{n}.{field}" for n, p in model.named_parameters() if p.requires_grad
                            for field in ("step", "exp_avg", "exp_avg_sq")} if inner is not None else set()
            use_inner = bool(saved_inner) and saved_inner == wanted_inner
            expected = {MODEL_PREFIX + k: v.shape for k, v in model.state_dict().items()}
            if demo is not None:
                expected.update({EF_PREFIX + n: s for n, s in demo.shapes.items()})
            else:  # a validator ignores error feedback a file may carry
                keys = {k for k in keys if not k.startswith(EF_PREFIX)}
            if keys != set(expected):
                return f"{path}: saved state does not match this model's parameters", None
            for key, shape in expected.items():
                if tuple(f.get_slice(key).get_shape()) != tuple(shape):
                    return f"{path}: {key} has another shape than this model's", None
        return None, {"window": int(meta["window"]), "global_step": int(meta["global_step"]),
                      "extra": json.loads(meta.get("extra", "{}")), "inner": use_inner}
    except Exception as exc:  # safetensors' SafetensorError derives from Exception only
        return f"{path}: unreadable state file: {exc}", None


@torch.no_grad()
def load_sharded_state(path: Path, model: nn.Module, demo: ShardedDeMo | None, group: Group,
                       inner: torch.optim.Optimizer | None = None,
                       inner_model: nn.Module | None = None) -> NodeState | None:
    """Collective: restore θ, the error feedback and (when saved) the inner optimizer's state from
    rank 0's `path`; None when it has no file.

    Raises ValueError on every rank, before modifying anything, when the file does not match.
    """
    from safetensors import safe_open

    header = None
    if group.is_leader:
        if not path.exists():
            header = ("missing", None)
        else:
            error, meta = _check_file(path, model, demo, inner)
            header = ("error", error) if error else ("ok", meta)
    kind, info = group.broadcast_object(header)
    if kind == "missing":
        return None
    if kind == "error":
        raise ValueError(info)
    handle = safe_open(str(path), framework="pt") if group.is_leader else None
    try:
        # finiteness of the error feedback first: a bad file must not half-load
        bad = False
        ef_names = list(demo.shapes) if demo is not None else []
        if handle is not None:
            bad = any(not bool(torch.isfinite(handle.get_tensor(EF_PREFIX + n)).all()) for n in ef_names)
        if group.any_true(bad):
            raise ValueError(f"{path}: non-finite error-feedback state")
        for key, value in model.state_dict().items():
            full = handle.get_tensor(MODEL_PREFIX + key) if handle is not None else None
            mine = local(value)
            if value.dim() and mine is not value:
                rows = scatter_rows(group, full, value.shape, value.dtype, src=0)
                start, end = local_rows(value.shape, group)
                mine.copy_(rows.to(mine.device)[: end - start])
            else:
                full = group.broadcast_object(full)
                mine.copy_(full.to(mine.device))
        for name in ef_names:
            demo.load_from(name, handle.get_tensor(EF_PREFIX + name) if handle is not None else None)
        if info["inner"] and inner is not None:
            for name, p in (inner_model or model).named_parameters():
                if not p.requires_grad:
                    continue
                saved = {key: handle.get_tensor(f"{INNER_PREFIX}{name}.{key}") if handle is not None else None
                         for key in ("step", "exp_avg", "exp_avg_sq")}
                moments = {}
                for key in ("exp_avg", "exp_avg_sq"):
                    moments[key] = torch.zeros_like(p)
                    mine = local(moments[key])
                    if p.dim() and mine is not moments[key]:
                        rows = scatter_rows(group, saved[key], p.shape, torch.float32, src=0)
                        start, end = local_rows(p.shape, group)
                        mine.copy_(rows.to(mine.device)[: end - start])
                    else:
                        mine.copy_(group.broadcast_object(saved[key]).to(mine.device))
                step = group.broadcast_object(saved["step"])
                inner.state[p] = {"step": step.reshape(()).clone(), **moments}
    finally:
        del handle
    return NodeState(window=info["window"], global_step=info["global_step"], extra=info["extra"])
