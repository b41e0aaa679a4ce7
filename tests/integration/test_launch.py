"""docs/launch.md, run: every `bash rehearsal` block of the owner's launch runbook, in order, word for
word, against a SeaweedFS server and the embedded chain, until the subnet trains and pays.

The blocks use a small shell subset (see the page's conventions), run here by `Rehearsal`: `export`
and `$(...)` set variables, `templar ...` runs in this process (`templar.cli.main`, so each of the ~15
commands costs no interpreter start-up), `python ...` and anything ending in `&` run as processes
of their own, exactly as typed. The page's settings block is replaced by `settings()` (the page says
with what). The document cannot drift from the code: a command that stops working fails here.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from templar.core.config import REPO_ROOT

from .harness import MICRO_PRESET

DOC = REPO_ROOT / "docs" / "launch.md"
BLOCK = re.compile(r"^```bash (rehearsal(?:-settings)?)([^\n]*)\n(.*?)^```", re.M | re.S)
VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
REHEARSAL_WINDOWS = {"blocks_per_window": 20, "block_time": 0.5, "put_window_seconds": 2.0, "clock_skew_seconds": 1.0,
                     "gather_seconds": 2.5, "windows_per_weights": 1, "checkpoint_frequency": 4,
                     "peer_replacement_frequency": 1, "warmup_windows": 0, "max_allowed_stale": 4}
"""10 s windows: S3's LastModified has 1 s resolution, so the clock skew allowed is 1 s, and a miner
needs the put window, both skews, the gather and a window's computation inside one window."""
TEMPO = 20

pytestmark = [pytest.mark.slow(seconds=60), pytest.mark.timeout(400)]


@dataclass
class Block:
    kind: str
    options: dict[str, str]
    text: str


def blocks(doc: str) -> list[Block]:
    out = []
    for kind, options, text in BLOCK.findall(doc):
        opts = dict(item.partition("=")[::2] for item in options.split())
        out.append(Block(kind, opts, text))
    return out


def logical_lines(text: str) -> list[str]:
    """Lines of a block with `\\` continuations joined, blank lines and comment lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@dataclass
class Rehearsal:
    """Runs the page's blocks: a shell subset, strict (an unknown variable or command is an error)."""

    env: dict[str, str]
    transcript: list[tuple[str, int, str]] = field(default_factory=list)
    background: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)

    def expand(self, text: str) -> str:
        def value(match: re.Match) -> str:
            name = match.group(1) or match.group(2)
            if name not in self.env:
                raise AssertionError(f"the page uses ${name} before setting it")
            return self.env[name]

        return VARIABLE.sub(value, text)

    def run_block(self, block: Block) -> None:
        for line in logical_lines(block.text):
            self.run_line(line)

    def run_line(self, line: str) -> None:
        self.timings.append((line[:60], time.time()))
        if line.startswith("export "):
            name, _, value = line[len("export "):].partition("=")
            if value.startswith("$("):
                inner = value[2:value.rindex(")")]
                self.env[name] = self.command(inner).strip()
            else:
                words = shlex.split(self.expand(value), comments=True)
                self.env[name] = words[0] if words else ""
            return
        self.command(line)

    def command(self, line: str) -> str:
        words = shlex.split(self.expand(line), comments=True)
        background = words[-1] == "&"
        words = words[:-1] if background else words
        out_file = None
        if "2>&1" in words:
            words.remove("2>&1")
        if ">" in words:
            i = words.index(">")
            out_file, words = Path(words[i + 1]), words[:i] + words[i + 2:]
        if words[0] not in ("templar", "python"):
            raise AssertionError(f"the page may only run templar and python commands, not {words[0]!r}")
        if background:
            argv = ([sys.executable, "-m", "templar.cli", *words[1:]] if words[0] == "templar"
                    else [sys.executable, *words[1:]])
            log = open(out_file or os.devnull, "ab")  # noqa: SIM115 - owned by the child
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=REPO_ROOT,
                                    start_new_session=True)
            self.background.append((line, proc))
            return ""
        if words[0] == "python":
            done = subprocess.run([sys.executable, *words[1:]], env=self.env, cwd=REPO_ROOT, capture_output=True,
                                  text=True, timeout=300)
            code, out = done.returncode, done.stdout + done.stderr
        else:
            code, out, err = self.in_process(words[1:])
            out_and_err = out + err
        self.transcript.append((line, code, out))
        assert code == 0, f"`{line}` exited {code}:\n{(out_and_err if words[0] == 'templar' else out)[-4000:]}"
        return out if out_file is None else ""

    def in_process(self, argv: list[str]) -> tuple[int, str, str]:
        """`templar ARGV` in this process, with the rehearsal's environment; (exit code, stdout, stderr)."""
        from templar.cli import main
        from templar.core.log import setup_logging

        saved = dict(os.environ)
        stdout, stderr = io.StringIO(), io.StringIO()
        os.environ.clear()
        os.environ.update(self.env)
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = main(argv)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            setup_logging()  # a command may have configured this process's logging for itself
        return code, stdout.getvalue(), stderr.getvalue()

    def stop(self) -> dict[str, int | None]:
        for _, proc in self.background:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        codes = {}
        until = time.time() + 40
        for line, proc in self.background:
            try:
                codes[line] = proc.wait(timeout=max(0.1, until - time.time()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[line] = proc.wait()
        return codes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(tmp_path: Path, seaweed, prefix: str) -> dict[str, str]:
    """What replaces the page's settings block (the page lists these substitutions)."""
    base = tmp_path / "rehearsal-base.json"
    base.write_text(json.dumps({"base": str(MICRO_PRESET), "name": "micro-rehearsal", "windows": REHEARSAL_WINDOWS}))
    source = tmp_path / "source"
    source.mkdir()
    for name, documents in (("wiki.jsonl", 400), ("shakespeare.jsonl", 40)):  # ~460 kB, ~1,000 pages
        with open(REPO_ROOT / "assets" / "corpus" / name, encoding="utf-8") as f:
            (source / name).write_text("".join(line for _, line in zip(range(documents), f, strict=False)))
    for bucket in ("corpus", "lead", "miner1", "miner2"):
        seaweed.create_bucket(f"{prefix}-{bucket}")
    home = tmp_path / "home"
    return {
        "HOME": str(home), "REHEARSAL": str(tmp_path / "rehearsal"), "BT_NETWORK": "embedded",
        "BT_CHAIN_ENDPOINT": str(tmp_path / "rehearsal" / "chain.sqlite"), "BT_NETUID": "7",
        "BT_WALLET_PATH": str(tmp_path / "rehearsal" / "wallets"), "BLOCK_TIME": "0.5", "TEMPO": str(TEMPO),
        "BASE": str(base), "SOURCE": str(source), "TOKENIZER": "assets/tokenizer",
        "S3_ENDPOINT": seaweed.endpoint_url, "BUCKETS": prefix,
        "TEMPLAR_BUCKET_WRITE_KEY_ID": seaweed.admin.access_key_id,
        "TEMPLAR_BUCKET_WRITE_SECRET": seaweed.admin.secret_access_key,
        "TEMPLAR_BUCKET_READ_KEY_ID": seaweed.reader.access_key_id,
        "TEMPLAR_BUCKET_READ_SECRET": seaweed.reader.secret_access_key,
        "DASHBOARD_PORT": str(free_port()),
    }


def lead_records(rehearsal: Path, name: str) -> list[dict]:
    path = rehearsal / "lead" / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _summary(url: str) -> dict:
    """The dashboard's /api/summary (it loads the chain in the background: the first answers may
    carry no snapshot yet)."""
    with urllib.request.urlopen(url, timeout=20) as resp:
        return json.loads(resp.read())


def _trained(rehearsal: Path) -> bool:
    """The lead has applied two outer steps and the chain took weights on both miners (set twice)."""
    windows = lead_records(rehearsal, "validator_windows.jsonl")
    sets = [r for r in lead_records(rehearsal, "weights.jsonl") if r["outcome"] == "set" and r["uids"] >= 2]
    return bool(windows) and windows[-1]["global_step"] >= 2 and len(sets) >= 1


def _paid(env: dict[str, str]) -> bool:
    """Both miners hold incentive on chain (an epoch ran after the weights)."""
    from templar.chain import connect

    with connect(network="embedded", chain_endpoint=env["BT_CHAIN_ENDPOINT"], netuid=int(env["BT_NETUID"]),
                 wallet_name=None) as chain:
        neurons = chain.metagraph()
    return sum(n.incentive > 0 for n in neurons if not n.validator_permit) >= 2


def wait_for(what: str, condition, deadline: float, procs: list) -> None:
    while not condition():
        dead = [line for line, p in procs if p.poll() is not None]
        assert not dead, f"exited while waiting for {what}: {dead}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_the_launch_runbook_runs_and_the_subnet_trains_and_pays(tmp_path, seaweed, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    page = blocks(DOC.read_text())
    assert [b.kind for b in page][:1] == ["rehearsal-settings"] and len(page) >= 8, [b.kind for b in page]
    base_env = {k: v for k, v in os.environ.items() if not k.startswith(("BT_", "TEMPLAR_"))}
    ours = settings(tmp_path, seaweed, f"launch{os.getpid()}")
    documented = {line.split("=")[0].removeprefix("export ") for line in logical_lines(page[0].text)}
    assert documented == set(ours) - {"HOME"}, "the test substitutes exactly the page's settings"
    run = Rehearsal(env={**base_env, **ours, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    rehearsal = Path(ours["REHEARSAL"])
    started = time.time()
    try:
        for block in page[1:]:
            if "after-training" in block.options:  # the page's "after a few windows"
                deadline = time.time() + 240
                wait_for("outer steps and weights on chain", lambda: _trained(rehearsal), deadline, run.background)
                wait_for("an epoch paying both miners", lambda: _paid(ours), deadline, run.background)
            run.run_block(block)
        summary_url = f"http://127.0.0.1:{ours['DASHBOARD_PORT']}/api/summary"
        wait_for("the dashboard's first chain snapshot", lambda: _summary(summary_url)["chain"]["block"] is not None,
                 time.time() + 60, run.background)
        summary = _summary(summary_url)
    finally:
        codes = run.stop()
    elapsed = time.time() - started
    print(f"rehearsal: {elapsed:.0f}s, {len(run.transcript)} commands")
    for (line, at), (_, after) in zip(run.timings, [*run.timings[1:], ("", started + elapsed)], strict=True):
        print(f"  {after - at:6.1f}s  {line}")

    for line, code in codes.items():  # each neuron finishes its window, saves and exits 0
        assert code == 0 or not line.startswith("python"), f"`{line}` exited {code} on SIGTERM"
    doctors = [out for line, _, out in run.transcript if line.startswith("templar doctor")]
    assert len(doctors) == 3 and all("failed" not in out for out in doctors), doctors
    chain = json.loads(run.transcript[-1][2])
    uids = {n["hotkey"]: n["uid"] for n in chain["neurons"]}
    wallets = Path(ours["BT_WALLET_PATH"])
    miners = [uids[json.loads((wallets / m / "hotkeys" / "default").read_text())["ss58Address"]]
              for m in ("miner1", "miner2")]
    lead = next(n["uid"] for n in chain["neurons"] if n["validator_permit"] and n["stake"] > 0)
    weights = chain["weights"][str(lead)]
    for uid in miners:
        assert weights.get(str(uid), 0) > 0, chain["weights"]
        assert chain["neurons"][uid]["incentive"] > 0, chain["neurons"]
    losses = [r["holdout_loss"] for r in lead_records(rehearsal, "validator_windows.jsonl")]
    steps = [r["global_step"] for r in lead_records(rehearsal, "validator_windows.jsonl")]
    assert steps[-1] >= 1 and losses[-1] < losses[0], list(zip(steps, losses, strict=True))
    assert summary["chain"]["lead"] and summary["chain"]["lead"]["uid"] == lead, summary
