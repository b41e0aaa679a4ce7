"""The shared model: `transformers.LlamaForCausalLM` built from hparams, never from the hub.

Every node builds identical initial weights from `model.init_seed`, so a run can start without a
checkpoint and all honest nodes agree on θ_0 bit for bit on CPU.
"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from templar.core.config import HParams


def llama_config(hp: HParams) -> LlamaConfig:
    m = hp.model
    return LlamaConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_hidden_layers,
        num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        rope_theta=m.rope_theta,
        rms_norm_eps=m.rms_norm_eps,
        tie_word_embeddings=m.tie_word_embeddings,
        attention_dropout=0.0,
        use_cache=False,
    )


def build_model(hp: HParams, device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """θ_0 for the run: deterministic from `model.init_seed`; `device="meta"` allocates nothing."""
    config = llama_config(hp)
    if str(device) == "meta":
        with torch.device("meta"):
            return LlamaForCausalLM(config)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(hp.model.init_seed)
        with torch.device("cpu"):
            model = LlamaForCausalLM(config)
    finally:
        torch.random.set_rng_state(state)
    model.config.use_cache = False
    return model.to(device)


def checkpoint_activations(model: torch.nn.Module, enable: bool = True) -> None:
    """Keep only each decoder layer's input for the backward pass and recompute the layer there
    (non-reentrant `torch.utils.checkpoint`): about a third more training compute for most of the
    activations' memory. A node-local memory setting: the recomputed forward runs the same kernels
    on the same inputs, so gradients are unchanged (bit for bit in the CPU tests). Idempotent;
    `enable=False` turns it off. transformers 5 names it activation checkpointing, 4 gradient."""
    name = "activation" if hasattr(model, "activation_checkpointing_enable") else "gradient"
    on = getattr(model, f"is_{name}_checkpointing")
    if enable and not on:
        getattr(model, f"{name}_checkpointing_enable")(**{f"{name}_checkpointing_kwargs": {"use_reentrant": False}})
    elif not enable and on:
        getattr(model, f"{name}_checkpointing_disable")()


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parameter_shapes(model: torch.nn.Module) -> dict[str, torch.Size]:
    """Names and shapes of trainable tensors: the schema every gradient payload is checked against."""
    return {name: p.shape for name, p in model.named_parameters() if p.requires_grad}


def causal_lm_loss(model: LlamaForCausalLM, input_ids: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over a batch of packed sequences."""
    logits = model(input_ids=input_ids).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), input_ids[:, 1:].reshape(-1)
    )
