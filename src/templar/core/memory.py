"""What a node holds in memory: its memory settings, and the bytes of each part on its GPU and host.

**Settings** (`MemorySettings`) belong to the node, like `--device`: flags of the miner, never
hparams, so they change neither the run's digest nor any payload or θ (bit for bit, tested in
tests/runtime/test_memory_settings.py and under torchrun in tests/distributed/). `offload` keeps the
θ_t snapshot, the error-feedback buffer and the inner AdamW moments in host memory (pinned where
CUDA is present) and streams them through the GPU around the step that needs them
(`templar.runtime.offload`); `checkpoint_activations` keeps only each decoder layer's input for the
backward pass and recomputes the layer (one more forward per micro-batch).

**Arithmetic** (`node_memory`), term by term, for a LLaMA of `ModelShape` trained on micro-batches
of T = b·s tokens under bf16 autocast (what `runtime.train` runs on CUDA). Every node keeps θ and,
while it trains, its gradients in float32 (4 bytes per parameter each); a miner adds the error
feedback, the θ_t snapshot of its inner steps and AdamW's two moments (`StateCopies`, one place for
the count of float32 model copies, read from the run's settings: the outer rule's own state
included). What autograd keeps of a micro-batch (`activation_bytes`, checked against the tensors
autograd really saves in tests/core/test_memory.py):

* per decoder layer, with r the residual stream's bytes (4: float32 θ under autocast, one process;
  2: bf16 parameters, FSDP's mixed precision under torchrun): each RMSNorm keeps its float32 input
  and its output ((4 + r)·T·d), each linear its bf16 input (under autocast every consumer casts
  its own copy: 3 for q/k/v and 2 for gate/up when r = 4), attention keeps q, k, v, its output and
  the log-sum-exp (a flash kernel: 2·T·d + 4·T·kv + 2·T·d + 4·T·heads), the MLP its gate and up
  outputs, the SiLU and the product (8·T·f);
* the output head: the final norm, the head's input, bf16 logits, their float32 copy and the
  log-softmax cross-entropy keeps (10·T·V at its peak; logits are not chunked);
* with one process, the bf16 weight copies autocast makes and autograd keeps for backward (2 bytes
  per linear weight), until the micro-batch's backward;
* with checkpointing, only each layer's input (r·T·d) is kept; one layer at a time is recomputed.

Under torchrun (FSDP2) each GPU also gathers the largest unit (a decoder layer, the embedding or the
head) in bf16, twice with prefetching, with its gradient in bf16 and float32 (10 bytes a parameter).
Transients that do not overlap training are counted by their maximum: the DeMo step on the largest
tensor (three float32 copies: its DCT coefficients, the selection scratch, the decoded update; with
offload its streamed buffer too; under torchrun the owner's gathered full gradients), and with
offload one parameter group's moments during its AdamW step. A validator holds θ, the copy of θ_t
it restores after each trial step, and one no-grad forward: the head's logits (10·T·V as above),
the MLP's gate, up and product in bf16 (6·T·f), two float32 hidden states (8·T·d) and, with one
process, autocast's bf16 weight copies and the evaluated peer's trial step, made on the GPU one at a time
(float32; an H200 measured 18.0 GB at 1.2B with the steps held on the host, against 15.1 GB here without
the step). An overlapped
run (`HParams.inner.overlap`) adds one float32 copy of θ on the GPU: a miner's working model, which its
inner steps train while θ takes the previous window's outer step, and a delayed run's validator's θ
one window older, the base it evaluates the window's updates against. Host memory
counts the state file's save (the tensors copied off the GPU) and load (the whole file is read), the
outer step's dense update (float32, on the host; a validator's trial step, one at a time, is the same
size at another moment), the window's gathered payloads as the node holds them decoded (a miner's peer
list, a validator's F_t and peer list: 79 at production, 17.8 GB at 1.2B), and `HOST_PROCESS_BYTES` for
the process itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["CHECKPOINT_FLAG", "DECODED_BYTES_PER_VALUE", "GIB", "HOST_PROCESS_BYTES", "OFFLOAD_FLAG", "SETTINGS", "Activations",
           "MemorySettings", "ModelShape", "NodeMemory", "StateCopies", "activation_bytes", "node_memory"]

GIB = float(1 << 30)
HOST_PROCESS_BYTES = 2e9
DECODED_BYTES_PER_VALUE = 12
"""A decoded payload's bytes per kept value: its int64 index and float32 value (`templar.wire.read_gradient`)."""
"""Host memory of the node's process beside its tensors (torch, the CUDA runtime, the page reader,
peers' payloads): an assumption, the one figure of this module that is not counted from the model."""

OFFLOAD_FLAG = "--memory.offload"
CHECKPOINT_FLAG = "--memory.checkpoint_activations"


@dataclass(frozen=True)
class MemorySettings:
    """A node's memory settings (see the module doc); the default holds everything on the GPU."""

    offload: bool = False
    checkpoint_activations: bool = False

    @property
    def name(self) -> str:
        parts = [name for name, on in (("offload", self.offload), ("checkpointing", self.checkpoint_activations)) if on]
        return " + ".join(parts) or "default"

    @property
    def flags(self) -> tuple[str, ...]:
        """The miner's flags that select this setting (none for the default)."""
        return tuple(flag for flag, on in ((OFFLOAD_FLAG, self.offload), (CHECKPOINT_FLAG, self.checkpoint_activations))
                     if on)


SETTINGS = (MemorySettings(), MemorySettings(offload=True), MemorySettings(offload=True, checkpoint_activations=True))
"""The settings the sizing table lists, cheapest in time first: a node takes the first that fits."""


@dataclass(frozen=True)
class ModelShape:
    """The LLaMA dimensions memory depends on (hparams' `model`, or a named shape's config)."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool

    @classmethod
    def of(cls, m: Any) -> ModelShape:
        """From hparams' `model` or a `transformers.LlamaConfig` (the same attribute names)."""
        return cls(vocab=m.vocab_size, hidden=m.hidden_size, layers=m.num_hidden_layers, heads=m.num_attention_heads,
                   kv_heads=m.num_key_value_heads, intermediate=m.intermediate_size, tied=bool(m.tie_word_embeddings))

    @property
    def kv_dim(self) -> int:
        return self.hidden * self.kv_heads // self.heads

    @property
    def layer_linear(self) -> int:
        """Weights of one decoder layer's linears (q, k, v, o, gate, up, down)."""
        d, kv, f = self.hidden, self.kv_dim, self.intermediate
        return 2 * d * d + 2 * d * kv + 3 * d * f

    @property
    def layer_parameters(self) -> int:
        return self.layer_linear + 2 * self.hidden  # and its two RMSNorm weights

    @property
    def embedding(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        return self.embedding * (1 if self.tied else 2) + self.layers * self.layer_parameters + self.hidden

    def parameter_shapes(self) -> dict[str, tuple[int, ...]]:
        """The names and shapes of `transformers.LlamaForCausalLM`'s trainable tensors, in its order
        (`core.model.parameter_shapes` of the built model; `tests/core/test_memory.py` compares them for
        every preset): the schema a payload's size cap reads, without importing transformers, which
        costs `templar doctor` and `templar hparams` about 3 s of CPU. No biases (LLaMA has none); a tied
        head is the embedding."""
        d, kv, f = self.hidden, self.kv_dim, self.intermediate
        shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab, d)}
        for i in range(self.layers):
            layer = f"model.layers.{i}."
            shapes |= {f"{layer}self_attn.{name}.weight": shape
                       for name, shape in (("q_proj", (d, d)), ("k_proj", (kv, d)), ("v_proj", (kv, d)), ("o_proj", (d, d)))}
            shapes |= {f"{layer}mlp.{name}.weight": shape
                       for name, shape in (("gate_proj", (f, d)), ("up_proj", (f, d)), ("down_proj", (d, f)))}
            shapes |= {f"{layer}{name}.weight": (d,) for name in ("input_layernorm", "post_attention_layernorm")}
        shapes["model.norm.weight"] = (d,)
        if not self.tied:
            shapes["lm_head.weight"] = (self.vocab, d)
        return shapes

    @property
    def largest_tensor(self) -> int:
        return max(self.embedding, self.hidden * self.intermediate)

    @property
    def largest_group(self) -> int:
        """The largest parameter group the offload streams at once (`runtime.offload.parameter_groups`:
        a decoder layer, or the embedding or the head alone); FSDP2's units are the same groups."""
        return max(self.layer_parameters, self.embedding)


@dataclass(frozen=True)
class Activations:
    """Bytes autograd keeps for one micro-batch's backward (see the module doc)."""

    layer: int          # what one decoder layer keeps
    kept: int           # kept through the forward: every layer's, or with checkpointing each layer's input
    head: int           # the output head at its peak
    weight_casts: int   # bf16 weight copies autocast keeps (one process; 0 under FSDP's bf16 parameters)
    layer_casts: int    # one layer's share of them (recomputed with it under checkpointing)
    checkpointed: bool

    @property
    def peak(self) -> int:
        """The most held at once: the end of the forward (everything kept, the head, the casts), or,
        with checkpointing, the larger of that and one layer recomputed in the backward."""
        forward_end = self.kept + self.head + self.weight_casts
        if not self.checkpointed:
            return forward_end
        return max(forward_end, self.kept + self.layer + self.layer_casts)


def activation_bytes(shape: ModelShape, micro_batch: int, seq: int, *, residual_bytes: int,
                     checkpointed: bool) -> Activations:
    """What a micro-batch of `micro_batch` × `seq` tokens keeps (module doc: r = `residual_bytes`)."""
    t, d, kv, f, v, r = micro_batch * seq, shape.hidden, shape.kv_dim, shape.intermediate, shape.vocab, residual_bytes
    norm = (4 + r) * t * d

    def linear_inputs(consumers: int) -> int:
        return (consumers if r == 4 else 1) * 2 * t * d

    attention = norm + linear_inputs(3) + 2 * t * d + 4 * t * kv + 2 * t * d + 4 * t * shape.heads
    mlp = norm + linear_inputs(2) + 8 * t * f
    layer = attention + mlp
    head = norm + linear_inputs(1) + 10 * t * v
    casts = 2 * (shape.layers * shape.layer_linear + shape.embedding) if r == 4 else 0
    layer_casts = 2 * shape.layer_linear if r == 4 else 0
    kept = shape.layers * (r * t * d if checkpointed else layer)
    if checkpointed:  # the layers' casts are recomputed with them; the head's stays until its backward
        casts = 2 * shape.embedding if r == 4 else 0
    return Activations(layer=layer, kept=kept, head=head, weight_casts=casts, layer_casts=layer_casts,
                       checkpointed=checkpointed)


@dataclass(frozen=True)
class StateCopies:
    """float32 tensors the size of θ a node keeps besides θ and its gradients, by what keeps them:
    the one place that counts them (`tools.sizing` fills it from the run's settings)."""

    error_feedback: int = 0
    snapshot: int = 0       # θ_t, kept through a window's inner steps
    moments: int = 0        # the inner optimizer's
    outer: int = 0          # the outer rule's own state (`OuterRule.state_copies`), on every node
    working: int = 0        # an overlapped miner's working model: the inner steps train it while θ takes outer steps
    base: int = 0           # a delayed run's validator: θ one window older, the base its updates are evaluated against

    @classmethod
    def of(cls, role: str, *, inner_optimizer: str, inner_steps: int, outer: int,
           overlap: str = "blocking") -> StateCopies:
        if role != "miner":
            return cls(outer=outer, base=1 if overlap == "delayed" else 0)
        return cls(error_feedback=1, snapshot=1 if inner_optimizer != "sgd" or inner_steps > 1 else 0,
                   moments=2 if inner_optimizer == "adamw" else 0, outer=outer,
                   working=0 if overlap == "blocking" else 1)

    @property
    def offloadable(self) -> int:
        """What `MemorySettings.offload` moves to host memory."""
        return self.error_feedback + self.snapshot + self.moments

    @property
    def saved(self) -> int:
        """Copies in the state file besides θ (the snapshot is not saved: it is θ between windows)."""
        return self.error_feedback + self.moments + self.outer


@dataclass(frozen=True)
class NodeMemory:
    """One node's memory under one setting: bytes per GPU and on the host, by part."""

    role: str
    setting: MemorySettings
    ranks: int
    gpu: dict[str, float] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    transfer_bytes: float = 0.0
    """Host↔GPU bytes per window per GPU that the offload adds."""
    recompute_share: float = 0.0
    """Training FLOPs added by checkpointing (one more forward: a third of forward + backward)."""

    @property
    def gpu_bytes(self) -> float:
        return sum(self.gpu.values())

    @property
    def host_bytes(self) -> float:
        return sum(self.host.values())


def node_memory(shape: ModelShape, copies: StateCopies, *, role: str, setting: MemorySettings, ranks: int,
                micro_batch: int, seq: int, inner_steps: int, gathered: int = 0, kept_share: float = 0.0,
                ) -> NodeMemory:
    """GPU bytes per GPU and host bytes per node (all its ranks on one machine) for `role` under
    `setting` over `ranks` GPUs (1: one process, θ float32 under autocast; more: torchrun, FSDP2 with
    bf16 compute parameters). The GPU total is an estimated peak: persistent parts plus the largest
    transient; see the module doc for each term. `gathered`: payloads the node reads a window (a miner
    the peer list, a validator F_t too), each decoded to `kept_share` of the parameters at `DECODED_BYTES_PER_VALUE`."""
    n, per = shape.parameters, 1.0 / ranks
    offload = setting.offload and role == "miner"
    fsdp = ranks > 1
    owned = max(n * per, shape.largest_tensor) if fsdp else n  # error feedback: whole tensors per owner rank
    gpu: dict[str, float] = {"θ": 4 * n * per}
    host: dict[str, float] = {}
    if copies.outer:
        gpu["outer rule state"] = 4 * copies.outer * n * per
    if copies.working:
        gpu["working model (overlap)"] = 4 * copies.working * n * per
    if copies.base:
        gpu["θ base (delayed)"] = 4 * copies.base * n * per
    # per GPU (error feedback: its owner's whole tensors), or in the node's host memory (all ranks)
    offloadable = {"error feedback": (copies.error_feedback, owned), "θ_t snapshot": (copies.snapshot, n * per),
                   "AdamW moments": (copies.moments, n * per)}
    for name, (count, per_gpu) in offloadable.items():
        if count:
            if offload:
                host[name] = 4 * count * n
            else:
                gpu[name] = 4 * count * per_gpu
    if role == "miner":
        gpu["gradients"] = 4 * n * per
        acts = activation_bytes(shape, micro_batch, seq, residual_bytes=2 if fsdp else 4,
                                checkpointed=setting.checkpoint_activations)
        training = acts.peak + (10 * shape.largest_group if fsdp else 0)  # FSDP: the gathered unit
        compress = 12 * shape.largest_tensor + (4 * owned if fsdp else 0) + (4 * shape.largest_tensor if offload else 0)
        stream = 4 * copies.moments * shape.largest_group * per if offload else 0
        gpu["activations and transients (peak)"] = max(training, compress, stream)
    else:  # LossScore: θ_t kept for the exact rollback, one no-grad forward at a time
        gpu["θ_t copy (rollback)"] = 4 * n * per
        t = micro_batch * seq
        gpu["evaluation forward (peak)"] = 10 * t * shape.vocab + 6 * t * shape.intermediate + 8 * t * shape.hidden
        if not fsdp:  # autocast's bf16 copy of every linear weight, cached for the forward
            gpu["bf16 weight copies (autocast)"] = 2 * (shape.layers * shape.layer_linear + shape.embedding)
            gpu["trial step (one at a time)"] = 4 * n  # made on the GPU (torchrun's rank 0 makes it on the host)
    # host, beside what the offload keeps there: the state file's save (the tensors copied off the
    # GPU; torchrun's rank 0 streams them one at a time), its load at start (the file read whole,
    # beside the error-feedback buffers, the only offloaded tensors that exist before the first
    # step), and the outer step's dense update (float32 on the host)
    resident = sum(host.values())
    state_file = 4 * n * (1 + copies.saved)
    if fsdp:
        save = load = 2 * 4 * shape.largest_tensor
    else:
        save = 4 * n * (1 + copies.outer) + (0 if offload else 4 * n * (copies.error_feedback + copies.moments))
        load = state_file - (resident - host.get("error feedback", 0.0))
    host["state file, outer update (transient)"] = max(save, load, 4 * n)  # a validator's trial step too (4n)
    if gathered:
        host["gathered payloads, decoded"] = gathered * DECODED_BYTES_PER_VALUE * kept_share * shape.parameters
    host["the process (assumed)"] = HOST_PROCESS_BYTES
    transfer = 0.0
    if offload:  # per inner step the moments in and out; per window θ_t out and in, the error feedback in and out
        transfer = (inner_steps * 2 * 4 * copies.moments + 2 * 4 * copies.snapshot) * n * per \
            + 2 * 4 * copies.error_feedback * owned
    return NodeMemory(role=role, setting=setting, ranks=ranks, gpu=gpu, host=host, transfer_bytes=transfer,
                      recompute_share=1 / 3 if setting.checkpoint_activations and role == "miner" else 0.0)
