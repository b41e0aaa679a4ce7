"""Per-GPU memory of a node at N ranks, computed on the meta device (nothing is allocated).

For a LLaMA shape, a micro-batch and a rank count, what one GPU holds during a window:

  θ shard         float32 rows of every parameter this rank holds (FSDP2: ceil(rows / N))
  grad shard      float32, the same rows
  error feedback  float32 full buffers of the parameters this rank owns (`assign_owners`)
  compress        transient: the full gradients of those parameters, gathered for `DeMo.step`
  unsharded       transient: the largest FSDP unit in bf16, twice (current + prefetched), plus its
                  bf16 gradient and float32 reduce-scatter input during backward
  activations     what autograd saves for backward at the micro-batch (bf16, no activation
                  checkpointing), measured by running one decoder layer and the output head on the
                  meta device under `saved_tensors_hooks`; attention is counted as a flash kernel
                  saves it (q, k, v, output, log-sum-exp), not as an s×s matrix

The peak is bounded by the sum; the transients do not overlap in time (compression runs after the
backward pass), so the real peak is lower. Host memory for checkpoints is separate (docs/mining.md).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from templar.core.config import HParams, load_hparams
from templar.distributed.demo import assign_owners

__all__ = ["SHAPES", "Sizing", "llama_shape", "markdown_table", "report", "size_node"]

GIB = float(1 << 30)

SHAPES: dict[str, dict[str, int | bool]] = {
    # the LLaMA-3 8B and 70B shapes; any other name is the hparams file's own model (1.2B by default)
    "8B": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, intermediate_size=14336, tie_word_embeddings=False),
    "70B": dict(vocab_size=128256, hidden_size=8192, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, intermediate_size=28672, tie_word_embeddings=False),
}


def llama_shape(name: str, hparams: str | None = None) -> LlamaConfig:
    """`LlamaConfig` of a named shape (8B, 70B); any other name is the hparams file's model."""
    m = load_hparams(hparams).model
    base = dict(vocab_size=m.vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_hidden_layers,
                num_attention_heads=m.num_attention_heads, num_key_value_heads=m.num_key_value_heads,
                intermediate_size=m.intermediate_size, tie_word_embeddings=m.tie_word_embeddings)
    base.update(SHAPES.get(name, {}))
    return LlamaConfig(**base, max_position_embeddings=8192, use_cache=False)


@dataclass(frozen=True)
class Sizing:
    shape: str
    ranks: int
    parameters: int
    theta: float          # GiB per GPU
    grads: float
    error_feedback: float
    compress: float
    unsharded: float
    activations: float
    checkpointed: float   # activations if each block were recomputed in backward (not built yet)

    @property
    def total(self) -> float:
        return self.theta + self.grads + self.error_feedback + self.compress + self.unsharded + self.activations


class _FlashLike(torch.autograd.Function):
    """What a flash-attention kernel saves for backward: q, k, v, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v):
        out = torch.empty_like(q)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad):  # never run: meta tensors
        q, k, v, _, _ = ctx.saved_tensors
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


def _flash_sdpa(query, key, value, *args, **kwargs):
    return _FlashLike.apply(query, key, value)


def _saved_bytes(fn, exclude: set[int]) -> int:
    """Bytes autograd saves while running `fn` (each tensor once; parameters excluded)."""
    seen: dict[int, torch.Tensor] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in exclude:
            seen.setdefault(id(t), t)
        return t

    sdpa = torch.nn.functional.scaled_dot_product_attention
    torch.nn.functional.scaled_dot_product_attention = _flash_sdpa
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
    finally:
        torch.nn.functional.scaled_dot_product_attention = sdpa
    return sum(t.numel() * t.element_size() for t in seen.values())


def _activations(model: nn.Module, config: LlamaConfig, batch: int, seq: int) -> tuple[int, int]:
    """Saved activations of one training micro-batch: (one block, the output head and loss)."""
    bf16 = model.to(torch.bfloat16)
    params = {id(p) for p in bf16.parameters()}
    hidden = torch.zeros(batch, seq, config.hidden_size, dtype=torch.bfloat16, device="meta", requires_grad=True)
    positions = torch.arange(seq, device="meta")[None].expand(batch, seq)
    rope = bf16.model.rotary_emb(hidden, positions)
    layer = _saved_bytes(lambda: bf16.model.layers[0](hidden, position_embeddings=rope, attention_mask=None,
                                                      position_ids=positions), params)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")

    def head() -> None:
        logits = bf16.lm_head(bf16.model.norm(hidden))
        torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                                          ids[:, 1:].reshape(-1))
    return layer, _saved_bytes(head, params)


def size_node(shape: str, ranks: Sequence[int], *, micro_batch: int, seq: int,
              hparams: str | None = None) -> list[Sizing]:
    """One `Sizing` per rank count for a named LLaMA shape (see module doc for the columns)."""
    config = llama_shape(shape, hparams)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    shapes = {n: p.shape for n, p in model.named_parameters()}
    total = sum(s.numel() for s in shapes.values())
    unit_sizes = [sum(p.numel() for p in block.parameters()) for block in model.model.layers]
    embed, head = model.get_input_embeddings().weight.numel(), model.get_output_embeddings().weight.numel()
    unit_sizes += [embed, head] if not config.tie_word_embeddings else [embed]
    largest = max(unit_sizes)
    layer, head_bytes = _activations(model, config, micro_batch, seq)
    layers = config.num_hidden_layers
    activations = layer * layers + head_bytes
    checkpointed = 2 * micro_batch * seq * config.hidden_size * layers + layer + head_bytes
    out = []
    for n in ranks:
        shard = sum(math.ceil(s[0] / n) * (s.numel() // s[0]) for s in shapes.values())
        owners = assign_owners(shapes, n)
        owned = [0] * n
        for name, s in shapes.items():
            owned[owners[name]] += s.numel()
        out.append(Sizing(shape=shape, ranks=n, parameters=total, theta=4 * shard / GIB, grads=4 * shard / GIB,
                          error_feedback=4 * max(owned) / GIB, compress=4 * max(owned) / GIB,
                          unsharded=(2 * 2 + 2 + 4) * largest / GIB, activations=activations / GIB,
                          checkpointed=checkpointed / GIB))
    return out


def markdown_table(rows: Sequence[Sizing], micro_batch: int, seq: int) -> str:
    lines = [f"Per-GPU memory in GiB (micro-batch {micro_batch} × {seq} tokens, bf16 compute, float32 θ):", "",
             "| model | params | GPUs | θ shard | grad shard | error feedback | compress (transient) | "
             "unsharded unit (transient) | activations | sum | activations if checkpointed |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.shape} | {r.parameters / 1e9:.2f} B | {r.ranks} | {r.theta:.2f} | {r.grads:.2f} | "
                     f"{r.error_feedback:.2f} | {r.compress:.2f} | {r.unsharded:.2f} | {r.activations:.2f} | "
                     f"**{r.total:.1f}** | {r.checkpointed:.2f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--shapes", nargs="+", default=["hparams", *SHAPES])
    parser.add_argument("--hparams", default=None)
    args = parser.parse_args(argv)
    hp = load_hparams(args.hparams)
    print(report(hp, args.ranks, args.shapes, args.hparams))


def report(hp: HParams, ranks: Sequence[int], shapes: Sequence[str], hparams: str | None) -> str:
    """The table for the hparams' own model (named after the run) and the named shapes."""
    mb, seq = hp.optimizer.micro_batch_size, hp.data.sequence_length
    rows = []
    for shape in shapes:
        for r in size_node(shape, ranks, micro_batch=mb, seq=seq, hparams=hparams):
            rows.append(r if shape in SHAPES else Sizing(**{**r.__dict__, "shape": hp.name}))
    return markdown_table(rows, mb, seq)


if __name__ == "__main__":
    main()
