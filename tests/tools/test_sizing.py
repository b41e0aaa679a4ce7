"""Per-window sizing (`templar hparams`): the production run's inner steps fill most of the window a
miner has for training, a validator's evaluation fits inside the window at the stated MFU, and the
memory table says which setting fits which GPU. docs/mining.md carries the same figures: its
hardware and sizing parts are compared with the function here, so they cannot drift."""

import re
from pathlib import Path

import pytest

from templar.cli import main
from templar.core.config import REPO_ROOT, load_hparams
from templar.core.memory import GIB, HOST_PROCESS_BYTES, SETTINGS
from templar.tools.sizing import (
    fewest_ranks,
    fits,
    memory_markdown,
    model_memory,
    ranks_table,
    recommend,
    window_sizing,
)

MINING = Path(__file__).resolve().parents[2] / "docs" / "mining.md"
DOC_RANKS = [1, 2, 8, 16, 64]


@pytest.fixture(scope="module")
def production() -> dict:
    return window_sizing(load_hparams())


def section(text: str, number: int) -> str:
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_production_window_matches_the_paper_budget_and_fits(production):
    s = production
    assert 1.1e9 < s["parameters"] < 1.3e9
    assert s["tokens_per_window_per_peer"] == 29 * 64 * 2048  # 29 pages in H = 29 inner steps
    assert s["tokens_per_window_per_peer"] // load_hparams().inner.steps == 64 * 2048  # one page's worth a step
    assert s["page_bytes"] == 256 * 1024
    assert s["h100_train_seconds"] < s["window_seconds"]
    assert 0.9 <= s["miner_compute_utilisation"] <= 1.0  # training seconds over the window's wall-clock
    assert s["miner_fits_span"] and s["exchange_slack_seconds"] > 0  # the step lands before the next payload
    assert s["h100_validator_eval_seconds"] < s["window_seconds"] / 2
    assert s["miner_gpu_memory_gb"] < 78  # one H100
    n = s["parameters"]
    assert s["miner_state_file_gb"] == pytest.approx(16 * n / 1e9)  # θ, error feedback, two moments
    assert s["validator_state_file_gb"] == pytest.approx(4 * n / 1e9)


def test_the_overlap_turns_the_gpu_idle_exchange_into_training() -> None:
    """Utilisation is training over wall-clock seconds: the blocking window of 16 pages trained 51 %
    of it (its span share, 89 %, was of the 47.7 s a blocking window leaves); the same window length
    overlapped leaves the GPU all but its other work, and 29 pages fill 92 %; blocking could not
    train them in time. The choice was made under the signed rule (top-32 DeMo payloads, a shorter
    upload than SparseLoCo's top-64): its figures are computed on that rule's settings."""
    production = load_hparams()
    hp = production.model_copy(update={
        "optimizer": production.optimizer.model_copy(update={"method": "signed"}),
        "demo": production.demo.model_copy(update={"topk": 32, "momentum_decay": 0.999})})

    def with_(overlap: str, pages: int) -> dict:
        return window_sizing(hp.model_copy(update={"inner": hp.inner.model_copy(update={"overlap": overlap,
                                                                                         "steps": pages}),
                                                    "data": hp.data.model_copy(update={"pages_per_window": pages})}))

    before, blocked, after = with_("blocking", 16), with_("blocking", 29), with_(hp.inner.overlap, 29)
    assert hp.inner.overlap != "blocking"
    assert round(before["miner_compute_utilisation"], 2) == 0.51 and round(before["miner_span_share"], 2) == 0.89
    assert before["miner_compute_span_min_seconds"] < before["miner_compute_span_seconds"]  # a gather to its deadline
    assert not blocked["miner_fits_span"]
    assert after["miner_compute_utilisation"] >= 0.9 and after["miner_fits_span"]
    assert after["miner_compute_span_seconds"] == pytest.approx(84.0 - after["miner_gpu_overhead_seconds"])
    now = window_sizing(production)  # SparseLoCo's larger payload changes nothing the overlap hides
    assert now["miner_compute_utilisation"] == pytest.approx(after["miner_compute_utilisation"])
    assert now["miner_fits_span"]


def test_the_memory_table_names_the_setting_for_each_gpu() -> None:
    """At 1.2B: the default needs an 80 GB GPU, the offload a 40 GB one, offload and checkpointing a
    24 GB one; a GPU too small for every setting is told how many GPUs under torchrun would do."""
    hp = load_hparams()
    default, offload, both = (model_memory(hp, "miner", s) for s in SETTINGS)
    assert default.gpu_bytes > offload.gpu_bytes > both.gpu_bytes
    assert offload.host_bytes > default.host_bytes  # what left the GPU is in host memory
    assert recommend(hp, "miner", 80 * GIB).setting == SETTINGS[0]
    assert recommend(hp, "miner", 40 * GIB).setting == SETTINGS[1]
    assert recommend(hp, "miner", 24 * GIB).setting == SETTINGS[2]
    assert recommend(hp, "miner", 8 * GIB) is None
    ranks = fewest_ranks(hp, "miner", 8 * GIB, SETTINGS[2])
    assert ranks is not None and fits(model_memory(hp, "miner", SETTINGS[2], ranks), 8 * GIB)
    assert not fits(model_memory(hp, "miner", SETTINGS[2], ranks // 2), 8 * GIB)
    validator = model_memory(hp, "validator")
    assert validator.gpu_bytes == model_memory(hp, "validator", SETTINGS[2]).gpu_bytes  # the miner's flags only
    assert recommend(hp, "validator", 24 * GIB) is not None


def test_docs_carry_the_functions_memory_tables(production) -> None:
    text = MINING.read_text()
    assert memory_markdown(production) in section(text, 1)
    assert ranks_table(load_hparams(), DOC_RANKS) in section(text, 12)
    assert f"`templar hparams --ranks {' '.join(map(str, DOC_RANKS))}`" in section(text, 12)


def measured_peaks_gb() -> set[str]:
    """The peaks the GPU run measured (`benchmarks/results/gpu_nvidia_h200.json`): each memory
    setting's and the validator's, as §1 quotes them beside the estimates."""
    import json

    phases = json.loads((REPO_ROOT / "benchmarks/results/gpu_nvidia_h200.json").read_text())["phases"]
    peaks = [r["peak_memory_gb"] for r in phases["memory"]["settings"].values()]
    return {f"{v:.1f}" for v in [*peaks, phases["validator"]["peak_memory_gb"]]}


def test_the_hardware_and_sizing_figures_are_the_functions(production) -> None:
    """Every "N GB" of §1 is a figure of the sizing function, and the figures that contradicted each
    other (state file, time a window leaves for training) are stated once, from it."""
    s, text = production, MINING.read_text()
    hardware = section(text, 1)
    rows = s["memory"]
    default = rows[0]
    parts = default["gpu_parts_gb"]
    figures = {f"{v:.1f}" for row in rows for v in (row["gpu_gb"], row["host_gb"])}
    figures |= {f"{row['transfer_gb']:.0f}" for row in rows}
    figures |= {f"{parts['θ']:.1f}", f"{parts['activations and transients (peak)']:.1f}",
                f"{parts['error feedback'] + parts['θ_t snapshot'] + parts['AdamW moments']:.1f}",
                f"{s['miner_state_file_gb']:.1f}", f"{s['miner_disk_gb']:.1f}", f"{s['pcie_gb_per_second']:.0f}",
                f"{HOST_PROCESS_BYTES / 1e9:.0f}", "24", "40", "80"}
    figures |= {f"{row['host_parts_gb']['gathered payloads, decoded']:.1f}" for row in rows}  # miner, validator
    figures |= measured_peaks_gb()
    stated = re.findall(r"(\d+(?:\.\d+)?) GB(?!/s)", hardware)
    assert stated and set(stated) <= figures, set(stated) - figures
    assert f"{s['miner_compute_span_seconds']:.1f} s for training" in hardware
    assert f"GPU compresses the update, takes the outer step and copies the state file off for its save: " \
           f"{s['miner_gpu_overhead_seconds']:.1f} s" in " ".join(hardware.split())
    blocking = window_sizing(load_hparams().model_copy(update={"inner": load_hparams().inner.model_copy(
        update={"overlap": "blocking"})}))
    assert (f"{blocking['miner_compute_span_seconds']:.2f} s for training, "
            f"{blocking['miner_compute_span_min_seconds']:.2f} s when the gather runs to its deadline") in \
        " ".join(hardware.split())
    assert f"takes {s['h100_train_seconds']:.1f} s" in hardware
    assert f"{s['miner_sustained_tflops_needed']:.0f} TFLOP/s" in hardware
    sizing = section(text, 6)
    assert (f"{s['h100_train_seconds']:.1f} s: compute utilisation {s['miner_compute_utilisation']:.0%} "
            f"(training seconds over the window's {s['window_seconds']:.0f} s of wall-clock); it fills "
            f"{s['miner_span_share']:.0%} of the {s['miner_compute_span_seconds']:.1f} s") in sizing.replace(" %", "%")
    assert f"AdamW moments: {s['miner_state_file_gb']:.1f} GB)" in sizing
    assert (f"| {rows[0]['gpu_gb']:.1f} GB; {rows[1]['gpu_gb']:.1f} GB with `--memory.offload`; "
            f"{rows[2]['gpu_gb']:.1f} GB with it and `--memory.checkpoint_activations` | "
            f"{rows[-1]['gpu_gb']:.1f} GB |") in sizing
    for old in ("9.6 GB", "24.1 GB", "40.1 GB", "37.9", "at least 31.75 s", "TEMPLAR_ACTIVATION_CHECKPOINTING"):
        assert old not in text, old


def test_hparams_command_prints_the_figures(capsys):
    assert main(["hparams", "tiny"]) == 0
    out = capsys.readouterr().out
    assert "tokens per window per peer" in out and "1,024" in out and "H100 training time" in out
    assert "offload + checkpointing" in out and "--memory.offload --memory.checkpoint_activations" in out


def test_hparams_ranks_prints_the_table(capsys) -> None:
    assert main(["hparams", "tiny", "--ranks", "1", "8"]) == 0
    out = capsys.readouterr().out
    assert "| tiny |" in out and "| 8B | 8.03 B | 8 |" in out and "| 70B | 70.55 B | 1 |" in out
    assert main(["hparams", "tiny", "--ranks", "0"]) == 2


def test_the_leads_published_update_is_sized_by_the_runs_rule() -> None:
    """A SparseLoCo run's lead publishes the bundle of the top-G payloads it aggregated, a signed run's
    its packed signs: the bucket costs and the docs count what the rule writes (docs/buckets.md)."""
    from templar.core.model import build_model, parameter_shapes
    from templar.wire import max_aggregate_bytes, max_bundle_bytes

    production, signed = load_hparams(), load_hparams("tiny-signed")
    assert production.optimizer.method == "sparseloco"
    shapes = parameter_shapes(build_model(production, "meta"))
    assert window_sizing(production)["aggregate_upload_max_mb"] == max_bundle_bytes(shapes, production) / 1e6
    assert max_bundle_bytes(shapes, production) > production.gauntlet.top_g * 0.9 * window_sizing(production)[
        "gradient_upload_max_mb"] * 1e6
    assert window_sizing(signed)["aggregate_upload_max_mb"] == max_aggregate_bytes(
        parameter_shapes(build_model(signed, "meta"))) / 1e6
