"""The memory arithmetic (`templar.core.memory`) against what autograd really keeps: a small LLaMA's
forward under bf16 autocast (float32 weights, the 1-process node; and bf16 weights, FSDP's mixed
precision), with and without activation checkpointing, counting each saved storage once."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from templar.core.config import REPO_ROOT, load_hparams
from templar.core.memory import (
    SETTINGS,
    MemorySettings,
    ModelShape,
    StateCopies,
    activation_bytes,
    node_memory,
)
from templar.core.model import build_model, checkpoint_activations, parameter_count, parameter_shapes

CONFIG = dict(vocab_size=1000, hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2,
              num_hidden_layers=2, max_position_embeddings=256, use_cache=False, attention_dropout=0.0,
              tie_word_embeddings=False)


def saved_bytes(dtype: torch.dtype, checkpointed: bool, batch: int = 2, seq: int = 256) -> tuple[int, int]:
    """(bytes of every storage autograd saves in a micro-batch's forward and loss, the weights'
    share of them: their bf16 casts), parameters' own storages excluded."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).to(dtype)
    if checkpointed:
        checkpoint_activations(model)
    model.train()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weights = {tuple(p.shape[::-1]) for p in model.parameters() if p.dim() == 2}
    seen: dict[int, tuple[int, bool]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:  # a weight's bf16 cast is saved transposed
            seen[storage.data_ptr()] = (storage.nbytes(), t.dim() == 2 and tuple(t.shape) in weights
                                        and t.dtype == torch.bfloat16 and dtype == torch.float32)
        return t

    ids = torch.randint(0, CONFIG["vocab_size"], (batch, seq))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=ids).logits
        torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(), ids[:, 1:].reshape(-1))
    return sum(n for n, _ in seen.values()), sum(n for n, cast in seen.values() if cast)


@pytest.mark.parametrize("dtype,residual", [(torch.float32, 4), (torch.bfloat16, 2)])
@pytest.mark.parametrize("checkpointed", [False, True])
def test_activation_arithmetic_matches_what_autograd_saves(dtype, residual, checkpointed) -> None:
    total, casts = saved_bytes(dtype, checkpointed)
    shape = ModelShape.of(LlamaConfig(**CONFIG))
    a = activation_bytes(shape, 2, 256, residual_bytes=residual, checkpointed=checkpointed)
    t, v = 2 * 256, CONFIG["vocab_size"]
    # what the head keeps (its transients, the bf16 logits and their float32 copy, are not saved)
    expected = a.kept + a.head - 6 * t * v
    assert casts == pytest.approx(a.weight_casts, rel=0.01)
    assert total - casts == pytest.approx(expected, rel=0.01), (total - casts, expected)


def test_shape_counts_the_models_parameters() -> None:
    for preset in (None, "tiny"):
        hp = load_hparams(preset)
        assert ModelShape.of(hp.model).parameters == parameter_count(build_model(hp, "meta"))


@pytest.mark.parametrize("preset", [None, "tiny", "rehearsal", str(REPO_ROOT / "tests" / "presets" / "micro.json"), "untied"])
def test_shape_names_every_tensor_of_the_model_in_its_order(preset: str | None) -> None:
    """The sizing's schema (`ModelShape.parameter_shapes`) is the built model's, name by name and in
    order: a payload's size cap reads the names, so a transformers release that renames or adds a
    tensor fails here, not in `templar doctor`'s figures. Grouped-query attention (micro) and an
    untied head included."""
    if preset == "untied":
        hp = load_hparams("tiny")
        hp = hp.model_copy(update={"model": hp.model.model_copy(update={"tie_word_embeddings": False})})
    else:
        hp = load_hparams(preset)
    built = {name: tuple(shape) for name, shape in parameter_shapes(build_model(hp, "meta")).items()}
    assert list(ModelShape.of(hp.model).parameter_shapes().items()) == list(built.items())


def test_settings_order_and_flags() -> None:
    assert [s.name for s in SETTINGS] == ["default", "offload", "offload + checkpointing"]
    assert SETTINGS[0].flags == () and SETTINGS[2].flags == ("--memory.offload", "--memory.checkpoint_activations")


def test_offload_moves_the_state_to_host_and_checkpointing_the_activations() -> None:
    hp = load_hparams()
    shape, n = ModelShape.of(hp.model), ModelShape.of(hp.model).parameters
    copies = StateCopies.of("miner", inner_optimizer="adamw", inner_steps=16, outer=0)
    assert (copies.offloadable, copies.saved) == (4, 3)
    rows = {s: node_memory(shape, copies, role="miner", setting=s, ranks=1, micro_batch=4, seq=2048, inner_steps=16)
            for s in (*SETTINGS, MemorySettings(checkpoint_activations=True))}
    default, offload, both = (rows[s] for s in SETTINGS)
    assert default.gpu_bytes - offload.gpu_bytes == pytest.approx(16 * n)  # EF, θ_t, two moments
    assert offload.host["AdamW moments"] == 8 * n and "AdamW moments" not in offload.gpu
    assert both.gpu_bytes < offload.gpu_bytes < default.gpu_bytes
    assert offload.transfer_bytes == (16 * 2 * 8 + 2 * 4 + 2 * 4) * n and default.transfer_bytes == 0
    assert both.recompute_share == pytest.approx(1 / 3) and offload.recompute_share == 0
    # an outer rule with its own float32 state (a momentum buffer) costs every node one more copy
    with_momentum = StateCopies.of("miner", inner_optimizer="adamw", inner_steps=16, outer=1)
    more = node_memory(shape, with_momentum, role="miner", setting=SETTINGS[1], ranks=1, micro_batch=4, seq=2048,
                       inner_steps=16)
    assert more.gpu_bytes - offload.gpu_bytes == pytest.approx(4 * n)
    validator = StateCopies.of("validator", inner_optimizer="adamw", inner_steps=16, outer=0)
    assert validator.offloadable == 0 and validator.saved == 0


def test_host_memory_counts_the_window_s_gathered_payloads_decoded() -> None:
    """A node holds every payload it gathered decoded for the window (an int64 index and a float32 value per
    kept value): a miner its peer list, a validator F_t too (79 at production: 17.8 GB at 1.2B, most of its
    host memory)."""
    from templar.core.config import load_hparams
    from templar.core.memory import DECODED_BYTES_PER_VALUE
    from templar.tools.sizing import model_memory

    hp = load_hparams()
    kept = hp.demo.topk / hp.demo.target_chunk ** 2 * ModelShape.of(hp.model).parameters
    miner, validator = model_memory(hp, "miner"), model_memory(hp, "validator")
    assert miner.host["gathered payloads, decoded"] == hp.gauntlet.top_g * DECODED_BYTES_PER_VALUE * kept
    assert validator.host["gathered payloads, decoded"] == (
        (hp.gauntlet.top_g + hp.gauntlet.fast_eval_uids) * DECODED_BYTES_PER_VALUE * kept)
    assert validator.host["gathered payloads, decoded"] > validator.host_bytes / 2
