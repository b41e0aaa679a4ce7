"""The localnet report: report.json, report.md and PNG plots, built from the nodes' JSONL records.

Pure over files: it can be rebuilt after the run (`templar localnet --report-only --out DIR`), and
it still works on a run stopped with Ctrl-C or one whose processes died.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

from templar.localnet.consensus import consensus_by_window, render_consensus
from templar.runtime.records import MINER_WINDOWS_FILE, SCORES_FILE, VALIDATOR_WINDOWS_FILE, read_records
from templar.runtime.roster import NodeInfo, lead_validator, read_nodes


def build_report(out: Path, *, plots: bool = True) -> dict:
    nodes = read_nodes(out)
    lead = lead_validator(nodes)
    scores = list(read_records(lead.directory(out) / SCORES_FILE)) if lead else []
    vwindows = list(read_records(lead.directory(out) / VALIDATOR_WINDOWS_FILE)) if lead else []

    by_hotkey: dict[str, list[dict]] = defaultdict(list)
    for rec in scores:
        by_hotkey[rec["hotkey"]].append(rec)
    last_window = max((r["window"] for r in scores), default=None)
    final = {r["hotkey"]: r for r in scores if r["window"] == last_window}
    miner_total = sum(final[n.hotkey]["weight"] for n in nodes if n.role == "miner" and n.hotkey in final)

    peers = []
    for node in nodes:
        history = by_hotkey.get(node.hotkey, [])
        own = list(read_records(node.directory(out) / MINER_WINDOWS_FILE)) if node.role == "miner" else []
        last = final.get(node.hotkey)
        weight = (last["weight"] / miner_total) if (last and miner_total > 0) else 0.0
        peers.append({
            "name": node.name,
            "hotkey": node.hotkey,
            "uid": node.uid,
            "role": node.role,
            "strategy": node.strategy,
            "windows_uploaded": sum(1 for r in own if r.get("uploaded")),
            "trained_tokens": sum(int(r.get("tokens", 0)) for r in own),
            "trained_windows": sum(1 for r in own if int(r.get("tokens", 0)) > 0),
            "statuses": dict(Counter(r["status"] for r in history)),
            "final_mu": last["mu"] if last else 0.0,
            "final_paid_mu": (last.get("paid_mu") if last else None) or 0.0,  # μ̃: what the score reads
            "final_rating": last["rating"] if last else 0.0,
            "final_weight": weight if node.role == "miner" else 0.0,
            "weight_history": [[r["window"], r["weight"]] for r in history],
            "rating_history": [[r["window"], r["rating"]] for r in history],
        })
    windows = [{"window": r["window"], "loss": r["holdout_loss"], "peers_aggregated": r["peers_aggregated"],
                "wall_seconds": r["wall_seconds"], "global_step": r["global_step"]} for r in vwindows]
    consensus = consensus_by_window(out, nodes)
    for peer in peers:
        peer["final_incentive"] = consensus[-1]["incentive"].get(peer["name"], 0.0) if consensus else 0.0
    report = {"lead_validator": lead.hotkey if lead else None, "peers": peers, "windows": windows,
              "consensus": consensus}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(render_markdown(report, nodes))
    if plots:
        plot_report(report, out)
    return report


def render_markdown(report: dict, nodes: list[NodeInfo]) -> str:
    """report.md: the report's tables, and the consensus table over the roster's `nodes`."""
    lines = ["# Localnet report", ""]
    windows = report["windows"]
    if windows:
        first, last = windows[0], windows[-1]
        lines += [f"Windows {first['window']}–{last['window']} ({len(windows)} evaluated); held-out loss "
                  f"{first['loss']:.4f} → {last['loss']:.4f}.", ""]
    lines += ["| name | uid | role | strategy | uploads | final μ | final μ̃ (paid) | final rating | final weight | "
              "statuses |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(report["peers"], key=lambda p: (p["role"] != "validator", -p["final_weight"], p["uid"])):
        statuses = ", ".join(f"{k}×{v}" for k, v in sorted(p["statuses"].items()))
        lines.append(f"| {p['name']} | {p['uid']} | {p['role']} | {p['strategy']} | {p['windows_uploaded']} | "
                     f"{p['final_mu']:.3f} | {p['final_paid_mu']:.3f} | {p['final_rating']:.3f} | "
                     f"{p['final_weight']:.3f} | {statuses} |")
    lines += ["", "| window | held-out loss | peers aggregated | wall seconds |", "|---|---|---|---|"]
    lines += [f"| {w['window']} | {w['loss']:.4f} | {w['peers_aggregated']} | {w['wall_seconds']:.1f} |"
              for w in windows]
    lines += render_consensus(report.get("consensus", []), nodes)
    lines += ["", "![loss](loss.png) ![weights](weights.png) ![ratings](ratings.png)", ""]
    return "\n".join(lines)


def miner_styles(miners: list[dict]) -> dict[str, dict]:
    """A colour and a line style per miner: honest miners solid in tab20's dark shades, every other
    strategy dashed in its light ones, so a crowded localnet's plot (18 miners) tells honest work
    from an adversary at a glance. Matplotlib's default cycle repeats after 10 lines; here no two of
    up to 40 miners (20 of each kind) are drawn alike."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"].colors  # 10 hues, each dark then light
    styles: dict[str, dict] = {}
    for honest in (True, False):
        names = [p["name"] for p in miners if (p["strategy"] == "honest") == honest]
        lines = ("-", "-.") if honest else ("--", ":")
        for i, name in enumerate(names):
            styles[name] = {"color": colours[2 * (i % 10) + (0 if honest else 1)], "linestyle": lines[i // 10 % 2]}
    return styles


def plot_report(report: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    windows = report["windows"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([w["window"] for w in windows], [w["loss"] for w in windows], marker="o")
    ax.set(xlabel="window", ylabel="held-out loss", title="Validator held-out loss")
    fig.tight_layout()
    fig.savefig(out / "loss.png", dpi=110)
    plt.close(fig)
    miners = [p for p in report["peers"] if p["role"] == "miner"]
    styles = miner_styles(miners)
    for key, fname, title in (("weight_history", "weights.png", "Weight per miner"),
                              ("rating_history", "ratings.png", "LossRating per miner")):
        fig, ax = plt.subplots(figsize=(8.5, 4))
        for p in miners:
            series = p[key]
            if series:
                ax.plot([s[0] for s in series], [s[1] for s in series], marker=".",
                        label=f"{p['name']} ({p['strategy']})", **styles[p["name"]])
        ax.set(xlabel="window", ylabel=key.split("_")[0], title=title)
        if miners:  # beside the axes: inside them, 18 entries hide the lines they name
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
                      ncol=2 if len(miners) > 14 else 1)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
