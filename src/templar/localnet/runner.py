"""Start an embedded chain, wallets, buckets and one OS process per neuron; stop them; report.

Every neuron runs through its real entry point (`neurons/miner.py`, `neurons/validator.py`) with
the same flags an operator would type, so the localnet exercises exactly the production code. A
one-process neuron is forked from a fork server that has loaded its libraries once
(`templar.localnet.forkserver`); torchrun's nodes, and every neuron with `fork_server=False`, start by exec.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from loguru import logger
from rich.console import Console
from rich.live import Live

from templar.chain.devchain import create_dev_chain
from templar.core.atomic import atomic_write
from templar.core.clock import Now
from templar.core.config import REPO_ROOT, load_hparams, resolve_asset, resolve_hparams_path
from templar.data.manifest import MANIFEST_KEY, parse_manifest
from templar.localnet.behaviours import GROUP_SIZES, LOCALNET_BEHAVIOURS, declared_extra_pages
from templar.localnet.forkserver import ForkedProcess, ForkServer, forkable
from templar.localnet.live import live_table
from templar.localnet.report import build_report
from templar.runtime.records import VALIDATOR_WINDOWS_FILE, read_records
from templar.runtime.roster import (
    CHAIN_FILE,
    NETUID,
    NODES_FILE,
    NodeInfo,
    lead_validator,
    read_nodes,
    write_nodes,
)
from templar.validator.files import SECRET_BYTES, SECRET_FILE

WALLET = "localnet"
LEAD_STAKE = 10_000.0
VALIDATOR_STAKE = 1_000.0
DEFAULT_ADVERSARIES = ("copycat", "scaled", "lazy")


@dataclass
class LocalnetConfig:
    out: Path
    miners: int = 4
    validators: int = 1
    windows: int = 12
    hparams: str = "tiny"
    adversaries: list[tuple[str, int]] = field(default_factory=lambda: [(a, 1) for a in DEFAULT_ADVERSARIES])
    storage: str = "local"
    seed: int = 0
    resume: bool = False
    live: bool = True
    in_process: bool = False
    """All neurons in this process on virtual time (`templar.localnet.inprocess`)."""
    dashboard: int | None = None
    """Port of the dashboard on 127.0.0.1 (None: none; served by `run_localnet`'s `start_dashboard`)."""
    miner_ranks: int = 1
    """Honest miner0 runs as one node over this many torchrun ranks (FSDP2, gloo on CPU; docs/mining.md §12)."""
    validator_ranks: int = 1
    """The lead, validator0, runs over this many torchrun ranks."""
    plots: bool = True
    """Draw the report's plots (loss.png, weights.png, ratings.png); a test that reads only report.json
    skips them (about 0.5 s of CPU a run)."""
    fork_server: bool = True
    """Fork one-process neurons from an interpreter that has loaded torch, transformers and the SDK
    once (`templar.localnet.forkserver`; Linux), instead of each loading them (4-5 s of CPU each)."""
    newcomers: list[int] = field(default_factory=list)
    """One honest miner per entry, `newcomer<i>`, that registers its hotkey and starts once the lead has
    scored that many windows (`--newcomer W`): a miner joining a running subnet, as on finney, where the
    others' error feedback, ratings and pay are already grown. Until then it is not on the chain."""


def parse_adversary(spec: str) -> tuple[str, int]:
    """`NAME[:COUNT]` → (name, count)."""
    name, _, count = spec.partition(":")
    if name not in LOCALNET_BEHAVIOURS:
        raise ValueError(f"unknown adversary {name!r}; choose from {', '.join(sorted(LOCALNET_BEHAVIOURS))}")
    n = int(count) if count else 1
    if n < 1:
        raise ValueError(f"adversary count must be >= 1 in {spec!r}")
    return name, n


def plan_newcomers(cfg: LocalnetConfig) -> list[tuple[str, int]]:
    """(name, the lead's scored windows before it joins) for every newcomer, in join order."""
    if any(after < 0 for after in cfg.newcomers):
        raise ValueError(f"a newcomer joins after 0 or more scored windows, not {min(cfg.newcomers)}")
    return [(f"newcomer{i}", after) for i, after in enumerate(sorted(cfg.newcomers))]


def is_adversary(node: NodeInfo) -> bool:
    """Started through the adversary entry point rather than the production miner's."""
    return node.role == "miner" and node.strategy not in ("honest", "moredata")


def plan_nodes(cfg: LocalnetConfig) -> list[tuple[str, str, str, float]]:
    """(name, role, strategy, stake) for every neuron, validators first (lowest uids)."""
    nodes: list[tuple[str, str, str, float]] = []
    for i in range(cfg.validators):
        nodes.append((f"validator{i}", "validator", "lead" if i == 0 else "validator",
                      LEAD_STAKE if i == 0 else VALIDATOR_STAKE / (i + 1)))
    for i in range(cfg.miners):
        nodes.append((f"miner{i}", "miner", "honest", 0.0))
    for name, count in cfg.adversaries:
        for i in range(count):
            if name == "duplicate":
                nodes.append((f"dup{i}-twin", "miner", "honest", 0.0))
            if name in GROUP_SIZES:  # one operator's group of hotkeys
                nodes += [(f"{name}{i}-{j}", "miner", name, 0.0) for j in range(GROUP_SIZES[name])]
                continue
            nodes.append((f"{name}{i}", "miner", name, 0.0))
    return nodes


class Localnet:
    def __init__(self, cfg: LocalnetConfig):
        self.cfg = cfg
        self.out = cfg.out.resolve()
        self.hparams = cfg.hparams
        self.hp = load_hparams(cfg.hparams)
        self.procs: dict[str, subprocess.Popen | ForkedProcess] = {}
        self.fork_server: ForkServer | None = None
        self.nodes: list[NodeInfo] = []
        self.resumed_after = -1  # the last window the lead scored before a --resume
        self.s3 = None

    # ---------------------------------------------------------------- set-up
    def prepare(self) -> None:
        if self.out.exists() and not self.cfg.resume:
            shutil.rmtree(self.out)
        self.out.mkdir(parents=True, exist_ok=True)
        if self.cfg.seed:
            # Another seed is another run: other initial weights and another data assignment.
            preset = self.out / "hparams.json"
            preset.write_text(json.dumps({
                "base": str(resolve_hparams_path(self.cfg.hparams).resolve()), "name": f"{self.hp.name}-seed{self.cfg.seed}",
                "model": {"init_seed": self.cfg.seed}, "data": {"data_seed": self.cfg.seed}}, indent=2))
            self.hparams = str(preset)
            self.hp = load_hparams(preset)
        planned = plan_nodes(self.cfg)
        chain_path = self.out / CHAIN_FILE
        if self.cfg.resume and (self.out / NODES_FILE).exists():
            self.nodes = read_nodes(self.out)
            self.resumed_after = max(self._lead_windows(), default=-1)
            return
        logger.info(f"creating embedded chain with {len(planned)} hotkeys in {chain_path}")
        self.nodes = self._register(planned, time.time)
        for node in self.nodes:
            if node.role == "validator":
                secret = hashlib.blake2b(node.name.encode(), key=self.run_seed(), digest_size=SECRET_BYTES).digest()
                atomic_write(node.directory(self.out) / SECRET_FILE, secret, mode=0o600)
        write_nodes(self.out, self.nodes)

    def _register(self, planned: list[tuple[str, str, str, float]], now: Now) -> list[NodeInfo]:
        """Register (name, role, strategy, stake) on the run's embedded chain, creating it first if need be;
        the hotkeys are derived from the run's seed. `now`: the chain's clock (virtual in-process)."""
        hp = self.hp.windows
        dev = create_dev_chain(
            self.out / CHAIN_FILE, netuid=NETUID, block_time=hp.block_time, wallet_path=self.out / "wallets",
            wallet_name=WALLET, hotkeys={name: stake for name, _, _, stake in planned},
            weights_rate_limit=max(1, hp.blocks_per_window * hp.windows_per_weights // 2),
            key_seed=self.run_seed(), now=now)
        return [NodeInfo(name=name, hotkey=dev.wallets[name].hotkey, uid=dev.wallets[name].uid, role=role,
                         strategy=strategy, stake=stake) for name, role, strategy, stake in planned]

    def pending_newcomers(self) -> list[tuple[str, int]]:
        """Newcomers not yet on the chain (`plan_newcomers`): with `--resume`, those that had not joined."""
        joined = {n.name for n in self.nodes}
        return [(name, after) for name, after in plan_newcomers(self.cfg) if name not in joined]

    def due_newcomers(self) -> list[str]:
        """Pending newcomers whose time has come: the lead has scored their windows."""
        done = self.windows_done()
        return [name for name, after in self.pending_newcomers() if done >= after]

    def join(self, name: str, now: Now = time.time) -> NodeInfo:
        """Register the newcomer `name` (an honest miner) now and add it to the roster (nodes.json), so the
        report and the dashboard see it from its first window; the caller starts it."""
        node = self._register([(name, "miner", "honest", 0.0)], now)[0]
        self.nodes.append(node)
        write_nodes(self.out, self.nodes)
        logger.info(f"{name} registers as uid {node.uid} after {self.windows_done()} scored windows and starts")
        return node

    def run_seed(self) -> bytes:
        """Everything a localnet would otherwise draw from the OS (hotkeys, each validator's
        evaluation secret) comes from `--seed`: the same seed, nodes and code give the same run
        (on virtual time, `--in-process`, bit for bit)."""
        return f"templar-localnet/{self.cfg.seed}".encode()

    def _bucket_args(self, node: NodeInfo) -> tuple[list[str], dict[str, str]]:
        if self.cfg.storage == "local":
            path = self.out / "buckets" / node.name
            path.mkdir(parents=True, exist_ok=True)
            return ["--bucket.locator", f"local:{path}"], {}
        assert self.s3 is not None
        bucket = f"tpl-{node.name.replace('_', '-')}".lower()
        read_locator, write_env = self.s3.node_bucket(bucket)
        return ["--bucket.locator", read_locator], write_env

    def node_flags(self, node: NodeInfo, bucket_args: list[str]) -> list[str]:
        """The node flags an operator would type for this neuron."""
        node_dir = node.directory(self.out)
        node_dir.mkdir(parents=True, exist_ok=True)
        flags = ["--wallet.name", WALLET, "--wallet.hotkey", node.name,
                 "--wallet.path", str(self.out / "wallets"), "--netuid", str(NETUID),
                 "--subtensor.network", "embedded", "--subtensor.chain_endpoint", str(self.out / CHAIN_FILE),
                 "--hparams", self.hparams, "--device", "cpu", "--state.dir", str(node_dir),
                 "--logging.file", str(node_dir / "node.log"), *bucket_args]
        if node.role == "validator":  # a localnet keeps every evaluation's units: the simulator's fit reads them
            flags += ["--windows", str(self.cfg.windows), "--record-evaluations"]
        return flags

    def extra_pages(self, node: NodeInfo) -> int:
        """The pages `node` declares beyond its assigned ones: `moredata` is the production miner
        doing twice the work (`--extra-pages`), `overclaim` declares pages it does not train."""
        return declared_extra_pages(node.strategy, self.hp.data)

    def copy_target(self, node: NodeInfo) -> str | None:
        """The hotkey a `duplicate` re-posts: its honest twin's."""
        if node.strategy != "duplicate":
            return None
        return next(n for n in self.nodes if n.name == node.name.replace("duplicate", "dup") + "-twin").hotkey

    def pool_uids(self, node: NodeInfo) -> list[int] | None:
        """The uids of a group's miner (`pooled`, `flood`, `faint`; its own included): the pages a pool's operator shares."""
        if node.strategy not in GROUP_SIZES:
            return None
        group = node.name.rpartition("-")[0]
        return sorted(n.uid for n in self.nodes if n.strategy == node.strategy and n.name.rpartition("-")[0] == group)

    def ranks(self, node: NodeInfo) -> int:
        """How many torchrun ranks run this node: `miner_ranks` for honest miner0, `validator_ranks`
        for the lead validator0, else 1."""
        if node.name == "validator0":
            return self.cfg.validator_ranks
        return self.cfg.miner_ranks if node.name == "miner0" and node.strategy == "honest" else 1

    def _command(self, node: NodeInfo) -> tuple[list[str], dict[str, str]]:
        """The neuron's command line: the production entry point for validators, honest miners and
        `moredata` (the miner's own --extra-pages); the adversary entry point for the others. A
        node of N > 1 ranks is started the way an operator does: `torchrun --nproc_per_node N`."""
        cmd = [sys.executable]
        if (ranks := self.ranks(node)) > 1:
            cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
        if is_adversary(node):
            cmd += ["-m", "templar.localnet.adversary", "--strategy", node.strategy]
            if (target := self.copy_target(node)) is not None:
                cmd += ["--copy.hotkey", target]
            if (pool := self.pool_uids(node)) is not None:
                cmd += ["--pool.uids", ",".join(map(str, pool))]
        else:
            cmd += [str(REPO_ROOT / "neurons" / f"{node.role}.py")]
            if extra := self.extra_pages(node):
                cmd += ["--extra-pages", str(extra)]
        bucket_args, env = self._bucket_args(node)
        return cmd + self.node_flags(node, bucket_args), env

    def check_corpus(self) -> None:
        """The prepared sample corpus the neurons read their pages from is there and is the run's:
        said here, once, instead of by every neuron (its manifest only: the pages are the neurons')."""
        corpus = Path(resolve_asset(self.hp.data.corpus))
        parse_manifest((corpus / MANIFEST_KEY).read_bytes(), expected_digest=self.hp.data.manifest or None)

    def start(self) -> None:
        self.check_corpus()
        if self.cfg.storage == "s3":
            from templar.localnet.s3 import LocalS3

            self.s3 = LocalS3(self.out / "s3")
            self.s3.start()
        # torchrun's nodes first: their rendezvous and every rank's start-up take seconds longer than a
        # one-process neuron's, and started last they would miss the run's first windows
        for node in sorted(self.nodes, key=self.ranks, reverse=True):
            self.spawn(node.name)
        forked = sum(isinstance(proc, ForkedProcess) for proc in self.procs.values())
        logger.info(f"started {len(self.procs)} neurons ({forked} forked from the fork server, "
                    f"{len(self.procs) - forked} by exec); logs under {self.out / 'nodes'}")

    @staticmethod
    def base_env() -> dict[str, str]:
        """Every neuron's environment, before its own bucket keys."""
        return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}

    def spawn(self, name: str) -> None:
        """Start the neuron `name` as its own process (again, after `kill`: from its state dir)."""
        node = next(n for n in self.nodes if n.name == name)
        cmd, env = self._command(node)
        env = {**self.base_env(), **env}
        stdout_path = node.directory(self.out) / "stdout.log"
        if self.ranks(node) == 1 and (server := self._fork_server()) is not None and forkable(server.env, env):
            self.procs[node.name] = server.spawn(cmd, env, REPO_ROOT, stdout_path)
            return
        stdout = open(stdout_path, "ab")  # noqa: SIM115 - owned by the child
        self.procs[node.name] = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.STDOUT, env=env,
                                                 cwd=REPO_ROOT, start_new_session=True)

    def _fork_server(self) -> ForkServer | None:
        """The running fork server, started at the first neuron it can fork (None: not used here)."""
        if self.fork_server is None and self.cfg.fork_server and ForkServer.supported():
            self.fork_server = ForkServer(self.base_env(), self.out / "forkserver.log")
            self.fork_server.start()
        return self.fork_server

    def kill(self, name: str) -> int:
        """kill -9 of the neuron `name` and everything it started (a failover rehearsal); its exit code."""
        proc = self.procs[name]
        for rank_pid in torchrun_ranks(proc.pid).values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank_pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()

    # ---------------------------------------------------------------- run
    def _lead_windows(self) -> list[int]:
        lead = lead_validator(self.nodes)
        if lead is None:
            return []
        return [r["window"] for r in read_records(lead.directory(self.out) / VALIDATOR_WINDOWS_FILE)]

    def windows_done(self) -> int:
        """Windows the lead scored in this run (with --resume, those after the last one scored before)."""
        return len({w for w in self._lead_windows() if w > self.resumed_after})

    def alive(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self.procs.items()}

    def wait(self, deadline_seconds: float) -> str:
        """Until the lead validator has evaluated `windows` windows, it exits, or time runs out."""
        lead = lead_validator(self.nodes)
        started = time.time()
        live = None
        if self.cfg.live:
            live = Live(live_table(self.out, self.nodes, self.alive()), console=Console(stderr=True),
                        auto_refresh=False)
            live.start()
        try:
            while True:
                if live is not None:
                    live.update(live_table(self.out, self.nodes, self.alive()), refresh=True)
                for name in self.due_newcomers():
                    self.join(name)
                    self.spawn(name)
                if self.windows_done() >= self.cfg.windows:
                    if lead:  # it stops by itself after its last window: let it save and exit
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            self.procs[lead.name].wait(timeout=15)
                    return "finished"
                if lead and self.procs[lead.name].poll() is not None:
                    return f"lead validator exited with code {self.procs[lead.name].returncode}"
                if time.time() - started > deadline_seconds:
                    return "timed out"
                time.sleep(1.0)
        finally:
            if live is not None:
                live.stop()

    def stop(self, grace: float | None = None) -> dict[str, int | None]:
        """SIGTERM everyone; a miner finishes its window first (up to a window), then SIGKILL.
        A torchrun node gets the signal at its rank 0, which finishes the window, saves and
        releases the other ranks, so torchrun exits 0 (torchrun itself exits 1 on a signal)."""
        if grace is None:
            grace = self.hp.windows.window_seconds + 15.0
        for proc in self.procs.values():
            if proc.poll() is None:
                ranks = torchrun_ranks(proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(ranks.get(0, proc.pid), signal.SIGTERM)
        until = time.time() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, until - time.time()))
            except subprocess.TimeoutExpired:
                for rank_pid in torchrun_ranks(proc.pid).values():  # torchrun's workers have their own sessions
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(rank_pid, signal.SIGKILL)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self.fork_server is not None:
            self.fork_server.close()
            self.fork_server = None
        if self.s3 is not None:
            self.s3.stop()
        return {name: proc.returncode for name, proc in self.procs.items()}


def torchrun_ranks(pid: int) -> dict[int, int]:
    """rank -> pid of the workers of the torchrun process `pid` ({} when it is not one, or off
    Linux: /proc is read)."""
    out: dict[int, int] = {}
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            children += [int(c) for c in (task / "children").read_text().split()]
    for child in children:
        try:
            env = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((int(e[5:]) for e in env if e.startswith(b"RANK=")), None)
        if rank is not None:
            out[rank] = child
    return out


class Dashboard(Protocol):
    url: str

    def stop(self) -> None: ...


DashboardStarter = Callable[[Path, str, int, int], Dashboard | None]
"""(out, hparams, port, netuid) -> a running dashboard, or None if it could not start."""


def run_localnet(cfg: LocalnetConfig, *, deadline_seconds: float | None = None,
                 start_dashboard: DashboardStarter | None = None) -> dict:
    """Run a localnet to completion (or Ctrl-C) and return the report.

    `start_dashboard` serves the dashboard next to the net when `cfg.dashboard` names a port: the
    command line passes `templar.dashboard.server.start_localnet_dashboard`, so the localnet and
    the dashboard, side by side on the tools floor, never import each other."""
    net = Localnet(cfg)
    net.prepare()
    codes: dict[str, int | None] = {}
    dashboard = None
    if cfg.dashboard is not None and start_dashboard is not None:
        dashboard = start_dashboard(net.out, net.hparams, cfg.dashboard, NETUID)
        if dashboard is not None:
            print(f"dashboard: {dashboard.url}", flush=True)
    try:
        if cfg.in_process:
            from templar.localnet.inprocess import run_in_process

            outcome = run_in_process(net)
        else:
            window_seconds = net.hp.windows.window_seconds
            deadline = deadline_seconds or (cfg.windows + 6) * window_seconds + 120
            outcome = "interrupted"
            try:
                net.start()  # inside: the neurons started before a failure are stopped
                outcome = net.wait(deadline)
            except KeyboardInterrupt:
                logger.warning("Ctrl-C: stopping every neuron and writing the report")
            finally:
                codes = net.stop()
    finally:
        if dashboard is not None:
            dashboard.stop()
    report = build_report(net.out, plots=cfg.plots)
    report["outcome"] = outcome
    report["exit_codes"] = codes
    (net.out / "report.json").write_text(json.dumps(report, indent=2))
    logger.info(f"localnet {outcome}; report in {net.out / 'report.md'}")
    return report
