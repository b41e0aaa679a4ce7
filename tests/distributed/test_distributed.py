"""A node over 2 ranks (torchrun, gloo on CPU) against the 1-process node on the same pages.

Each test launches `torch.distributed.run` the way an operator does; `worker.py` holds what the
ranks run. A launch costs each rank its interpreter, torch and transformers (about 5 s of CPU), so
the 2-rank checks under both rules share one launch: one launch for 2 ranks, one for 1 rank.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow(seconds=20)

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("worker.py")


def torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            str(WORKER), *args]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    return e


def run(cmd: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.slow(seconds=15)
def test_one_rank_node_equals_one_process(tmp_path: Path) -> None:
    """torchrun with a single rank: the sharded code path against the 1-process node (`equality`)."""
    done = run(torchrun(1, "equality", str(tmp_path)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    _equals_one_process(tmp_path / "equality", 1)


def _equals_one_process(out: Path, ranks: int) -> None:
    """The sharded node against the 1-process one under the paper's signed rule (`equality`): every
    window's loss, gradient, payload, probes and outer step, the validator's and catch-up's ops, the
    memory settings over the ranks and, over 2 ranks, a hung rank."""
    report = json.loads((out / "result.json").read_text())
    assert report["world_size"] == ranks
    for row in report["windows"]:
        assert row["loss"] == pytest.approx(row["ref_loss"], abs=1e-5), row
        assert row["grad_max_rel"] < 1e-4, row                       # float tolerance only
        assert row["same_coefficients_same_grad"], row               # DeMo split across ranks == 1 process
        assert row["payload_identical_same_grad"], row               # the same wire payload
        assert row["indices_agree_vs_1process_training"] > 0.99, row  # near-ties may flip on rounding
        assert row["probes_equal"], row
        assert row["theta_bit_identical"], row                       # the outer step, bit for bit
        assert row["global_step"][0] == row["global_step"][1] and row["peers"] == [3, 3], row
    assert report["loss_score_max_diff"] < 1e-5 and report["loss_score_delta"] != 0.0, report
    assert report["page_deltas_max_diff"] < 1e-5, report  # page-by-page δs over the ranks, too
    assert report["theta_restored_after_eval"]
    assert report["checkpointed_grads_equal"]
    assert report["reload_equal"] and report["reload_state"] == [2, 3]
    assert report["one_process_loads"] and report["loads_one_process_file"]
    # rank 0 driving NodeCompute, the others following: checkpoints, catch-up, evaluation, lead's signs
    assert report["bad_checkpoint_refused"] and report["driver_signs_equal"], report
    assert report["driver_theta_bit_identical"] and report["driver_global_step"] == [4, 4], report
    assert report["driver_eval_diff"] < 1e-5, report
    assert report["driver_score_diff"] < 1e-5 and report["driver_page_deltas"] == 2, report
    assert report["driver_fingerprint_equal"] and report["driver_reset_to_theta0"], report
    # --memory.offload --memory.checkpoint_activations over the ranks: the default's results, bit for bit
    assert report["memory_payloads_identical"] and report["memory_theta_identical"], report
    assert report["memory_state_identical"] and report["memory_theta_moved"], report
    for rank in range(1, ranks):  # the followers ran with rank 0's settings, streaming their own shards
        default, offloaded = (json.loads((out / f"memory_rank{rank}_{i}.json").read_text()) for i in (0, 1))
        assert not default["offload"] and not default["streamed_moments"] and not default["checkpointing"]
        assert all(offloaded.values()), offloaded
    if ranks > 1:  # a rank that hangs: one clear error on the others, within the collective timeout
        hang = report["hang"]
        assert hang is not None and hang["seconds"] < 5 and "barrier failed" in hang["error"], hang


def _sparse_equals(report: dict) -> None:
    """Production's outer rule, SparseLoCo (`tiny-sparseloco`'s rules on the micro model), over 2 ranks: the sharded compressor's
    update and wire payload are the 1-process one's for the same gradient, and the outer step, whose
    clip uses each peer's whole-payload norm, is bit-identical, the last window's under a lead's ceiling on
    the clip level (the signed rule's case is above); and
    a sharded validator's LossScores of SparseLoCo's trial steps are the 1-process ones, also with each
    unit's own baseline (the groups' common steps, and the other peers' own steps)."""
    assert report["world_size"] == 2 and len(report["windows"]) == 3
    for row in report["windows"]:
        assert row["same_coefficients_same_grad"] and row["payload_identical_same_grad"], row
        assert row["theta_bit_identical"] and row["global_step"][0] == row["global_step"][1], row
    assert [row["clip_norm"] is not None for row in report["windows"]] == [False, False, True]  # and the lead's ceiling
    # a sharded validator applies SparseLoCo's trial steps whole (cast to int8, they were all zeros
    # and every LossScore read 0): its LossScores are the 1-process ones up to summation order
    assert report["loss_score_delta_rand"] != 0.0
    assert report["loss_score_max_diff"] < 1e-5, report
    # and the proof's common steps (a mean of trial steps) too: the baselined units are the 1-process ones
    assert report["baselined_units_moved"] > 1e-6
    assert report["baselined_units_max_diff"] < 1e-5, report
    # and under the other peers' own steps (every peer's step over every unit): as on one process
    assert report["others_units_moved"] > 1e-6
    assert report["others_units_max_diff"] < 1e-5, report


@pytest.mark.slow(seconds=30)
def test_the_two_rank_node_equals_one_process_under_both_rules(tmp_path: Path) -> None:
    """The 2-rank checks in one launch: the sharded node against the 1-process one under production's
    SparseLoCo (`_sparse_equals`) and the paper's signed rule (`_equals_one_process`). kill -9 of one
    rank and the restart's exact resume are the real miner's, under torchrun
    (tests/integration/test_miner.py, `test_killed_miner_resumes_without_double_or_missed_updates[2-ranks]`,
    which compares the resumed node with a 1-process miner that never stopped)."""
    done = run(torchrun(2, "sparse,equality", str(tmp_path)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    _sparse_equals(json.loads((tmp_path / "sparse" / "result.json").read_text()))
    _equals_one_process(tmp_path / "equality", 2)
