"""Everything a node computes on its θ, behind one small interface the role loops and catch-up call.

A node is one process (`python neurons/miner.py`) or N ranks under torchrun. The loops never
touch θ directly: they call the node's `compute` (`templar.runtime.node.Node.compute`), built
with the node and held by it, as torchtitan's `Trainer` holds the components it built:

- `LocalCompute` for one process (what `start_node` builds): exactly the 1-process functions
  (`accumulate_gradients`, `DeMo.step`, `outer_step`, `apply_update`, `save_node_state`, ...),
  called on the node's model, nothing around them: no process group, no FSDP, no broadcast;
- `templar.distributed.compute.NodeCompute` under torchrun: the same ops over the node's ranks,
  θ sharded with FSDP2 (the launcher puts it in the node's `compute` before the role starts).

The consensus rules live once, below both: `runtime.outer.update_step` and `apply_update` (the
sharded node calls `apply_update` on each rank's rows), `compress.aggregate`, the state file's
`runtime.state.write_state_file` (atomic write with the `.prev` fallback) and the model file's
`runtime.model_file.check_model_file`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from templar.compress import Compressed, DeMo
from templar.compress.methods import rule_of
from templar.core.config import HParams
from templar.core.memory import MemorySettings
from templar.core.model import build_model, checkpoint_activations
from templar.runtime.fingerprint import model_fingerprint
from templar.runtime.model_file import load_model_file, write_model_file
from templar.runtime.offload import HostStore
from templar.runtime.outer import OuterStep, apply_update, collect_probes, outer_step
from templar.runtime.state import (
    INNER_PREFIX,
    NodeState,
    inner_tensors,
    load_inner_tensors,
    load_node_state_or_previous,
    save_node_state,
)
from templar.runtime.train import TrainStats, evaluate_loss, gradients, inner_steps, make_inner_optimizer
from templar.wire import Gradient

__all__ = ["Compute", "LocalCompute", "PeerScorer"]


class PeerScorer(Protocol):
    """The validator's primary evaluation (`templar.validator.evaluate.Evaluator.score_peers`):
    LossScores of every peer's signed update on its assigned pages and on random pages. Each
    node kind has one (the 1-process `Evaluator`, the sharded `NodeCompute`), and both must take
    the same arguments: `tests/distributed/test_compute.py` compares their signatures, because a
    missing argument on one of them only shows when a multi-rank validator first scores."""

    def score_peers(self, signs_by_peer: dict[str, dict[str, torch.Tensor]], assigned: dict[str, torch.Tensor],
                    random_batch: torch.Tensor, beta: float, page_sequences: int | None = None) -> dict[str, Any]: ...


class Compute(Protocol):
    """The node's θ and the ops on it (each op runs on all of the node's ranks together)."""

    world_size: int

    def enable_error_feedback(self) -> None:
        """A miner's: keep DeMo's error-feedback buffers (saved and restored with θ)."""

    def train(self, batch: torch.Tensor, micro_batch_size: int, grad_clip: float | None, lr: float) -> TrainStats:
        """The window's inner steps (`runtime.train.inner_steps` at inner rate `lr`): the
        pseudo-gradient is left for `compress`, θ_t stays the model."""

    def compress(self, scale: float) -> dict[str, Compressed]:
        """The DeMo step on the pending pseudo-gradient times `scale` (`TrainStats.scale`), which
        it clears: the node's payload."""

    def probes(self, window: int) -> dict[str, torch.Tensor]: ...

    def fingerprint(self, window: int) -> torch.Tensor:
        """`runtime.fingerprint.model_fingerprint` of θ for `window` (float32, CPU)."""

    def reset_model(self) -> None:
        """θ ← θ_0 of the run (a re-sync with no checkpoint published yet)."""

    def outer_step(self, gradients: Sequence[Gradient], state: NodeState, *,
                   keep_signs: bool = True) -> OuterStep | None:
        """`runtime.outer.outer_step`; `keep_signs=False` lets a sharded node drop the full signs."""

    def apply_update(self, signs: dict[str, torch.Tensor], step: int) -> float:
        """`runtime.outer.apply_update` of the lead's signs (catch-up)."""

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
    recomputed, never a result."""

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

    def enable_error_feedback(self) -> None:
        if self.demo is None:
            hp = self.hp
            compressor = rule_of(hp.optimizer.method).compressor(hp.demo.target_chunk, hp.demo.topk)
            self.demo = DeMo(self.model, compressor=compressor, decay=hp.demo.momentum_decay,
                             offload=self.memory.offload)
            self.inner_optimizer = make_inner_optimizer(self.model, hp.inner, offload=self.memory.offload)

    @property
    def error_feedback(self) -> dict[str, torch.Tensor]:
        return self.demo.buffers if self.demo is not None else {}

    def train(self, batch: torch.Tensor, micro_batch_size: int, grad_clip: float | None, lr: float) -> TrainStats:
        return inner_steps(self.model, batch, micro_batch_size, grad_clip, inner=self.hp.inner,
                           optimizer=self.inner_optimizer, lr=lr, snapshot=self.snapshot)

    def compress(self, scale: float) -> dict[str, Compressed]:
        if self.demo is None:
            raise RuntimeError("compress() needs enable_error_feedback() (a miner's op)")
        compressed = self.demo.step(gradients(self.model), scale)
        self.model.zero_grad(set_to_none=True)
        return compressed

    def probes(self, window: int) -> dict[str, torch.Tensor]:
        return collect_probes(self.model, window, self.hp)

    def fingerprint(self, window: int) -> torch.Tensor:
        return model_fingerprint(self.model, self.hp.data.data_seed, window, self.hp.sync.fingerprint_positions)

    def reset_model(self) -> None:
        self.model.load_state_dict(build_model(self.hp).state_dict())  # deterministic from init_seed

    def outer_step(self, gradients: Sequence[Gradient], state: NodeState, *,
                   keep_signs: bool = True) -> OuterStep | None:
        return outer_step(self.model, gradients, state, self.hp)

    def apply_update(self, signs: dict[str, torch.Tensor], step: int) -> float:
        return apply_update(self.model, signs, step, self.hp)

    def evaluate_loss(self, batch: torch.Tensor) -> float:
        return evaluate_loss(self.model, batch, self.hp.optimizer.micro_batch_size)

    def save_state(self, path: Path, state: NodeState) -> None:
        save_node_state(path, self.model, self.error_feedback, state, inner_tensors(self.inner_optimizer, self.model))

    def load_state(self, path: Path) -> tuple[NodeState | None, str]:
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
        load_inner_tensors(self.inner_optimizer, self.model, inner)
        return state, source

    def load_model_file(self, path: Path) -> None:
        load_model_file(self.model, path)

    def write_model_file(self, path: Path) -> None:
        write_model_file(self.model, path)
