"""`benchmarks/convergence.py` stays runnable: one window of every method through production's code paths."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def convergence(benchmark_module):
    return benchmark_module("convergence")


@pytest.mark.slow(seconds=15)
def test_every_method_learns_and_the_summary_reports_both_comparisons(convergence, tmp_path, assets_dir,
                                                                     monkeypatch) -> None:
    """H = 2 on P = 1 page, one window each at the grid's centres, plus one targeted point (about 10 s
    of CPU, mostly the eight windows' forward and backward passes): every run lowers the
    held-out loss, payloads are real wire bytes far below dense, and the JSON holds both tables."""
    monkeypatch.setattr(convergence, "HOLDOUT_PAGES", 2)  # 8 held-out sequences: enough to see a step
    monkeypatch.setattr(convergence, "_data", convergence._data.__wrapped__)
    argv = ["--quick", "--windows", "1", "--inner-steps", "2", "--pages", "1", "--threads", "1", "--out", str(tmp_path),
            "--point", "sparseloco_h:inner=1e-3,outer=1,topk=128,decay=0.9"]
    assert convergence.main(argv) == 0
    body = json.loads((tmp_path / "convergence_quick.json").read_text())
    assert (tmp_path / "convergence_quick_tokens.png").stat().st_size > 0
    assert (tmp_path / "convergence_quick_windows.png").stat().st_size > 0

    assert set(body["best"]) == set(convergence.methods(2))
    for key, run in body["best"].items():
        assert run["holdout_loss"][-1] < run["holdout_loss"][0], key  # one step at peak rate helps
        assert run["eval_windows"] == [0, 1]
    tokens = {r["method"]: r for r in body["comparisons"]["tokens"]["rows"]}
    windows = {r["method"]: r for r in body["comparisons"]["windows"]["rows"]}
    assert tokens[convergence.BASELINE]["ratio"] == 1.0 and windows[convergence.PAPER]["ratio"] == 1.0
    assert set(tokens) == {"adamw_dp_h", "adamw_dp_1", "signed_h1", "signed_h", "sparseloco_h"}
    assert set(windows) == {"signed_h1", "signed_h_wide", "sparseloco_h_wide"}

    best = body["best"]
    # the settings are the run's: H inner AdamW steps on P pages (the wide runs on H·P), the method's rule
    assert best["signed_h"]["settings"]["inner"]["steps"] == 2
    assert best["signed_h"]["settings"]["inner"]["optimizer"] == "adamw"
    assert (best["signed_h1"]["settings"]["inner"]["steps"], best["signed_h1"]["settings"]["inner"]["optimizer"]) \
        == (1, "sgd")
    assert best["sparseloco_h_wide"]["settings"]["pages_per_window"] == 2 * best["sparseloco_h"]["settings"][
        "pages_per_window"]
    assert best["sparseloco_h"]["settings"]["method"] == "sparseloco"
    # the wire: signed payloads (DCT top-32, int8) and SparseLoCo's (top-64, 2-bit) are > 100x below dense fp32
    assert body["goals"]["fewer_bytes_than_dense"]["min"] > 100
    assert best["adamw_dp_h"]["bytes_per_token"] == pytest.approx(2 * best["adamw_dp_1"]["bytes_per_token"])
    extra = [r for r in body["sweep"]["sparseloco_h"] if r["tag"] == "extra"]
    assert [(r["topk"], r["decay"]) for r in extra] == [(128, 0.9)]
    assert best["sparseloco_h"]["spec"]["tag"] == "sweep"  # extra points never stand for the method


def test_hparams_of_a_run_are_validated_settings(convergence) -> None:
    """A run's settings go through HParams validation (more inner steps than sequences is refused)
    and carry the swept rates and a schedule matched to the run's length."""
    spec = convergence.Spec("sparseloco_h", "subnet", "tiny-sparseloco", 1e-3, 1.0, 16, 2, 60)
    with pytest.raises(ValueError, match="exceeds the window's sequences"):
        convergence.hparams_for(spec)
    hp = convergence.hparams_for(convergence.Spec("signed_h", "subnet", "tiny", 1e-3, 3e-3, 4, 2, 60))
    assert (hp.optimizer.learning_rate, hp.optimizer.warmup_steps, hp.optimizer.total_steps) == (3e-3, 6, 60)
    assert (hp.inner.steps, hp.inner.optimizer, hp.inner.learning_rate) == (4, "adamw", 1e-3)


def test_equal_windows_runs_take_the_best_rates_of_their_counterpart(convergence) -> None:
    """The second stage runs each wide method at its counterpart's best grid point (an extra point
    never leads), and at the counterpart's grid centre when that one did not run."""
    def run(method: str, inner: float, outer: float, loss: float, tag: str = "sweep") -> dict:
        spec = convergence.Spec(method, "subnet", "tiny", inner, outer, 4, 2, 30, tag=tag)
        return {"spec": {"method": method, "inner_lr": inner, "outer_lr": outer, "tag": tag}, "name": spec.name(),
                "settings": {"topk": 32, "momentum_decay": 0.999}, "final_loss": loss, "seconds": 1.0}

    results = [run("signed_h", 1e-3, 6e-3, 7.0), run("signed_h", 3e-3, 1.2e-2, 6.8),
               run("signed_h", 6e-3, 1.2e-2, 6.7, tag="extra")]
    specs = {s.method: s for s in convergence.follow_specs(results, 4, 30, 2, None)}
    assert (specs["signed_h_wide"].inner_lr, specs["signed_h_wide"].outer_lr) == (3e-3, 1.2e-2)
    assert specs["signed_h_wide"].pages == 8 and specs["signed_h_wide"].steps == 4
    lead = convergence.methods(4)["sparseloco_h"]
    assert (specs["sparseloco_h_wide"].inner_lr, specs["sparseloco_h_wide"].outer_lr) == (
        lead.inner[len(lead.inner) // 2], lead.outer[len(lead.outer) // 2])
