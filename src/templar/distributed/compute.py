"""Every computation on a node's θ, run by all its ranks together: rank 0 drives, the others follow.

Rank 0 runs the ordinary miner/validator loop (chain, buckets, clock), which calls the ops of
`templar.runtime.compute.Compute` on the node's `compute`: this class under torchrun (put there
by `templar.distributed.launch`), `LocalCompute` (the plain 1-process functions) otherwise. Each call
first broadcasts `(op, small arguments)`; the other ranks sit in `follow()` and run the same
method with the same arguments, so the collectives inside pair up. Large data that only rank 0
has (peers' payloads, the lead's signs, files) is passed by rank 0 alone and distributed inside
the method (broadcast, scatter of rows). With one process the broadcasts are trivial and the
code is the same.

A `keepalive` task pings the followers while rank 0 waits on the network (a window's sleep, a
checkpoint download), so a follower's wait stays under the collective timeout while a dead or
stuck leader is still detected within it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from loguru import logger
from safetensors import safe_open
from torch import nn

from templar.comms import CheckpointError
from templar.compress import Compressed
from templar.compress.methods import rule_of
from templar.core.atomic import atomic_write
from templar.core.config import HParams, overlapped
from templar.core.memory import MemorySettings
from templar.core.model import build_model
from templar.core.schedule import learning_rate
from templar.distributed.checkpoint import gather_model, load_sharded_state, save_sharded_state, write_stream
from templar.distributed.demo import ShardedDeMo
from templar.distributed.evaluate import ShardedEvaluator, sequence_losses_sharded
from templar.distributed.fsdp import local, local_rows, reshard, shard_model
from templar.distributed.group import DistError, Group, scatter_rows
from templar.distributed.outer import collect_probes_sharded, fingerprint_sharded, outer_step_sharded
from templar.distributed.train import accumulate_sharded
from templar.runtime.consensus.outer import OuterStep, apply_update
from templar.runtime.model_file import check_model_file
from templar.runtime.offload import HostStore
from templar.runtime.state import NodeState, load_node_state_or_previous
from templar.runtime.train import InnerWindow, TrainStats, make_inner_optimizer, window_parts
from templar.validator.evaluate import evaluator_rules
from templar.wire import Gradient

__all__ = ["NodeCompute"]

_STOP = "stop"
_EXPECTED = (ValueError, CheckpointError)  # raised on every rank alike; the leader decides


def update_dtype(hp: HParams) -> torch.dtype:
    """The dtype in which rank 0 scatters a dense update or trial step to the ranks' rows: a sign
    fits in int8 (a quarter of the bytes); another rule's update carries magnitudes (float32)."""
    return torch.int8 if hp.optimizer.method == "signed" else torch.float32


class NodeCompute:
    """`templar.runtime.compute.Compute` over the node's ranks (θ sharded with FSDP2). `memory`: the
    node's memory settings, applied by every rank to its own shards (`templar.core.memory`)."""

    def __init__(self, model: nn.Module, hp: HParams, group: Group, *, role: str,
                 memory: MemorySettings | None = None) -> None:
        self.memory = memory or MemorySettings()
        miner = role == "miner"
        self.model = shard_model(model, group, checkpoint_activations=miner and self.memory.checkpoint_activations)
        self.hp = hp
        self.group = group
        self.role = role
        offload = miner and self.memory.offload
        self.work = self._twin() if miner and overlapped(hp.inner) else self.model
        """The model the inner steps train: θ itself (blocking), or a working copy sharded as θ is
        (overlapped: `HParams.inner.overlap`), so θ can take outer steps between two inner steps."""
        compressor = rule_of(hp.optimizer.method).compressor(hp.demo.target_chunk, hp.demo.topk)
        self.demo = ShardedDeMo(self.work, group, compressor=compressor, decay=hp.demo.momentum_decay,
                                offload=offload) if miner else None
        self.inner_optimizer = make_inner_optimizer(self.work, hp.inner, offload=offload) if miner else None
        self.snapshot = HostStore() if offload else None
        self.window: InnerWindow | None = None
        self.sharded_evaluator = ShardedEvaluator(self.model, hp.optimizer.micro_batch_size, group,
                                                  step_dtype=update_dtype(hp), **evaluator_rules(hp))
        self.base_model: nn.Module | None = None
        """A delayed run's validator: θ before its latest outer step, sharded as θ (`keep_base`)."""
        self._base_scorer: ShardedEvaluator | None = None
        self._lock = threading.Lock()  # one op at a time, in the order the followers see them
        self._stopped = False

    def _twin(self) -> nn.Module:
        """A second model of the run's architecture, sharded as θ is, holding θ's values (every rank
        builds θ_0 and keeps its rows, as for θ)."""
        miner = self.role == "miner"
        twin = shard_model(build_model(self.hp), self.group,
                           checkpoint_activations=miner and self.memory.checkpoint_activations)
        _copy_local(twin, self.model)
        return twin

    @property
    def world_size(self) -> int:
        return self.group.world_size

    @property
    def evaluator(self) -> NodeCompute:
        """`score_peers` over all ranks (the validator's `Evaluator` on the sharded model)."""
        return self

    def enable_error_feedback(self) -> None:
        if self.demo is None:
            raise ValueError("this node's ranks were started as a validator: no error feedback")

    # ------------------------------------------------------------------ start and follow
    @classmethod
    def lead(cls, model: nn.Module, hp: HParams, group: Group, *, role: str,
             memory: MemorySettings | None = None) -> NodeCompute:
        """Rank 0: tell the followers what to build (the run's hparams, the role and the node's
        memory settings), then shard."""
        memory = memory or MemorySettings()
        group.broadcast_object((hp, role, memory))
        return cls(model, hp, group, role=role, memory=memory)

    @classmethod
    def join(cls, group: Group) -> NodeCompute:
        """Ranks > 0: build the same θ_0 from rank 0's hparams and shard it as rank 0 does."""
        hp, role, memory = group.broadcast_object(None)
        return cls(build_model(hp), hp, group, role=role, memory=memory)

    def follow(self) -> None:
        """Ranks > 0: run rank 0's ops until it stops (or a collective fails: DistError)."""
        log = logger.bind(phase="follow")
        log.info(f"rank {self.group.rank} following rank 0 ({self.role})")
        while True:
            message = self.group.broadcast_object(None)
            if message == _STOP:
                break
            op, kwargs = message
            try:
                self._run(op, kwargs)
            except _EXPECTED as exc:  # rank 0 got the same error and handles it
                log.debug(f"{op}: {exc}")
        log.info(f"rank {self.group.rank} stopped")

    def _call(self, op: str, leader_only: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """On rank 0: broadcast (op, kwargs), then run it with `leader_only` arguments added."""
        with self._lock:
            if self._stopped:
                if op == "ping":  # a keepalive that lost the race with stop(): nobody is listening
                    return None
                raise RuntimeError(f"{op}: the node's compute is stopped")
            self.group.broadcast_object((op, kwargs))
            return self._run(op, {**kwargs, **(leader_only or {})})

    def _run(self, op: str, kwargs: dict[str, Any]) -> Any:
        """Run `op` on this rank. A RuntimeError out of it is a node that failed: a collective inside it
        failed (FSDP's gathers and reductions, the gradient clip's norm: not `Group`'s own, which say so
        already) or this rank failed alone (out of memory, a device error), and its ranks are out of step.
        It becomes the `DistError` the entry point exits with (`EXIT_RANK_LOST`, one line): a rank lost
        while training, the likeliest moment, ended the node with exit 1 and a traceback instead."""
        try:
            return getattr(self, "_" + op)(**kwargs)
        except RuntimeError as exc:
            if isinstance(exc, DistError):
                raise
            logger.opt(exception=exc).debug(f"{op} failed on rank {self.group.rank}")
            raise DistError(f"rank {self.group.rank}: {op} failed (a rank died or timed out): {exc}") from exc
        finally:
            for model in {id(m): m for m in (self.model, self.work, self.base_model) if m is not None}.values():
                reshard(model)  # between ops, parameters are always the shards

    def stop(self) -> DistError | None:
        """Rank 0: release the followers (they exit `follow`). Never raises: a follower already
        gone leaves nobody to release, and the `DistError` that says so is returned for the caller
        to judge (news after a clean stop, an echo while the node already fails with one)."""
        with self._lock:
            if self._stopped:
                return None
            self._stopped = True
            try:
                self.group.broadcast_object(_STOP)
            except DistError as exc:
                return exc
            return None

    async def keepalive(self, every: float | None = None) -> None:
        """Rank 0, as a task: ping the followers while the loop waits (see module doc)."""
        every = every or max(5.0, self.group.timeout_s / 4)
        if self.group.world_size == 1:
            return
        while True:
            await asyncio.sleep(every)
            await asyncio.to_thread(self._call, "ping")

    def _ping(self) -> None:
        return None

    # ------------------------------------------------------------------ training (miners)
    def train(self, batch: torch.Tensor, micro_batch_size: int, grad_clip: float | None, lr: float) -> TrainStats:
        return self._call("train", batch=batch, micro_batch_size=micro_batch_size, grad_clip=grad_clip, lr=lr)

    def _train(self, batch: torch.Tensor, micro_batch_size: int, grad_clip: float | None, lr: float) -> TrainStats:
        """The window's inner steps (`runtime.train.inner_steps`), each over all ranks' shares of
        its part of the pages; the inner optimizer steps each rank's shards (AdamW is element-wise)."""
        self._begin_window(lr, micro_batch_size, grad_clip)
        for part in window_parts(batch, self.hp.inner):
            self._inner_step(part)
        return self._end_window()

    def begin_window(self, lr: float, micro_batch_size: int, grad_clip: float | None, *,
                     proxy: dict[str, torch.Tensor] | None = None, proxy_step: int = 0) -> None:
        """`Compute.begin_window` over the ranks; `proxy` (rank 0's dense update) reaches each rank as
        its rows, as a catch-up update does (`apply_update`)."""
        self._call("begin_window", {"proxy": proxy}, lr=lr, micro_batch_size=micro_batch_size,
                   grad_clip=grad_clip, proxy_step=proxy_step, has_proxy=proxy is not None)

    @torch.no_grad()
    def _begin_window(self, lr: float, micro_batch_size: int, grad_clip: float | None, proxy_step: int = 0,
                      has_proxy: bool = False, proxy: dict[str, torch.Tensor] | None = None) -> None:
        if self.work is not self.model:
            _copy_local(self.work, self.model)
            if has_proxy:
                self._apply_rows(self.work, proxy_step, proxy)
        elif has_proxy:
            raise ValueError("a proxy step needs the working model of an overlapped run")
        work = self.work
        self.window = InnerWindow(work, micro_batch_size, grad_clip, inner=self.hp.inner,
                                  optimizer=self.inner_optimizer, lr=lr, snapshot=self.snapshot,
                                  accumulate=lambda part: accumulate_sharded(work, part, micro_batch_size, self.group,
                                                                             grad_clip))
        self.window.begin()

    def inner_step(self, part: torch.Tensor) -> None:
        self._call("inner_step", part=part)

    def _inner_step(self, part: torch.Tensor) -> None:
        self._current().step(part)

    def land(self) -> None:
        self._call("land")

    def _land(self) -> None:
        if self.work is self.model:
            raise ValueError("land() needs the working model of an overlapped run")
        self._current().land([p.detach() for p in self.model.parameters() if p.requires_grad])

    def end_window(self) -> TrainStats:
        return self._call("end_window")

    def _end_window(self) -> TrainStats:
        stats = self._current().end()
        self.window = None
        return stats

    def _current(self) -> InnerWindow:
        if self.window is None:
            raise RuntimeError("no window's inner steps begun (begin_window)")
        return self.window

    def compress(self, scale: float) -> dict[str, Compressed]:
        """The node's DeMo step on the pending pseudo-gradient times `scale` (error feedback split
        across ranks); clears the gradients."""
        return self._call("compress", scale=scale)

    def _compress(self, scale: float) -> dict[str, Compressed]:
        assert self.demo is not None, "compress() is a miner's op"
        try:
            return self.demo.step(self.work, scale)
        finally:
            self.work.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ θ
    def probes(self, window: int) -> dict[str, torch.Tensor]:
        return self._call("probes", window=window)

    def _probes(self, window: int) -> dict[str, torch.Tensor]:
        return collect_probes_sharded(self.model, window, self.hp, self.group)

    def fingerprint(self, window: int) -> torch.Tensor:
        return self._call("fingerprint", window=window)

    def _fingerprint(self, window: int) -> torch.Tensor:
        return fingerprint_sharded(self.model, self.hp.data.data_seed, window, self.group,
                                   self.hp.sync.fingerprint_positions)

    def reset_model(self) -> None:
        """θ ← θ_0: every rank builds it (deterministic from init_seed) and keeps its rows."""
        self._call("reset_model")

    @torch.no_grad()
    def _reset_model(self) -> None:
        fresh = build_model(self.hp).state_dict()
        for key, value in self.model.state_dict().items():
            mine = local(value)
            if value.dim() and mine is not value:
                start, end = local_rows(value.shape, self.group)
                mine.copy_(fresh[key][start:end].to(mine.device))
            else:
                mine.copy_(fresh[key].to(mine.device))

    def outer_step(self, gradients: Sequence[Gradient], state: NodeState, *,
                   keep_signs: bool = True, clip_norm: float | None = None) -> OuterStep | None:
        """`templar.runtime.consensus.outer.outer_step`; `state` is updated on rank 0 (the followers keep none)."""
        return self._call("outer_step", {"gradients": gradients, "state": state}, keep_signs=keep_signs,
                          clip_norm=clip_norm)

    def _outer_step(self, keep_signs: bool, gradients: list[Gradient] | None = None,
                    state: NodeState | None = None, clip_norm: float | None = None) -> OuterStep | None:
        state = state if state is not None else NodeState(window=-1, global_step=0)
        steps = self.group.broadcast_object(state.global_step if self.group.is_leader else None)
        state.global_step = steps
        return outer_step_sharded(self.model, gradients, state, self.hp, self.group,
                                  keep_signs=keep_signs and self.group.is_leader, clip_norm=clip_norm)

    def apply_update(self, signs: dict[str, torch.Tensor], step: int) -> float:
        """`templar.runtime.consensus.outer.apply_update` of rank 0's dense signs (the lead's aggregate, in
        catch-up): each rank receives its rows of each sign and applies the one rule to them."""
        return self._call("apply_update", {"signs": signs}, step=step)

    @torch.no_grad()
    def _apply_update(self, step: int, signs: dict[str, torch.Tensor] | None = None) -> float:
        return self._apply_rows(self.model, step, signs)

    @torch.no_grad()
    def _apply_rows(self, model: nn.Module, step: int, signs: dict[str, torch.Tensor] | None) -> float:
        """`apply_update` of rank 0's dense `signs` to `model` (θ, or the working model's proxy):
        each rank receives its rows of each tensor and applies the one rule to them."""
        names = None
        if self.group.is_leader:
            assert signs is not None
            params = dict(model.named_parameters())
            for name, s in signs.items():  # the checks of apply_signed_update, before any change
                if name not in params or tuple(s.shape) != tuple(params[name].shape):
                    names = ValueError(f"sign for unknown parameter or of another shape: {name}")
                    break
            names = names or [n for n in params if n in signs]
        names = self.group.broadcast_object(names)
        if isinstance(names, Exception):
            raise names
        params = dict(model.named_parameters())
        lr = learning_rate(step, self.hp.optimizer)
        dtype = update_dtype(self.hp)
        for name in names:
            p = params[name]
            full = signs[name].to(dtype) if signs is not None else None
            rows = scatter_rows(self.group, full, p.shape, dtype, src=0)
            start, end = local_rows(p.shape, self.group)
            lr = apply_update({name: local(p)}, {name: rows[: end - start]}, step, self.hp)
        return lr

    def keep_base(self) -> None:
        """`Compute.keep_base`: θ's rows into the base model's (every rank its own)."""
        self._call("keep_base")

    def _keep_base(self) -> None:
        if self.base_model is None:
            self.base_model = self._twin()
            self._base_scorer = ShardedEvaluator(self.base_model, self.hp.optimizer.micro_batch_size, self.group,
                                                 step_dtype=update_dtype(self.hp), **evaluator_rules(self.hp))
        else:
            _copy_local(self.base_model, self.model)

    def base_probes(self, window: int) -> dict[str, torch.Tensor]:
        return self._call("base_probes", window=window)

    def _base_probes(self, window: int) -> dict[str, torch.Tensor]:
        if self.base_model is None:
            raise RuntimeError("no base model kept (keep_base)")
        return collect_probes_sharded(self.base_model, window, self.hp, self.group)

    @property
    def base_evaluator(self) -> _BaseScorer:
        """`score_peers` over all ranks against the base model (`keep_base`)."""
        return _BaseScorer(self)

    # ------------------------------------------------------------------ evaluation (validators)
    def evaluate_loss(self, batch: torch.Tensor) -> float:
        return self._call("evaluate_loss", batch=batch)

    def _evaluate_loss(self, batch: torch.Tensor) -> float:
        return float(sequence_losses_sharded(self.model, batch, self.hp.optimizer.micro_batch_size,
                                             self.group).mean())

    def score_peers(self, signs_by_peer: Mapping[str, dict[str, torch.Tensor]], assigned: dict[str, torch.Tensor],
                    random_batch: torch.Tensor, beta: float, page_sequences: int | None = None) -> dict:
        """`Evaluator.score_peers` over all ranks (signs stay on rank 0; batches are broadcast),
        with the same page-by-page δs (`page_sequences`) as the 1-process validator's."""
        return self._call("score_peers", {"signs_by_peer": signs_by_peer}, peers=sorted(signs_by_peer),
                          assigned=assigned, random_batch=random_batch, beta=beta, page_sequences=page_sequences)

    def _score_peers(self, peers: list[str], assigned: dict[str, torch.Tensor], random_batch: torch.Tensor,
                     beta: float, page_sequences: int | None = None,
                     signs_by_peer: Mapping[str, dict[str, torch.Tensor]] | None = None, base: bool = False) -> dict:
        signs = signs_by_peer if signs_by_peer is not None else {p: {} for p in peers}
        evaluator = self._base_scorer if base else self.sharded_evaluator
        if evaluator is None:
            raise RuntimeError("no base model kept (keep_base)")
        return evaluator.score_peers(signs, assigned, random_batch, beta, page_sequences)

    # ------------------------------------------------------------------ files
    def save_state(self, path: Path, state: NodeState) -> None:
        """The node's own state file (θ and, for miners, the error feedback), written by rank 0
        through `runtime.state.write_state_file` (atomic, `.prev` kept)."""
        self._call("save_state", {"state": state}, path=str(path))

    def _save_state(self, path: str, state: NodeState | None = None) -> None:
        save_sharded_state(Path(path), self.model, self.demo, state or NodeState(-1, 0), self.group,
                           inner=self.inner_optimizer, inner_model=self.work)

    def load_state(self, path: Path) -> tuple[NodeState | None, str]:
        """`templar.runtime.state.load_node_state_or_previous`, sharded: every rank runs the same
        fallback (the collective loader raises the same ValueError everywhere); the error feedback
        goes straight into the owners' buffers."""
        return self._call("load_state", path=str(path))

    def _load_state(self, path: str) -> tuple[NodeState | None, str]:
        def load(file: Path) -> tuple[NodeState, dict[str, torch.Tensor]] | None:
            state = load_sharded_state(file, self.model, self.demo, self.group, inner=self.inner_optimizer,
                                       inner_model=self.work)
            return None if state is None else (state, {})

        loaded, source = load_node_state_or_previous(Path(path), self.model, load=load)
        return (None if loaded is None else loaded[0]), source

    def load_model_file(self, path: Path) -> None:
        """`templar.runtime.model_file.load_model_file` (a published checkpoint): CheckpointError on every rank
        when rank 0's checks fail, before anything changes."""
        self._call("load_model_file", path=str(path))

    @torch.no_grad()
    def _load_model_file(self, path: str) -> None:
        expected = self.model.state_dict()
        verdict = None
        if self.group.is_leader:
            verdict = check_model_file(Path(path), expected)
        verdict = self.group.broadcast_object(verdict)
        if verdict:
            raise CheckpointError(verdict)
        handle = safe_open(path, framework="pt") if self.group.is_leader else None
        for key, value in expected.items():
            full = handle.get_tensor(key) if handle is not None else None
            mine = local(value)
            if value.dim() and mine is not value:
                rows = scatter_rows(self.group, full, value.shape, value.dtype, src=0)
                start, end = local_rows(value.shape, self.group)
                mine.copy_(rows[: end - start].to(mine.device))
            else:
                mine.copy_(self.group.broadcast_object(full).to(mine.device))

    def write_model_file(self, path: Path) -> None:
        """θ as one plain safetensors file (the published checkpoint any node can load), by rank 0."""
        self._call("write_model_file", path=str(path))

    def _write_model_file(self, path: str) -> None:
        entries = [(k, v.dtype, tuple(v.shape)) for k, v in self.model.state_dict().items()]
        tensors = (full for _, full in gather_model(self.model, self.group, 0))
        try:
            if self.group.is_leader:
                atomic_write(Path(path), lambda tmp: write_stream(tmp, entries, {}, tensors))
        finally:
            for _ in tensors:  # take part in every gather (rank 0 too, if its write failed early)
                pass


class _BaseScorer:
    """`PeerScorer` against the node's base model (`NodeCompute.keep_base`), over all ranks."""

    def __init__(self, compute: NodeCompute) -> None:
        self.compute = compute

    def score_peers(self, signs_by_peer: Mapping[str, dict[str, torch.Tensor]], assigned: dict[str, torch.Tensor],
                    random_batch: torch.Tensor, beta: float, page_sequences: int | None = None) -> dict:
        return self.compute._call("score_peers", {"signs_by_peer": signs_by_peer}, peers=sorted(signs_by_peer),
                                  assigned=assigned, random_batch=random_batch, beta=beta,
                                  page_sequences=page_sequences, base=True)


@torch.no_grad()
def _copy_local(into: nn.Module, source: nn.Module) -> None:
    """Every rank: `into`'s rows of each trainable parameter ← `source`'s (sharded alike)."""
    for (name, p), (other, q) in zip(into.named_parameters(), source.named_parameters(), strict=True):
        if name != other:
            raise ValueError(f"twin models differ: {name} against {other}")
        if p.requires_grad:
            local(p).copy_(local(q))
