"""The dashboard's in-memory picture: every source plus the chain, refreshed in place.

`Board` owns the sources (validator and miner state dirs, or a localnet directory whose
roster names them) and the chain watcher. `refresh_files` and `refresh_chain` run in worker
threads; pages render under `lock`, so a refresh never mutates a history mid-render. `version`
goes up whenever anything visible changed; the live view pushes it to browsers.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from templar.chain import Chain
from templar.dashboard.chainwatch import ChainSnapshot, ChainWatch
from templar.dashboard.sources import LocalnetDir, MinerSource, ValidatorSource
from templar.runtime.records import PeerScoreRecord
from templar.runtime.roster import NodeInfo

NEVER_PRESENT = frozenset({"missing", "not-sampled"})
"""Statuses that say nothing was ever received from a hotkey."""
STALE_WINDOWS = 3
"""A run (or a node) with no window recorded for this many windows of wall time has stopped or
stalled: no longer shown as live. The Prometheus rule TemplarNodeBehind uses the same three."""
BEHIND_WINDOWS = 3
"""A validator scoring a window this many behind the chain's current one is catching up."""
STATE_FILE = "state.safetensors"  # templar.runtime.state.STATE_FILE: only its size is read (stat)
PRODUCTION_WINDOW_SECONDS = 84.0
"""7 blocks × 12 s: the window length when the board's config does not give one."""


@dataclass(frozen=True)
class RunState:
    """What the run is doing, as the top of every page says it: `kind` is live (green), behind,
    stale (records stopped), finished (a localnet that wrote its report) or waiting (nothing yet);
    `alerts` are the states the Prometheus rules of deploy/prometheus/ alert on, seen from files."""

    kind: str
    detail: str
    alerts: tuple[str, ...] = ()


@dataclass
class BoardConfig:
    """What to watch. Any part may be missing; the page says which."""

    localnet: Path | None = None
    validator_dirs: list[Path] = field(default_factory=list)
    miner_dirs: list[Path] = field(default_factory=list)
    connect: Callable[[], Chain] | None = None
    chain_label: str = ""
    chain_interval: float = 6.0
    blocks_per_window: int | None = None
    hparams_name: str = ""
    window_seconds: float | None = None
    """blocks_per_window × block_time: how old a record may be before the run is stale."""
    windows_per_weights: int | None = None


def _unique_name(directory: Path, taken: set[str]) -> str:
    base = directory.name or "node"
    name, i = base, 2
    while name in taken:
        name, i = f"{base}-{i}", i + 1
    taken.add(name)
    return name


class Board:
    def __init__(self, config: BoardConfig):
        self.config = config
        self.lock = threading.RLock()
        self.version = 0
        self.updated_at = 0.0
        self.localnet = LocalnetDir(config.localnet) if config.localnet else None
        self.labels: dict[str, NodeInfo] = {}
        taken: set[str] = set()
        self.validators = [ValidatorSource(_unique_name(d, taken), d) for d in config.validator_dirs]
        self.miners = [MinerSource(_unique_name(d, taken), d) for d in config.miner_dirs]
        self.chain = (ChainWatch(config.connect, config.chain_label, config.chain_interval)
                      if config.connect else None)
        self._run_kind = ""

    # ---- refresh (worker threads) ------------------------------------------------------------

    def refresh_files(self) -> bool:
        with self.lock:
            changed = self._load_roster()
            for source in (*self.validators, *self.miners):
                changed |= source.refresh()
            kind = self.run_state(self.validator(None)).kind  # a run going stale changes the page too
            changed |= kind != self._run_kind
            self._run_kind = kind
            if changed:
                self._bump()
            return changed

    def refresh_chain(self, force: bool = False) -> bool:
        if self.chain is None or not (force or self.chain.due()):
            return False
        changed = self.chain.poll()  # network I/O outside the lock
        if changed:
            with self.lock:
                self._bump()
        return changed

    def _bump(self) -> None:
        self.version += 1
        self.updated_at = time.time()

    def _load_roster(self) -> bool:
        """A localnet's nodes.json names its nodes; sources for new names are added once (a newcomer's when
        the localnet rewrites the roster as it joins)."""
        if self.localnet is None or (self.localnet.nodes and not self.localnet.error and not self.localnet.changed):
            return False
        self.localnet.load()
        have = {s.name for s in (*self.validators, *self.miners)}
        for node in self.localnet.nodes:
            self.labels[node.hotkey] = node
            if node.name in have:
                continue
            directory = node.directory(self.localnet.out)
            if node.role == "validator":
                self.validators.append(ValidatorSource(node.name, directory))
            else:
                self.miners.append(MinerSource(node.name, directory))
        # the lead first: it is the validator whose view the model follows
        lead = self.localnet.lead()
        if lead:
            self.validators.sort(key=lambda s: s.name != lead.name)
        return bool(self.localnet.nodes)

    # ---- reads (under lock) ------------------------------------------------------------------

    @property
    def snapshot(self) -> ChainSnapshot | None:
        return self.chain.snapshot if self.chain else None

    def validator(self, name: str | None) -> ValidatorSource | None:
        """The named validator, else the lead's (on chain, or the localnet's), else the first."""
        if name:
            return next((v for v in self.validators if v.name == name), None)
        snap = self.snapshot
        lead = snap.lead() if snap else None
        if lead and lead.hotkey in self.labels:
            named = next((v for v in self.validators if v.name == self.labels[lead.hotkey].name), None)
            if named:
                return named
        return self.validators[0] if self.validators else None

    def peers(self, v: ValidatorSource) -> dict[str, PeerScoreRecord]:
        """`v.current()` without the hotkeys that take no part as miners.

        A registered hotkey that never committed a bucket and was only ever scored `missing` (or
        not sampled) is no miner that went missing: it is the subnet owner's uid 0, or a hotkey
        registered and never started. Who committed is known from a localnet's roster (each node
        commits at its start) and from the chain; with neither, every hotkey is shown."""
        committed = self._committed()
        return {hk: rec for hk, rec in v.current().items()
                if committed is None or hk in committed
                or any(r.status not in NEVER_PRESENT or r.weight > 0 for r in v.history.get(hk, ()))}

    def _committed(self) -> set[str] | None:
        snap = self.snapshot
        if snap is None and not self.labels:
            return None
        return set(self.labels) | ({n.hotkey for n in snap.neurons if n.commitment} if snap else set())

    def miner(self, name: str) -> MinerSource | None:
        return next((m for m in self.miners if m.name == name), None)

    def label(self, hotkey: str) -> str:
        node = self.labels.get(hotkey)
        return f"{node.name}" if node else ""

    def current_window(self) -> int | None:
        snap, bpw = self.snapshot, self.config.blocks_per_window
        return snap.block // bpw if snap and bpw else None

    def run_state(self, v: ValidatorSource | None, now: float | None = None) -> RunState:
        """Live, behind, stale, finished or waiting, from the records' ages and the chain's window
        (a finished run is never shown live), with the alert states of the nodes watched."""
        now = time.time() if now is None else now
        window = self.config.window_seconds or PRODUCTION_WINDOW_SECONDS
        sources = [*self.validators, *self.miners]
        stamps = [s.last_record_at for s in sources if s.last_record_at]
        last = v.last_window if v else None
        scored = f"last window scored {last.window}" if last else "no window scored"
        if self.localnet is not None and self.localnet.finished:
            return RunState("finished", f"the localnet finished and wrote its report; {scored}")
        if not stamps:
            return RunState("waiting", "no window recorded yet (nodes joining, or not started)")
        age = now - max(stamps)
        if age > STALE_WINDOWS * window:
            return RunState("stale", f"no window recorded for {_duration(age)}: the nodes watched have stopped "
                                     f"or stalled; {scored}", self._alerts(v, now, window))
        current = self.current_window()
        if last and current is not None and current - last.window > BEHIND_WINDOWS:
            return RunState("behind", f"scoring window {last.window} while the chain is at {current} "
                                      f"({current - last.window} behind): catching up", self._alerts(v, now, window))
        return RunState("live", f"{scored}" + (f", the chain is at window {current}" if current is not None else ""),
                        self._alerts(v, now, window))

    def _alerts(self, v: ValidatorSource | None, now: float, window: float) -> tuple[str, ...]:
        """The states deploy/prometheus/templar-alerts.yml alerts on, from what the dashboard reads."""
        out = []
        for source in (*self.validators, *self.miners):
            if source.last_record_at and now - source.last_record_at > STALE_WINDOWS * window:
                lead = isinstance(source, ValidatorSource) and source.last_window and source.last_window.lead
                out.append(f"{'the lead' if lead else 'node'} {source.name} has recorded no window for "
                           f"{_duration(now - source.last_record_at)}" + (": nobody gets its updates" if lead else ""))
        waiting = [m.name for m in self.miners if m.last is not None and m.last.phase == "catchup"
                   and not (m.last_record_at and now - m.last_record_at > STALE_WINDOWS * window)]
        if waiting:
            out.append(f"{', '.join(waiting)}: the last window ended waiting for the lead's update of it (catch-up)")
        if v is not None and v.last_window is not None:
            weights = self._weights_alert(v)
            if weights:
                out.append(weights)
        for source in (*self.validators, *self.miners):
            disk = _disk_alert(source.name, source.directory)
            if disk:
                out.append(disk)
        return tuple(out)

    def _weights_alert(self, v: ValidatorSource) -> str:
        """Weights not set for two weights windows (not in shadow mode, where they never are)."""
        every = self.config.windows_per_weights
        last_attempt = v.weights[-1] if v.weights else None
        if every is None or (last_attempt is not None and last_attempt.outcome == "shadow"):
            return ""
        landed = [w.window for w in v.weights if w.outcome == "set"]
        since = landed[-1] if landed else (v.windows[0].window if v.windows else v.last_window.window)
        if v.last_window.window - since <= 2 * every:
            return ""
        said = f" (last attempt: {last_attempt.outcome} {last_attempt.reason})".replace(" )", ")") if last_attempt else ""
        return (f"{v.name}: weights not set since window {since}" if landed
                else f"{v.name}: no weights set in {v.last_window.window - since} windows") + said

    def problems(self) -> list[str]:
        out = []
        if self.localnet and self.localnet.error:
            out.append(f"localnet {self.localnet.out}: {self.localnet.error}")
        if not self.validators and not self.miners:
            out.append("no validator or miner state dir to read: pass --localnet, --validator.dir or --miner.dir")
        if self.chain is None:
            out.append("no chain configured: stake, weights, commitments and agreement are not shown")
        elif self.chain.error:
            stale = ""
            if self.chain.snapshot:
                stale = f" (showing block {self.chain.snapshot.block}, read {time.time() - self.chain.snapshot.taken_at:.0f}s ago)"
            out.append(self.chain.error + stale)
        elif self.chain.snapshot is None:
            out.append(f"chain {self.chain.label}: first read pending")
        for source in (*self.validators, *self.miners):
            out.extend(source.problems())
        return out


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def _disk_alert(name: str, directory: Path) -> str:
    """Less free disk than two state files by the state directory (every save writes a new one)."""
    try:
        size = (directory / STATE_FILE).stat().st_size
        free = shutil.disk_usage(directory).free
    except OSError:
        return ""
    if free >= 2 * size:
        return ""
    return f"{name}: {free / 1e9:.1f} GB free by its state dir, less than two state files ({size / 1e9:.1f} GB each)"
