"""hparams: production and presets validate; bad files fail naming the key."""

import json

import pytest

from templar.core.config import (
    REPO_ROOT,
    GauntletConfig,
    HParams,
    HParamsError,
    load_hparams,
    resolve_hparams_path,
)


def test_production_and_tiny_validate():
    prod = load_hparams()
    tiny = load_hparams("tiny")
    assert prod.model.hidden_size == 2048 and prod.model.num_hidden_layers == 16
    assert prod.model.num_attention_heads == 8 and prod.model.intermediate_size == 8192
    assert prod.data.sequence_length == 2048
    # SparseLoCo at the measured best (benchmarks/LOG.md §13, §18): constant α 2, top-64, error feedback
    # 0.99, weight decay in the inner AdamW
    assert (prod.demo.topk, prod.demo.target_chunk, prod.demo.momentum_decay) == (64, 64, 0.99)
    o = prod.optimizer
    assert (o.method, o.outer_schedule, o.learning_rate, o.weight_decay) == ("sparseloco", "constant", 2.0, 0.0)
    assert (prod.inner.steps, prod.inner.optimizer, prod.inner.learning_rate, prod.inner.overlap) == (29, "adamw", 4e-4, "eager")
    assert prod.inner.weight_decay == 0.1
    assert prod.data.pages_per_window == prod.inner.steps  # one page per inner step
    g = prod.gauntlet
    assert (g.top_g, g.power, g.eval_lr_factor, g.sync_max_steps, g.fast_eval_penalty) == (15, 2.0, 0.2, 3.0, 0.75)
    # the preset overrides only what it names and inherits the rest from its base
    assert tiny.model.hidden_size == 128 and tiny.demo == prod.demo
    assert tiny.model.rope_theta == prod.model.rope_theta
    assert tiny.digest() != prod.digest()


def _write(tmp_path, body, name="h.json"):
    path = tmp_path / name
    path.write_text(json.dumps(body))
    return path


def _production_dict():
    return json.loads(resolve_hparams_path(None).read_text())


def test_unknown_key_is_named(tmp_path):
    body = _production_dict()
    body["optimizer"]["learnig_rate"] = 1.0
    with pytest.raises(HParamsError, match=r"optimizer\.learnig_rate"):
        load_hparams(_write(tmp_path, body))


def test_missing_key_is_named(tmp_path):
    body = _production_dict()
    del body["gauntlet"]["top_g"]
    with pytest.raises(HParamsError, match=r"gauntlet\.top_g"):
        load_hparams(_write(tmp_path, body))


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [("demo", "momentum_decay", 1.5), ("gauntlet", "top_g", 0), ("optimizer", "learning_rate", "fast"),
     ("windows", "blocks_per_window", 7.5), ("model", "num_attention_heads", 7)],
)
def test_bad_value_is_named(tmp_path, section, key, value):
    body = _production_dict()
    body[section][key] = value
    with pytest.raises(HParamsError, match=section):
        load_hparams(_write(tmp_path, body))


def test_preset_chain_and_loop(tmp_path):
    base = _write(tmp_path, _production_dict(), "base.json")
    child = _write(tmp_path, {"base": base.name, "name": "child", "optimizer": {"learning_rate": 0.01}}, "c.json")
    hp = load_hparams(child)
    assert hp.name == "child" and hp.optimizer.learning_rate == 0.01
    assert hp.optimizer.warmup_steps == load_hparams(base).optimizer.warmup_steps
    _write(tmp_path, {"base": "b.json"}, "a.json")
    _write(tmp_path, {"base": "a.json"}, "b.json")
    with pytest.raises(HParamsError, match="loops"):
        load_hparams(tmp_path / "a.json")


def test_tiny_scores_with_productions_rules_and_tiny_paper_with_the_papers():
    """The README's localnet (`tiny`) pays and steps as production does: its gauntlet section is
    production's except what scales with the subnet, and its outer step is production's rule at
    production's settings (the inner rate is tiny's own, benchmarks/LOG.md §18). `tiny-signed` is
    tiny on the paper's signed step; `tiny-paper` is the same model, data and windows with the paper's
    rules, and the tests' `micro` model is built on it."""
    prod, tiny, paper = load_hparams(), load_hparams("tiny"), load_hparams("tiny-paper")
    signed = load_hparams("tiny-signed")
    assert tiny.optimizer.model_copy(update={"warmup_steps": 0, "total_steps": 1, "micro_batch_size": 1}) == \
        prod.optimizer.model_copy(update={"warmup_steps": 0, "total_steps": 1, "micro_batch_size": 1})
    assert (signed.optimizer.method, signed.demo.topk) == ("signed", 32) and signed.gauntlet == tiny.gauntlet
    scale = {"top_g", "uids_per_window", "fast_eval_uids", "sync_max_steps", "proof_sequences"}
    rules = {k: v for k, v in prod.gauntlet.model_dump().items() if k not in scale}
    assert {k: v for k, v in tiny.gauntlet.model_dump().items() if k not in scale} == rules
    g = paper.gauntlet
    assert (g.loss_rating, g.mu_gamma, g.proof_margin, g.selection_sharpness, g.newcomer_evals, g.mu_prior_evals) \
        == ("openskill", 0.7, 0.3, 0.0, 0, None)
    assert (paper.model, paper.data, paper.windows, paper.optimizer) == (tiny.model, tiny.data, tiny.windows,
                                                                          signed.optimizer)
    assert load_hparams(REPO_ROOT / "tests" / "presets" / "micro.json").gauntlet == g


def test_a_missing_bare_preset_names_its_file_and_where_to_read_how(tmp_path, monkeypatch):
    """`--hparams local` before `hparams/local.json` exists (docs/mining.md §6 makes it): the error
    names that file and the section, not `<cwd>/local`."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HParamsError, match=r"hparams/local\.json does not exist .*docs/mining\.md §6"):
        load_hparams("local")
    assert "Save it as `hparams/local.json` and pass `--hparams local`" in (
        REPO_ROOT / "docs" / "mining.md").read_text()


def test_an_overlapped_run_whose_step_lands_after_the_next_commitment_is_refused():
    """An overlapped miner encodes the next payload once the window's step landed: the lead's first
    slot must close before the next window's commitment deadline, or every miner misses it."""
    tiny = load_hparams("tiny")
    late = tiny.windows.model_dump() | {"blocks_per_window": 12, "put_window_seconds": 3.0}  # slot 12.25 s > 9.5 s
    with pytest.raises(ValueError, match="after the next window's commitment deadline"):
        HParams.model_validate(tiny.model_dump() | {"windows": late})
    # the lead's inputs count when stored by the slot's deadline plus the clock-skew allowance: 17.25 s > 17 s
    skewed = tiny.windows.model_dump() | {"handover_seconds": 5.0}
    with pytest.raises(ValueError, match="after the next window's commitment deadline"):
        HParams.model_validate(tiny.model_dump() | {"windows": skewed})
    blocking = tiny.inner.model_dump() | {"overlap": "blocking"}
    assert HParams.model_validate(tiny.model_dump() | {"windows": late, "inner": blocking}).inner.overlap == "blocking"


def test_sparseloco_refuses_an_outer_weight_decay_it_would_not_apply():
    """SparseLoCo's outer step is θ − α·Δ: its weight decay is the inner AdamW's. A run file asking
    for an outer decay is refused, not run without one; the signed rule applies it (θ·(1 − α·wd))."""
    tiny = load_hparams("tiny")
    assert tiny.optimizer.method == "sparseloco" and tiny.optimizer.weight_decay == 0 and tiny.inner.weight_decay > 0
    decayed = tiny.optimizer.model_dump() | {"weight_decay": 0.01}
    with pytest.raises(ValueError, match="takes its weight decay in the inner steps"):
        HParams.model_validate(tiny.model_dump() | {"optimizer": decayed})
    signed = load_hparams("tiny-signed")
    assert signed.optimizer.method == "signed" and signed.optimizer.weight_decay > 0


def test_the_proofs_baseline_is_named_and_files_that_gave_only_groups_keep_their_meaning():
    """`gauntlet.proof_baseline`: 'random' unless said (production says 'others'); a file from before it
    that set `proof_baseline_groups` k > 0 and no baseline meant 'groups'; a count of groups with any
    other baseline is refused."""
    tiny = load_hparams("tiny")
    assert tiny.gauntlet.proof_baseline == "others" and tiny.gauntlet.proof_baseline_groups == 0
    assert GauntletConfig.model_fields["proof_baseline"].default == "random"

    def gauntlet(**changes):
        body = tiny.model_dump()
        body["gauntlet"] = {k: v for k, v in body["gauntlet"].items() if k != "proof_baseline"} | changes
        return HParams.model_validate(body).gauntlet

    assert gauntlet(proof_baseline_groups=3).proof_baseline == "groups"
    assert gauntlet(proof_baseline="others").proof_baseline_min_others == 3
    for bad in ({"proof_baseline": "others", "proof_baseline_groups": 3}, {"proof_baseline": "groups"},
                {"proof_baseline": "others", "proof_baseline_min_others": 2}):
        with pytest.raises(ValueError, match="proof_baseline"):
            gauntlet(**bad)
    assert load_hparams(REPO_ROOT / "benchmarks" / "presets" / "micro_gauntlet_8pages_common3.json"
                        ).gauntlet.proof_baseline == "groups"
