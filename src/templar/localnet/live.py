"""The live terminal view of a localnet: one table, refreshed as windows complete."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from templar.runtime.records import MINER_WINDOWS_FILE, SCORES_FILE, VALIDATOR_WINDOWS_FILE, read_records
from templar.runtime.roster import NodeInfo, lead_validator


def _last(path: Path) -> dict | None:
    last = None
    for last in read_records(path):  # noqa: B007 - we want the final record
        pass
    return last


def live_table(out: Path, nodes: list[NodeInfo], alive: dict[str, bool]) -> Table:
    lead = lead_validator(nodes)
    vwin = _last(lead.directory(out) / VALIDATOR_WINDOWS_FILE) if lead else None
    scores: dict[str, dict] = {}
    if lead:
        for rec in read_records(lead.directory(out) / SCORES_FILE):
            scores[rec["hotkey"]] = rec
    title = "templar localnet"
    if vwin:
        title += (f" · window {vwin['window']} · step {vwin['global_step']} · held-out loss "
                  f"{vwin['holdout_loss']:.4f} · aggregated {vwin['peers_aggregated']}")
    table = Table(title=title, expand=False)
    for col in ("node", "uid", "role/strategy", "phase", "last window", "status", "μ", "rating", "weight"):
        table.add_column(col, justify="right" if col in {"uid", "μ", "rating", "weight"} else "left")
    for node in nodes:
        rec = scores.get(node.hotkey)
        if node.role == "miner":
            mine = _last(node.directory(out) / MINER_WINDOWS_FILE)
            phase = mine["phase"] if mine else "starting"
            last_window = str(mine["window"]) if mine else "-"
        else:
            own = _last(node.directory(out) / VALIDATOR_WINDOWS_FILE)
            phase = "active" if own else "starting"
            last_window = str(own["window"]) if own else "-"
        if not alive.get(node.name, True):
            phase = "exited"
        table.add_row(
            node.name, str(node.uid), f"{node.role}/{node.strategy}", phase, last_window,
            rec["status"] if rec else "-",
            f"{rec['mu']:.3f}" if rec else "-", f"{rec['rating']:.3f}" if rec else "-",
            f"{rec['weight']:.3f}" if rec else "-",
        )
    return table
