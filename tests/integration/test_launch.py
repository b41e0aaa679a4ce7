"""docs/launch.md, run as written: every `bash rehearsal` block of the owner's launch runbook, in
order, in one fresh bash, until the subnet trains, pays and stops.

The shell is what a new user has after the README's bootstrap: `bash` at the repository's root
with a `HOME` of its own, the system `PATH` and none of this process's settings. The page activates
the virtual environment, sets everything else, starts its own S3 server and runs every command as
typed (each block is written to a file and sourced, so a command reads no script from stdin). The
test contributes only what the page says it may take from the environment (`S3_PORT`,
`DASHBOARD_PORT`: free ports, so that it can run next to other tests) and what makes this checkout
run at all: where its virtual environment is (`TEMPLAR_VENV`) and which source tree it imports
(`PYTHONPATH`, in a git worktree), the suite's thread and allocator settings, and offline flags.
`set -e` is on: a command that fails stops the shell and fails the test with the block's output.

Before the block marked `after-training` the test waits, as a reader would, until the lead has
applied an outer step and set weights on both miners, and an epoch has paid them. The figures
the page states (the sample corpus's pages, the pages that keep assignments apart) are checked
against what the commands print and the function that computes them.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from templar.core.config import REPO_ROOT, load_hparams
from templar.data.plan import disjoint_assignment_pages
from templar.storage.seaweed import stop_recorded

DOC = REPO_ROOT / "docs" / "launch.md"
BLOCK = re.compile(r"^```bash (rehearsal)([^\n]*)\n(.*?)^```", re.M | re.S)
PASSED_THROUGH = ("TEMPLAR_VENV", "PYTHONPATH", "OMP_NUM_THREADS", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                  "MALLOC_TOP_PAD_", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "TMPDIR")
"""What this checkout needs from the test's environment (see the module docstring); nothing else."""

pytestmark = [pytest.mark.slow(seconds=80, waits=True), pytest.mark.timeout(400)]


@dataclass
class Block:
    options: list[str]
    text: str


def blocks(doc: str) -> list[Block]:
    return [Block(options.split(), text) for _, options, text in BLOCK.findall(doc)]


class Shell:
    """One `bash` fed the page's blocks; each block's output, and the jobs running after it."""

    def __init__(self, env: dict[str, str], scratch: Path):
        self.scratch = scratch
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT,
                                     text=True, bufsize=1, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.transcript: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.jobs: list[int] = []
        self.count = 0
        self._send("set -e -o pipefail")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def run(self, block: Block, timeout: float = 180) -> str:
        """Run one block (sourced from a file: commands read no stdin); its output."""
        self.count += 1
        script = self.scratch / f"block{self.count:02d}.sh"
        script.write_text(block.text)
        marker = f"__block_{self.count}_done__"
        self._send(f". {script} < /dev/null\necho {marker} $(jobs -p)")
        out: list[str] = []
        deadline = time.time() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.time()))
            except queue.Empty:
                raise AssertionError(f"block {self.count} still running after {timeout:.0f}s:\n{block.text}\n"
                                     + "\n".join(out[-60:])) from None
            if line is None:
                code = self.proc.wait()
                raise AssertionError(f"the shell stopped (exit {code}) in block {self.count}:\n{block.text}\n"
                                     + "\n".join(out[-80:]))
            self.transcript.append(line)
            if line.startswith(marker):
                self.jobs = [int(p) for p in line.split()[1:]]
                return "\n".join(out)
            out.append(line)

    def dead_jobs(self) -> list[str]:
        """The page's background processes that have exited (bash reaps them as they end)."""
        dead = []
        for pid in self.jobs:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rpartition(") ")[2][:1]
            except OSError:
                state = "X"
            if state in ("Z", "X"):
                dead.append(str(pid))
        return dead

    def kill(self) -> None:
        """Everything the shell started, at once (a failed test's teardown)."""
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def free_port(avoid: int | None = None) -> int:
    """A free port p with p + 10000 free too (`templar s3 start` also binds that, for gRPC).

    Drawn below the kernel's ephemeral range (32768 and up): the page starts its servers a minute
    after this choice, and a port from that range can meanwhile become the local end of any
    process's outgoing connection or another worker's `bind(0)`. `avoid`: a pair already chosen.
    """
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(12000, 22768)
        if avoid is not None and {port, port + 10000} & {avoid, avoid + 10000}:
            continue
        free = True
        for p in (port, port + 10000):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    free = False
        if free:
            return port
    raise AssertionError("no free port pair")


def records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _trained(rehearsal: Path) -> bool:
    """The lead has applied an outer step and the chain took its weights on both miners."""
    windows = records(rehearsal / "lead" / "validator_windows.jsonl")
    sets = [r for r in records(rehearsal / "lead" / "weights.jsonl") if r["outcome"] == "set" and r["uids"] >= 2]
    return bool(windows) and windows[-1]["global_step"] >= 1 and len(sets) >= 1


def _paid(chain_file: Path, netuid: int) -> bool:
    """Both miners hold incentive on chain (an epoch ran after the weights)."""
    from templar.chain import connect, is_miner

    with connect(network="embedded", chain_endpoint=str(chain_file), netuid=netuid, wallet_name=None) as chain:
        neurons = chain.metagraph()
    return sum(n.incentive > 0 for n in neurons if is_miner(n)) >= 2


def _summary(url: str) -> dict:
    """The dashboard's /api/summary (its first answers may carry no chain snapshot yet)."""
    with urllib.request.urlopen(url, timeout=20) as resp:
        return json.loads(resp.read())


def wait_for(what: str, condition, deadline: float, shell: Shell) -> None:
    while not condition():
        dead = shell.dead_jobs()
        assert not dead, f"a process of the page exited while waiting for {what}: pids {dead}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def page_settings(page: list[Block]) -> dict[str, str]:
    """`export NAME=VALUE` lines of the page (values as written, unexpanded)."""
    out = {}
    for block in page:
        for line in block.text.splitlines():
            if m := re.match(r"export ([A-Z0-9_]+)=(\S*)", line):
                out[m.group(1)] = m.group(2)
    return out


def test_the_launch_runbook_runs_as_written_and_the_subnet_trains_and_pays(tmp_path):
    page = blocks(DOC.read_text())
    assert len(page) >= 9 and sum("after-training" in b.options for b in page) == 1, [b.options for b in page]
    settings = page_settings(page)
    # the page's own settings: the only ones a test may give are those the page takes from the environment
    assert settings["S3_PORT"] == "${S3_PORT:-8333}" and settings["DASHBOARD_PORT"] == "${DASHBOARD_PORT:-8787}"
    assert not [v for k, v in settings.items() if "${" in v and k not in ("S3_PORT", "DASHBOARD_PORT")], settings
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb",
           "S3_PORT": str(s3_port := free_port()), "DASHBOARD_PORT": str(free_port(avoid=s3_port)),
           **{k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}}
    rehearsal = home / "templar-rehearsal"
    netuid = int(settings["BT_NETUID"])
    summary_url = f"http://127.0.0.1:{env['DASHBOARD_PORT']}/api/summary"
    shell = Shell(env, tmp_path)
    outputs: list[str] = []
    started = time.time()
    timings = []
    try:
        for block in page:
            if "after-training" in block.options:  # the page's "after a few windows"
                deadline = time.time() + 240
                wait_for("outer steps and weights on chain", lambda: _trained(rehearsal), deadline, shell)
                wait_for("an epoch paying both miners", lambda: _paid(rehearsal / "chain.sqlite", netuid),
                         deadline, shell)
                timings.append(("(waiting for training and pay)", time.time()))
                outputs.append(shell.run(block))
                wait_for("the dashboard's first chain snapshot",
                         lambda: _summary(summary_url)["chain"]["block"] is not None, time.time() + 60, shell)
                summary = _summary(summary_url)
            else:
                timings.append((block.text.strip().splitlines()[0][:70], time.time()))
                outputs.append(shell.run(block))
        assert shell.proc.poll() is None
    finally:
        shell.kill()
        stop_recorded(rehearsal / "s3", timeout=2)  # the page's §9 stops it; a failed run leaves it to us
    elapsed = time.time() - started
    print(f"rehearsal: {elapsed:.0f}s")
    for (line, at), (_, after) in zip(timings, [*timings[1:], ("", started + elapsed)], strict=True):
        print(f"  {after - at:6.1f}s  {line}")

    text = "\n".join(outputs)
    # the doctors passed (no `failed` line), and the figures the page states are what the commands print
    doctors = re.findall(r"^\d+ ok.*$", text, re.M)  # each doctor's last line: "N ok, M warning(s)…"
    assert len(doctors) == 3 and not re.search(r"^failed ", text, re.M) and "failed" not in "".join(doctors), text
    assert "976 pages of 512 tokens" in text and "warning:" not in text, text
    hp = load_hparams(REPO_ROOT / "hparams" / f"{settings['BASE']}.json")
    assert disjoint_assignment_pages(hp.data.pages_per_window, hp.data.holdout_fraction) == 522
    assert '"base"' not in (rehearsal / "run.json").read_text() and str(REPO_ROOT) not in (rehearsal / "run.json").read_text()

    chain = json.loads(outputs[next(i for i, b in enumerate(page) if "after-training" in b.options)])
    uids = {n["hotkey"]: n["uid"] for n in chain["neurons"]}
    wallets = rehearsal / "wallets"
    miners = [uids[json.loads((wallets / m / "hotkeys" / "default").read_text())["ss58Address"]]
              for m in ("miner1", "miner2")]
    lead = next(n["uid"] for n in chain["neurons"] if n["role"] == "validator")  # its commitment says so
    assert [n["validator_permit"] and n["stake"] > 0 for n in chain["neurons"] if n["uid"] == lead] == [True]
    weights = chain["weights"][str(lead)]
    for uid in miners:
        assert weights.get(str(uid), 0) > 0, chain["weights"]
        assert chain["neurons"][uid]["incentive"] > 0, chain["neurons"]
    windows = records(rehearsal / "lead" / "validator_windows.jsonl")
    losses = [r["holdout_loss"] for r in windows]
    assert windows[-1]["global_step"] >= 1 and losses[-1] < losses[0], [(r["global_step"], r["holdout_loss"])
                                                                        for r in windows]
    assert summary["chain"]["lead"] and summary["chain"]["lead"]["uid"] == lead, summary
    # §9: every neuron finished its window, saved and exited 0 (the stop block's `wait`s returned 0)
    for log, line in (("lead.log", "validator stopped cleanly"), ("miner1.log", "miner stopped cleanly"),
                      ("miner2.log", "miner stopped cleanly")):
        assert line in (rehearsal / log).read_text(), (rehearsal / log).read_text()[-3000:]
    for miner in ("miner1", "miner2"):  # stopped before the lead: their last window was a whole one
        assert records(rehearsal / miner / "miner_windows.jsonl")[-1]["phase"] == "active"
