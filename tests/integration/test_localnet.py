"""The whole subnet, as a newcomer runs it: `templar localnet` with every adversary, next to the same
run without them. Honest work is paid, cheating is not, and the model does not notice the cheats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ADVERSARIES = ["copycat", "scaled", "signflip", "noise", "freerider", "lazy", "late", "desync", "duplicate",
               "moredata"]
CHEATS = ["copycat", "signflip", "noise", "freerider", "lazy", "late", "desync"]
WINDOWS = 10

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def _localnet(out: Path, adversaries: list[str], miners: int) -> subprocess.Popen:
    flags = [f for a in adversaries for f in ("--adversary", a)] or ["--adversary", "none"]
    cmd = [sys.executable, "-m", "templar.cli", "localnet", "--windows", str(WINDOWS), "--miners", str(miners),
           "--out", str(out), "--no-live", *flags]
    log = open(out.with_suffix(".log"), "wb")  # noqa: SIM115 - closed by the child's exit
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)


def _loss_at_step(out: Path) -> dict[int, float]:
    """Held-out loss by global_step (runs start at different windows; steps are comparable)."""
    lead = out / "nodes" / "validator0" / "validator_windows.jsonl"
    return {r["global_step"]: r["holdout_loss"] for r in map(json.loads, lead.read_text().splitlines())}


def test_localnet_pays_honest_work_and_nothing_else(tmp_path):
    adversarial, baseline = tmp_path / "adversarial", tmp_path / "baseline"
    procs = [_localnet(adversarial, ADVERSARIES, miners=3), _localnet(baseline, [], miners=3)]
    codes = [p.wait(timeout=1100) for p in procs]
    for out, code in zip((adversarial, baseline), codes, strict=True):
        assert code == 0, out.with_suffix(".log").read_text()[-3000:]

    report = json.loads((adversarial / "report.json").read_text())
    assert report["outcome"] == "finished"
    for name in ("report.md", "loss.png", "weights.png", "ratings.png"):
        assert (adversarial / name).stat().st_size > 0
    assert all((adversarial / "nodes" / p["name"] / "node.log").exists() for p in report["peers"])

    miners = {p["name"]: p for p in report["peers"] if p["role"] == "miner"}
    weight = {name: p["final_weight"] for name, p in miners.items()}
    assert abs(sum(weight.values()) - 1.0) < 1e-6
    honest = [w for name, w in weight.items() if miners[name]["strategy"] == "honest" and not name.startswith("dup")]
    summary = json.dumps({n: (miners[n]["strategy"], round(w, 4)) for n, w in weight.items()})
    for cheat in CHEATS:
        name = f"{cheat}0"
        assert weight[name] < 0.05, f"{cheat} earned {weight[name]:.3f}: {summary}"
        assert weight[name] < min(honest), f"{cheat} ranked above an honest miner: {summary}"
    assert weight["scaled0"] <= max(honest) + 1e-9, summary
    # The pair's twin works honestly, so it is paid like any honest miner (sometimes the best one);
    # the copy must earn nothing, so together the pair earns what one honest miner does.
    assert weight["duplicate0"] < 0.01 and weight["duplicate0"] < min(honest), summary
    assert weight["duplicate0"] + weight["dup0-twin"] <= max([*honest, weight["dup0-twin"]]) + 1e-9, summary
    assert weight["moredata0"] > min(honest), summary

    windows = report["windows"]
    assert windows[-1]["loss"] < windows[0]["loss"] - 0.5, windows
    with_cheats, without = _loss_at_step(adversarial), _loss_at_step(baseline)
    step = max(set(with_cheats) & set(without))
    assert step >= 5
    assert abs(with_cheats[step] - without[step]) / without[step] < 0.02, (step, with_cheats[step], without[step])
