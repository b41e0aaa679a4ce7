"""Everything a node computes on its θ, behind one small interface the role loops and catch-up call.

A node is one process (`python neurons/miner.py`) or N ranks under torchrun. The loops never
touch θ directly: they call the node's `compute` (`templar.runtime.node.Node.compute`), built
with the node and held by it, as torchtitan's `Trainer` holds the components it built:

- `LocalCompute` for one process (what `start_node` builds): exactly the 1-process functions
  (`accumulate_gradients`, `DeMo.step`, `outer_step`, `apply_update`, `save_node_state`, ...),
  called on the node's model, nothing around them: no process group, no FSDP, no broadcast;
- `templar.distributed.compute.NodeCompute` under torchrun: the same ops over the node's ranks,
  θ sharded with FSDP2 (the launcher puts it in the node's `compute` before the role starts).

The consensus rules live once, below both: `runtime.consensus.outer.update_step` and `apply_update` (the
sharded node calls `apply_update` on each rank's rows), `compress.aggregate`, the state file's
`runtime.state.write_state_file` (atomic write with the `.prev` fallback) and the model file's
`runtime.model_file.check_model_file`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from templar.compress import Compressed, DeMo
from templar.compress.methods import rule_of
from templar.core.config import HParams, overlapped
from templar.core.memory import MemorySettings
from templar.core.model import build_model, checkpoint_activations
from templar.runtime.consensus.fingerprint import model_fingerprint
from templar.runtime.consensus.outer import OuterStep, apply_update, collect_probes, outer_step
from templar.runtime.model_file import load_model_file, write_model_file
from templar.runtime.offload import HostStore
from templar.runtime.state import (
    INNER_PREFIX,
    NodeState,
    inner_tensors,
    load_inner_tensors,
    load_node_state_or_previous,
    state_tensors,
    write_state_tensors,
)
from templar.runtime.train import (
    InnerWindow,
    TrainStats,
    evaluate_loss,
    gradients,
    make_inner_optimizer,
    window_parts,
)
from templar.wire import Gradient

__all__ = ["Compute", "LocalCompute", "PeerScorer"]


class PeerScorer(Protocol):
    """The validator's primary evaluation (`templar.validator.evaluate.Evaluator.score_peers`):
    LossScores of every peer's signed update on its assigned pages and on random pages. Each
    node kind has one (the 1-process `Evaluator`, the sharded `NodeCompute`), and both must take
    the same arguments: `tests/distributed/test_compute.py` compares their signatures, because a
    missing argument on one of them only shows when a multi-rank validator first scores."""

    def score_peers(self, signs_by_peer: Mapping[str, dict[str, torch.Tensor]], assigned: dict[str, torch.Tensor],
                    random_batch: torch.Tensor, beta: float, page_sequences: int | None = None) -> dict[str, Any]: ...


class Compute(Protocol):
    """The node's θ and the ops on it (each op runs on all of the node's ranks together)."""

    world_size: int
    base_model: nn.Module | None
    """A delayed run's validator: θ before its latest outer step (`keep_base`), None until kept."""

    def enable_error_feedback(self) -> None:
        """A miner's: keep DeMo's error-feedback buffers (saved and restored with θ)."""

    def train(self, batch: torch.Tensor, micro_batch_size: int, grad_clip: float | None, lr: float) -> TrainStats:
        """The window's inner steps (`runtime.train.inner_steps` at inner rate `lr`): the
        pseudo-gradient is left for `compress`, θ_t stays the model. `begin_window`, one
        `inner_step` per part of `runtime.train.window_parts` and `end_window`, at once."""

    def begin_window(self, lr: float, micro_batch_size: int, grad_clip: float | None, *,
                     proxy: dict[str, torch.Tensor] | None = None, proxy_step: int = 0) -> None:
        """Start a window's inner steps at inner rate `lr` from θ as it is now (`runtime.train.InnerWindow`).
        A blocking run trains θ itself (its base is put back at `end_window`); an overlapped run
        (`HParams.inner.overlap`) trains its working model, a copy of θ, so the run's θ can take
        outer steps meanwhile. `proxy` (eager): the node's own last update, applied to the working
        model by the outer rule at `proxy_step` (`runtime.consensus.outer.apply_update`) before the steps."""

    def inner_step(self, part: torch.Tensor) -> None:
        """One inner step of the window begun on `part`."""

    def land(self) -> None:
        """Eager: θ took the outer step the proxy stood for; the working model moves by θ − its
        start, and θ becomes the base the window's pseudo-gradient is formed against."""

    def end_window(self) -> TrainStats:
        """The window's pseudo-gradient (against its start, or θ once `land` ran) for `compress`."""

    def compress(self, scale: float) -> dict[str, Compressed]:
        """The DeMo step on the pending pseudo-gradient times `scale` (`TrainStats.scale`), which
        it clears: the node's payload."""

    def probes(self, window: int) -> dict[str, torch.Tensor]: ...

    def keep_base(self) -> None:
        """A validator of a delayed run, before each outer step: copy θ into its base model (θ one
        window older than the run's, which the miners' next updates are computed from)."""

    def base_probes(self, window: int) -> dict[str, torch.Tensor]:
        """`probes` of the base model (`keep_base`)."""

    @property
    def base_evaluator(self) -> PeerScorer | None:
        """`score_peers` over all ranks against the base model (`keep_base`), or None: the caller
        uses its own 1-process `Evaluator` on `base_model`."""

    def fingerprint(self, window: int) -> torch.Tensor:
        """`runtime.consensus.fingerprint.model_fingerprint` of θ for `window` (float32, CPU)."""

    def reset_model(self) -> None:
        """θ ← θ_0 of the run (a re-sync with no checkpoint published yet)."""

    def outer_step(self, gradients: Sequence[Gradient], state: NodeState, *,
                   keep_signs: bool = True, clip_norm: float | None = None) -> OuterStep | None:
        """`runtime.consensus.outer.outer_step` (`clip_norm`: the lead's ceiling on the clip level);
        `keep_signs=False` lets a sharded node drop the full signs."""

    def apply_update(self, signs: dict[str, torch.Tensor], step: int) -> float:
        """`runtime.consensus.outer.apply_update` of the lead's signs (catch-up)."""

    def evaluate_loss(self, batch: torch.Tensor) -> float: ...

    @property
    def evaluator(self) -> PeerScorer | None:
        """An object with the validator's `score_peers` over all ranks, or None: the caller uses
        its own 1-process `Evaluator` on the node's model."""

    def save_state(self, path: Path, state: NodeState) -> None: ...

    def load_state(self, path: Path) -> tuple[NodeState | None, str]:
        """Restore θ (and error feedback) from the state file or its `.prev`; (None, "nothing")
        without a file. Raises ValueError when neither file is usable."""

    def load_model_file(self, path: Path) -> None:
        """A published checkpoint (CheckpointError before any change when it does not fit)."""

    def write_model_file(self, path: Path) -> None:
        """θ as the one plain safetensors file any node of any rank count can load."""


class LocalCompute:
    """One process: the plain functions on the plain model (see the module doc). `memory`: the
    node's memory settings (`templar.core.memory`), which change where state lives and what is
    recomputed, never a result.

    One op runs at a time (`_lock`), as over torchrun's ranks: the overlapped miner calls the
    outer step, the state save and the fingerprint from its exchange while its next window trains,
    one inner step per op, so they interleave between two inner steps and never race on a tensor
    (the inner optimizer's moments, which a save reads and a step writes)."""

    world_size = 1
    evaluator = None

    def __init__(self, model: nn.Module, hp: HParams, memory: MemorySettings | None = None) -> None:
        self.model = model
        self.hp = hp
        self.memory = memory or MemorySettings()
        self.demo: DeMo | None = None
        self.inner_optimizer = None
        self.snapshot = HostStore() if self.memory.offload else None
        if self.memory.checkpoint_activations:
            checkpoint_activations(model)
        self.work = model
        """The model the inner steps train: θ itself (blocking), or a working copy (overlapped)."""
        self.window: InnerWindow | None = None
        self.base_model: nn.Module | None = None
        """A delayed run's validator: θ before its latest outer step (`keep_base`)."""
        self._lock = threading.RLock()

    def enable_error_feedback(self) -> None:
        with self._lock:
            if self.demo is None:
                hp = self.hp
                if overlapped(hp.inner):
                    self.work = self._twin()
                compressor = rule_of(hp.optimizer.method).compressor(hp.demo.target_chunk, hp.demo.topk)
                self.demo = DeMo(self.work, compressor=compressor, decay=hp.demo.momentum_decay,
                                 offload=self.memory.offload)
                self.inner_optimizer = make_inner_optimizer(self.work, hp.inner, offload=self.memory.offload)

    def _twin(self) -> nn.Module:
        """A second model of the run's architecture on θ's device, holding θ's values."""
        device = next(self.model.parameters()).device
        twin = build_model(self.hp).to(device)
        if self.memory.checkpoint_activations:
            checkpoint_activations(twin)
        _copy_parameters(twin, self.model)
        return twin

    @property
    def error_feedback(self) -> dict[str, torch.Tensor]:
        return self.demo.buffers if self.demo is not None else {}

    def train(self, batch: torch.Tensor, micro_batch_size: int, grad_clip: float | None, lr: float) -> TrainStats:
        with self._lock:
            self.begin_window(lr, micro_batch_size, grad_clip)
            for part in window_parts(batch, self.hp.inner):
                self.inner_step(part)
            return self.end_window()

    def begin_window(self, lr: float, micro_batch_size: int, grad_clip: float | None, *,
                     proxy: dict[str, torch.Tensor] | None = None, proxy_step: int = 0) -> None:
        with self._lock:
            if self.work is not self.model:
                _copy_parameters(self.work, self.model)
                if proxy:
                    apply_update(self.work, proxy, proxy_step, self.hp)
            elif proxy:
                raise ValueError("a proxy step needs the working model of an overlapped run")
            self.window = InnerWindow(self.work, micro_batch_size, grad_clip, inner=self.hp.inner,
                                      optimizer=self.inner_optimizer, lr=lr, snapshot=self.snapshot)
            self.window.begin()

    def inner_step(self, part: torch.Tensor) -> None:
        with self._lock:
            self._window().step(part)

    def land(self) -> None:
        with self._lock:
            if self.work is self.model:
                raise ValueError("land() needs the working model of an overlapped run")
            self._window().land([p.detach() for p in self.model.parameters() if p.requires_grad])

    def end_window(self) -> TrainStats:
        with self._lock:
            stats = self._window().end()
            self.window = None
            return stats

    def _window(self) -> InnerWindow:
        if self.window is None:
            raise RuntimeError("no window's inner steps begun (begin_window)")
        return self.window

    def compress(self, scale: float) -> dict[str, Compressed]:
        with self._lock:
            if self.demo is None:
                raise RuntimeError("compress() needs enable_error_feedback() (a miner's op)")
            compressed = self.demo.step(gradients(self.work), scale)
            self.work.zero_grad(set_to_none=True)
            return compressed

    def probes(self, window: int) -> dict[str, torch.Tensor]:
        with self._lock:
            return collect_probes(self.model, window, self.hp)

    def fingerprint(self, window: int) -> torch.Tensor:
        with self._lock:
            return model_fingerprint(self.model, self.hp.data.data_seed, window, self.hp.sync.fingerprint_positions)

    def reset_model(self) -> None:
        with self._lock:
            self.model.load_state_dict(build_model(self.hp).state_dict())  # deterministic from init_seed

    def outer_step(self, gradients: Sequence[Gradient], state: NodeState, *,
                   keep_signs: bool = True, clip_norm: float | None = None) -> OuterStep | None:
        with self._lock:
            return outer_step(self.model, gradients, state, self.hp, clip_norm=clip_norm)

    def apply_update(self, signs: dict[str, torch.Tensor], step: int) -> float:
        with self._lock:
            return apply_update(self.model, signs, step, self.hp)

    def keep_base(self) -> None:
        with self._lock:
            if self.base_model is None:
                self.base_model = self._twin()
            else:
                _copy_parameters(self.base_model, self.model)

    def base_probes(self, window: int) -> dict[str, torch.Tensor]:
        with self._lock:
            return collect_probes(self._base(), window, self.hp)

    base_evaluator = None

    def _base(self) -> nn.Module:
        if self.base_model is None:
            raise RuntimeError("no base model kept (keep_base)")
        return self.base_model

    def evaluate_loss(self, batch: torch.Tensor) -> float:
        with self._lock:
            return evaluate_loss(self.model, batch, self.hp.optimizer.micro_batch_size)

    def save_state(self, path: Path, state: NodeState) -> None:
        """The state file, from copies made under the lock (θ, the error feedback and the inner
        optimizer's moments as they are between two ops) and written after it, so the next inner
        step does not wait for the disk."""
        with self._lock:
            tensors = state_tensors(self.model, self.error_feedback, inner_tensors(self.inner_optimizer, self.work))
        write_state_tensors(path, tensors, state)

    def load_state(self, path: Path) -> tuple[NodeState | None, str]:
        with self._lock:
            loaded, source = load_node_state_or_previous(path, self.model)
            if loaded is None:
                return None, source
            state, saved = loaded
            inner = {k: v for k, v in saved.items() if k.startswith(INNER_PREFIX)}
            ef = {k: v for k, v in saved.items() if not k.startswith(INNER_PREFIX)}
            buffers = self.error_feedback
            if buffers and set(ef) == set(buffers):
                for name, t in ef.items():
                    buffers[name].copy_(t)
            load_inner_tensors(self.inner_optimizer, self.work, inner)
            return state, source

    def load_model_file(self, path: Path) -> None:
        with self._lock:
            load_model_file(self.model, path)

    def write_model_file(self, path: Path) -> None:
        with self._lock:
            write_model_file(self.model, path)


@torch.no_grad()
def _copy_parameters(into: nn.Module, source: nn.Module) -> None:
    """`into`'s trainable parameters ← `source`'s (the same architecture)."""
    for (name, p), (other, q) in zip(into.named_parameters(), source.named_parameters(), strict=True):
        if name != other:
            raise ValueError(f"twin models differ: {name} against {other}")
        if p.requires_grad:
            p.copy_(q)
