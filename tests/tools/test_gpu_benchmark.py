"""`benchmarks/performance/gpu.py` cannot rot between the rare runs on a GPU: its `--smoke` mode runs every phase
on tiny's rules (a micro model) and the CPU, the consensus check compares two real implementations (the C
kernels and torch's paths), a failing phase costs only itself, and nothing it imports needs
bittensor (the GPU machine has none)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import time
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from benchmarks.performance import gpu
from templar.compress import native
from templar.core.config import load_hparams
from templar.core.memory import SETTINGS

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow(seconds=15)
def test_smoke_runs_every_phase_and_prints_the_table(tmp_path: Path, assets_dir: Path, capsys) -> None:
    out = tmp_path / "gpu.json"
    rc = gpu.main(["--smoke", "--out", str(out), "--work", str(tmp_path / "work")])
    result = json.loads(out.read_text())
    phases = result["phases"]
    want = dict.fromkeys(gpu.PHASES, "ok")
    if not native.available():  # built without a compiler: a CPU has no second implementation to compare
        want["consensus"] = "error"
        assert "nothing to compare" in phases["consensus"]["error"]
    assert {n: p["status"] for n, p in phases.items()} == want, {n: p.get("error") for n, p in phases.items()}
    assert rc == (0 if native.available() else 1)

    hp = load_hparams("tiny")
    corpus = phases["corpus"]
    assert corpus["page_tokens"] == hp.data.sequence_length * hp.data.sequences_per_page
    assert corpus["vocab"] <= hp.model.vocab_size and corpus["pages"] > 20
    # the smoke's model reads its tokenizer's entries only (production's is hparams.json's, 32,000 either way)
    assert phases["setup"]["vocab"] == corpus["vocab"] == gpu.SMOKE.vocab and not gpu.PRODUCTION.model_on_vocab

    window = phases["window"]
    paper = window["paper"]
    assert paper["tokens"] == hp.data.pages_per_window * corpus["page_tokens"]
    assert paper["train_seconds"] > 0 and paper["forward_backward_per_micro_batch"]["median_seconds"] > 0
    assert paper["aggregate_peers"] == hp.gauntlet.top_g and paper["payload_bytes"] > 0
    assert paper["peak_memory_gb"] is None and paper["mfu"] is None  # a CPU has neither
    assert window["inner_steps_2"]["steps_per_window"] == 2 and window["inner_steps_2"]["train_seconds"] > 0
    production = window["production"]  # tiny's own inner steps (4 AdamW steps)
    assert production["steps_per_window"] == hp.inner.steps > 1 and production["train_seconds"] > 0

    memory = phases["memory"]  # each memory setting from the same θ: its peak (None on a CPU) and its update
    assert list(memory["settings"]) == [s.name for s in SETTINGS] and memory["all_identical"]
    for row in memory["settings"].values():
        assert row["peak_memory_gb"] is None and row["estimate_gb"] > 0 and row["train_seconds"] > 0
    assert memory["settings"]["offload"]["estimate_gb"] < memory["settings"]["default"]["estimate_gb"]

    validator = phases["validator"]
    assert validator["seconds_per_peer"] > 0 and validator["peers_per_window"] >= 0
    assert validator["eval_seconds_per_window"] > validator["fixed_seconds"]
    for baseline in ("common", "common_quarter", "others", "others_quarter"):  # timed beside the plain evaluation
        assert validator[f"{baseline}_over_plain"] > 0 and validator[f"{baseline}_sequence_forwards"] > 0, baseline
    # the others' P passes over every unit read more sequences than the plain evaluation; a quarter fewer
    assert validator["others_sequence_forwards"] > validator["others_quarter_sequence_forwards"]
    assert validator["others_quarter_eval_seconds_per_window"] > validator["holdout_seconds"]
    reads = validator["gather_reads"]  # a validator's gather of F_t and the peer list, read strictly on this host
    assert reads["validator_reads"] == hp.gauntlet.fast_eval_uids + hp.gauntlet.top_g and reads["read_seconds"] > 0
    assert reads["validator_reads_seconds"] > 0 and reads["kernels"] == native.available()

    consensus = phases["consensus"]
    if not native.available():
        return
    assert (consensus["reference"], consensus["candidate"]) == ("cpu/native", "cpu/torch")
    assert consensus["kept_sets"]["only_near_ties"] and consensus["kept_sets"]["chunks"] > 0
    assert consensus["accumulators"]["all"] and consensus["accumulators"]["tensors"] == len(gpu.Bench(
        gpu.SMOKE, torch.device("cpu"), out, tmp_path).shapes)
    assert consensus["signs"]["differing"] == 0  # both invert with torch's CPU transform
    assert consensus["fingerprint"]["model_in_sync"] and consensus["consistent"]

    noise = phases["noise"]
    assert gpu.SMOKE.noise_min_peers <= len(noise["peers"]) <= gpu.SMOKE.noise_peers  # more only as the cap allows
    for row in noise["peers"].values():
        assert len(row["delta_rand_pages"]) == gpu.SMOKE.noise_random_pages
        assert len(row["delta_assigned_pages"]) == hp.data.pages_per_window
        assert all(math.isfinite(d) for d in row["delta_rand_pages"] + row["delta_assigned_pages"])
    assert len(noise["relative_sd_across_peers"]) == gpu.SMOKE.noise_random_pages
    assert noise["subnet_sim_noise"] > 0 and noise["fit_honest_relative_sd"] > 0
    # production's proof by size on every honest sequence: a credit in [-1, 1] per peer and the share
    # of sequences that earn it in full (what decides whether c = 2 rewards work at this scale)
    proof = noise["proof_credit"]
    assert proof["full_gap"] == hp.gauntlet.proof_full_gap and proof["typical_gap"] > 0
    assert set(proof["credit"]) == set(noise["peers"])
    assert all(-1 <= c <= 1 for c in proof["credit"].values())
    assert all(0 <= f <= 1 for f in proof["full_credit_share"].values())
    for row in noise["peers"].values():
        assert len(row["delta_assigned_sequences"]) == (hp.data.pages_per_window * hp.data.sequences_per_page
                                                         * hp.gauntlet.position_ranges)

    # the same peers against each unit's own baseline (gauntlet.proof_baseline "groups" and "others"; the
    # others need 4 peers, which the smoke scale trains whatever the time cap: `noise_min_peers`)
    assert len(noise["peers"]) == gpu.SMOKE.noise_min_peers == 1 + hp.gauntlet.proof_baseline_min_others
    for key in ("proof_credit_common", "proof_credit_common_quarter", "proof_credit_others",
                "proof_credit_others_quarter"):
        credit = noise[key]["credit"]
        assert set(credit) == set(noise["peers"]) and all(-1 <= c <= 1 for c in credit.values()), key

    printed = capsys.readouterr().out
    assert "consensus: model_in_sync" in printed and "noise: subnet_sim `noise` factor" in printed
    assert "noise: proof credit by size per honest peer" in printed
    assert "noise: the same (the other peers' steps), reading a secret quarter" in printed
    assert "memory (offload + checkpointing): peak GPU memory" in printed
    assert [row[0] for row in result["table"]] == [row[0] for row in gpu.table(result)]


def test_a_failing_phase_is_recorded_and_the_next_one_still_runs(tmp_path: Path, monkeypatch) -> None:
    """An OOM in one phase must not cost the device call's other measurements."""
    ran = []

    def out_of_memory(b):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")

    def next_phase(b):
        ran.append(b.scale.name)
        return {"figure": 1.0}

    monkeypatch.setitem(gpu.PHASE_FUNCTIONS, "window", out_of_memory)
    monkeypatch.setitem(gpu.PHASE_FUNCTIONS, "validator", next_phase)
    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--phases", "window,validator", "--out", str(out)]) == 1
    phases = json.loads(out.read_text())["phases"]
    assert phases["setup"]["status"] == "ok"
    assert phases["window"]["status"] == "error" and "OutOfMemoryError" in phases["window"]["error"]
    assert phases["validator"] == {"status": "ok", "figure": 1.0, "seconds": phases["validator"]["seconds"]}
    assert ran == ["smoke"] and "corpus" not in phases


def test_every_phase_starts_from_theta0_whatever_the_phase_before_did_to_the_model(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """The window phase trains the shared model and the consensus phase applies a window to it; a phase
    after them (the noise phase's "48 steps away from θ_0") must still start from θ_0."""
    seen: dict[str, dict[str, torch.Tensor]] = {}

    def trains_the_model(b):
        with torch.no_grad():
            for param in b.model().parameters():
                param.add_(1.0)
        return {}

    def reads_the_model(b):
        seen.update({n: p.detach().clone() for n, p in b.model().named_parameters()})
        return {}

    monkeypatch.setitem(gpu.PHASE_FUNCTIONS, "window", trains_the_model)
    monkeypatch.setitem(gpu.PHASE_FUNCTIONS, "consensus", trains_the_model)
    monkeypatch.setitem(gpu.PHASE_FUNCTIONS, "noise", reads_the_model)
    assert gpu.main(["--smoke", "--phases", "window,consensus,noise", "--out", str(tmp_path / "gpu.json")]) == 0
    b = gpu.Bench(gpu.SMOKE, torch.device("cpu"), tmp_path / "unused.json", tmp_path)
    theta0 = dict(b.model().named_parameters())
    assert seen.keys() == theta0.keys()
    assert all(torch.equal(seen[n], theta0[n].detach()) for n in seen)


def test_a_phase_without_time_left_is_skipped(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setitem(gpu.PHASE_FUNCTIONS, "corpus", lambda b: pytest.fail("ran past the budget"))
    monkeypatch.setattr(gpu, "SMOKE", gpu.Scale(**{**gpu.SMOKE.__dict__, "minimum": {"corpus": 60.0}}))
    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--phases", "corpus", "--budget", "30", "--out", str(out)]) == 0
    corpus = json.loads(out.read_text())["phases"]["corpus"]
    assert corpus["status"] == "skipped" and "left of the run's budget" in corpus["reason"]


def test_a_phase_s_cap_is_set_from_the_command_line(tmp_path: Path, monkeypatch) -> None:
    """`--cap noise=345` gives the noise phase the time the others' baseline's 4 peers take at 1.2B."""
    deadlines = []
    monkeypatch.setitem(gpu.PHASE_FUNCTIONS, "corpus", lambda b: deadlines.append(b.phase_deadline - time.monotonic()) or {})
    out = tmp_path / "gpu.json"
    assert gpu.main(["--smoke", "--phases", "corpus", "--cap", "corpus=7", "--out", str(out)]) == 0
    assert 6 < deadlines[0] <= 7
    with pytest.raises(SystemExit):
        gpu.main(["--smoke", "--phases", "corpus", "--cap", "nosuchphase=7", "--out", str(out)])


DEVICE_IMAGE = ("torch", "transformers", "safetensors", "numpy")
"""What the GPU machine's image has (with what those need): docs/mining.md §6, "How to run it on a GPU"."""


def _with_requirements(names: set[str]) -> set[str]:
    """`names` and every distribution they require, as installed here (extras left out)."""
    found: set[str] = set()
    todo = [n.lower().replace("_", "-") for n in names]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name.lower().replace("_", "-"))
    return found


@pytest.mark.slow(seconds=6)
def test_what_it_imports_is_in_the_device_image_or_the_carried_wheels_and_needs_no_bittensor(tmp_path: Path) -> None:
    """The device call installs `gpu_wheels.sh`'s packages with `--no-index` on an image of torch,
    transformers, safetensors and numpy: a package that the phases import and neither the image nor
    those wheels hold ends the paid call at its first import (openskill, once the noise phase imported
    `templar.gauntlet`), and so would the chain layer (importing `templar.runtime.consensus.outer` there
    would end the run before it starts). One interpreter checks both: every other installed distribution
    is hidden from site-packages (as it is absent there; optional imports, torch's of dill and
    transformers' of Pillow, fall back), bittensor refuses to import, and the benchmark imports its
    phases' modules and runs its setup phase."""
    script = (ROOT / "benchmarks" / "performance" / "gpu_wheels.sh").read_text()
    wheels = set(script.split("packages=(", 1)[1].split(")", 1)[0].split())
    assert "openskill" in wheels
    allowed = _with_requirements(set(DEVICE_IMAGE)) | _with_requirements(wheels) | {"templar"}
    assert "bittensor" not in allowed
    blocked = sorted(top for top, dists in metadata.packages_distributions().items()
                     if not top.startswith("_") and all(d.lower().replace("_", "-") not in allowed for d in dists))
    out = tmp_path / "setup.json"
    code = textwrap.dedent(f"""
        import os, sys, tempfile
        BLOCKED = set({blocked!r})
        for i, folder in enumerate(sys.path):  # site-packages as the machine has it: the blocked ones absent
            if folder.endswith("site-packages") and os.path.isdir(folder):
                view = tempfile.mkdtemp(dir={str(tmp_path)!r})
                for entry in os.listdir(folder):
                    if entry.split(".")[0].split("-")[0] not in BLOCKED:
                        os.symlink(os.path.join(folder, entry), os.path.join(view, entry))
                sys.path[i] = view
        sys.path_importer_cache.clear()
        class NoBittensor:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "bittensor":
                    raise ImportError("no bittensor on the GPU machine")
        sys.meta_path.insert(0, NoBittensor())
        from benchmarks.performance import gpu, gpu_noise, gpu_memory, gpu_consensus, gpu_report  # noqa: F401
        from templar.data import LocalCorpus  # noqa: F401 (the phases' own imports too)
        from templar.data.prepare import prepare  # noqa: F401
        from templar.gauntlet.selection import select_eval_sequences  # noqa: F401
        from templar.compress.methods import rule_of  # noqa: F401 (the memory phase's)
        from templar.core.memory import SETTINGS  # noqa: F401
        from templar.runtime.offload import HostStore  # noqa: F401
        from templar.tools.sizing import model_memory  # noqa: F401
        gpu._build_assets()
        sys.exit(gpu.main(["--smoke", "--phases", "setup", "--out", {str(out)!r}]))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, "imported on the GPU machine but not in its image, nor in gpu_wheels.sh, or " \
        "needs bittensor:\n" + done.stderr[-2000:]
    setup = json.loads(out.read_text())["phases"]["setup"]
    assert setup["status"] == "ok" and setup["bittensor_imported"] is False
