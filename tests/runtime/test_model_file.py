"""A one-process node's model file (`runtime.model_file`): what the lead publishes as a checkpoint and
what a joining node loads, for untied and tied embeddings alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from templar.comms import CheckpointError
from templar.core.config import load_hparams
from templar.core.model import build_model
from templar.runtime.model_file import check_model_file, load_model_file, write_model_file

MICRO = Path(__file__).resolve().parents[1] / "presets" / "micro-gauntlet.json"


def _model(tmp_path: Path, *, tied: bool, seed: int) -> torch.nn.Module:
    preset = tmp_path / f"micro-{tied}.json"
    preset.write_text(json.dumps({"base": str(MICRO), "name": f"micro-tied-{tied}",
                                  "model": {"tie_word_embeddings": tied}}))
    torch.manual_seed(seed)
    model = build_model(load_hparams(str(preset)))
    for p in model.parameters():  # a θ no fresh build has, so a load that did nothing shows
        p.data.add_(torch.randn_like(p) * 0.01)
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_written_model_loads_back_bit_for_bit(tmp_path: Path, tied: bool) -> None:
    """Tied embeddings are one tensor under two names, which safetensors refuses to write as is (a
    lead on such a run failed its first checkpoint): both names are written, and loading keeps them
    one tensor."""
    source, target = _model(tmp_path, tied=tied, seed=0), _model(tmp_path, tied=tied, seed=1)
    path = tmp_path / "model.safetensors"
    write_model_file(source, path)
    assert set(load_file(str(path))) == set(source.state_dict())
    load_model_file(target, path)
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name
    head, embedding = target.get_output_embeddings().weight, target.get_input_embeddings().weight
    assert (head.data_ptr() == embedding.data_ptr()) is tied


def test_a_file_that_does_not_fit_is_refused_and_the_model_kept(tmp_path: Path) -> None:
    model = _model(tmp_path, tied=False, seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    path = tmp_path / "model.safetensors"
    write_model_file(_model(tmp_path, tied=False, seed=1), path)
    tensors = load_file(str(path))
    name = next(iter(tensors))
    tensors[name] = torch.full_like(tensors[name], float("nan"))
    save_file(tensors, str(path))
    assert "non-finite" in (check_model_file(path, model.state_dict()) or "")
    with pytest.raises(CheckpointError, match="non-finite"):
        load_model_file(model, path)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())
