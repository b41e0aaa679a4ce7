"""The lead's process killed -9 on a real localnet (one OS process per neuron, real time, `tiny`'s Gauntlet
and outer rule with 2 inner AdamW steps on the micro model and the 1024-token corpus,
tests/presets/micro-gauntlet-1k.json): the next validator of the succession leads within the window, every node says so,
the run loses no window's outer step and forks no one, and the lead, started again, follows what was
published without it and leads again."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from templar.localnet.forkserver import ForkedProcess
from templar.localnet.runner import Localnet, LocalnetConfig
from templar.runtime.records import MINER_WINDOWS_FILE, VALIDATOR_WINDOWS_FILE, read_records

from .harness import MICRO_GAUNTLET_1K_PRESET

pytestmark = [pytest.mark.slow(seconds=95, waits=True), pytest.mark.timeout(600)]


def _records(out: Path, name: str, file: str) -> list[dict]:
    path = out / "nodes" / name / file
    return list(read_records(path)) if path.exists() else []


def _log(out: Path, name: str) -> str:
    path = out / "nodes" / name / "node.log"
    return path.read_text() if path.exists() else ""


def _until(what, seconds: float) -> None:
    deadline = time.time() + seconds
    while not what():
        assert time.time() < deadline, f"timed out waiting for {what.__doc__}"
        time.sleep(0.5)


def test_the_lead_process_killed_9_hands_over_to_the_next_validator(tmp_path):
    preset = tmp_path / "failover.json"
    # 14-second windows: the gather ends 5.25 s after a window (put 2 s, skew 1 s, gather 2 s); slot 0
    # closes 1 s later and settles 1.25 s after that, so with the lead dead slot 1's inputs are out 7.5 s
    # after the window: a miner still trains and commits the next one by its deadline (12 s). The
    # succession's order resumes every 2 windows, so the lead, back, takes its slot within two.
    preset.write_text(json.dumps({"base": str(MICRO_GAUNTLET_1K_PRESET), "name": "micro-failover",
                                  "windows": {"blocks_per_window": 14, "put_window_seconds": 2.0, "gather_seconds": 2.0,
                                              "handover_seconds": 1.0, "handover_settle_seconds": 0.25,
                                              "lead_cadence": 2}}))
    out = tmp_path / "net"
    net = Localnet(LocalnetConfig(out=out, miners=2, validators=2, windows=1000, hparams=str(preset),
                                  adversaries=[], live=False))
    net.prepare()
    uid = {n.name: n.uid for n in net.nodes}
    net.start()
    # one-process neurons are forks of the fork server (templar/localnet/forkserver.py): kill -9 of one, and
    # starting it again, are the same to the run as for a process started by exec
    assert all(isinstance(proc, ForkedProcess) for proc in net.procs.values()), net.procs
    try:
        def lead_named_peers() -> bool:
            """the lead to have run two windows (the second names the peers the next one aggregates)"""
            return len(_records(out, "validator0", VALIDATOR_WINDOWS_FILE)) >= 2

        _until(lead_named_peers, 240)
        assert net.kill("validator0") == -signal.SIGKILL
        killed_after = max(r["window"] for r in _records(out, "validator0", VALIDATOR_WINDOWS_FILE))

        def successor_led() -> bool:
            """validator1 to lead a window"""
            return f"is led by uid {uid['validator1']} " in _log(out, "miner0")

        _until(successor_led, 120)
        net.spawn("validator0")  # back while validator1 leads: it catches up, then takes its slot again

        def lead_back() -> bool:
            """the lead, started again, to lead a window (the last [LEAD] line a miner said names it)"""
            said = [line for line in _log(out, "miner0").splitlines() if "[LEAD] window" in line]
            return bool(said) and f"is led by uid {uid['validator0']} " in said[-1]

        _until(lead_back, 150)
        back_at = max(r["window"] for r in _records(out, "validator1", VALIDATOR_WINDOWS_FILE))

        def one_more() -> bool:
            """validator1 to record a window after the lead's return"""
            return max(r["window"] for r in _records(out, "validator1", VALIDATOR_WINDOWS_FILE)) > back_at

        _until(one_more, 60)
    finally:
        codes = net.stop()
    assert set(codes.values()) <= {0}, codes
    handed = f"is led by uid {uid['validator1']} "
    for name in ("validator1", "miner0", "miner1"):  # every node says who leads instead, and why
        lines = [line for line in _log(out, name).splitlines() if "[LEAD]" in line and handed in line]
        assert lines and f"uid {uid['validator0']} (slot 0): not published by its deadline" in lines[0], (name, lines)
    for name in ("validator0", "validator1", "miner0", "miner1"):
        assert "differs from the run's" not in _log(out, name), name  # every fingerprint check agreed
    for name, file in (("validator0", VALIDATOR_WINDOWS_FILE), ("validator1", VALIDATOR_WINDOWS_FILE),
                       ("miner0", MINER_WINDOWS_FILE), ("miner1", MINER_WINDOWS_FILE)):
        windows = [r["window"] for r in _records(out, name, file)]
        assert windows == sorted(set(windows)), (name, windows)  # no window applied twice
    steps = {r["window"]: r["global_step"] for r in _records(out, "validator1", VALIDATOR_WINDOWS_FILE)}
    after = [w for w in sorted(steps) if w > killed_after and w - 1 in steps]
    lost = [w for w in after if steps[w] == steps[w - 1]]
    assert len(after) >= 2 and len(lost) <= 1, (killed_after, steps, lost)  # at most one window without a step
