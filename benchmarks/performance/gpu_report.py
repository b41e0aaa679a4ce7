"""What `benchmarks/performance/gpu.py` reports: the noise phase's summaries and the table of measured figures
beside the estimates they replace."""

from __future__ import annotations

import importlib.util
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from benchmarks.performance.gpu_bench import FIT_FILE, PHASES, ROOT, spread_stats


def _gauntlet_scores() -> Any:
    """`templar/gauntlet/scores.py` on its own: the package's `__init__` imports openskill (through
    the rating), which the device machine does not have; the proof's rule itself needs only torch."""
    spec = importlib.util.spec_from_file_location("gauntlet_scores", ROOT / "src" / "templar" / "gauntlet" / "scores.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def proof_credit_summary(rows: Mapping[str, Mapping[str, Sequence[float]]], full_gap: float) -> dict[str, Any]:
    """What production's proof of computation by size credits these honest peers, one position
    range of one sequence at a time (docs/scoring.md §4): the credit c = 2 can reward only if honest sequences clear
    `full_gap` × the typical gap, which on the CPU's `micro` model they do half the time (mean
    credit ≈ 0.5; benchmarks/LOG.md §8). The typical gap is these peers' median, without either floor."""
    scores = _gauntlet_scores()
    rand = {p: statistics.fmean(rows[p]["delta_rand_pages"]) for p in rows}
    gaps = [scores.proof_gap(0.0, rand[p], rows[p]["delta_assigned_pages"]) for p in rows]
    typical = scores.typical_gap(scores.window_gap(gaps), [], 0.0, floor=0.0, history=1, resolution=0.0)
    credit, full = {}, {}
    for p in rows:
        sequences = rows[p].get("delta_assigned_sequences") or []
        if not sequences or typical <= 0:
            continue
        credit[p] = scores.size_credit(sequences, rand[p], full_gap * typical)
        full[p] = sum(d - rand[p] >= full_gap * typical for d in sequences) / len(sequences)
    return {"full_gap": full_gap, "typical_gap": typical, "credit": credit, "full_credit_share": full,
            "credit_mean": statistics.fmean(credit.values()) if credit else None}


def noise_summary(rows: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, Any]:
    """The spreads the Gauntlet cares about, from δ per (peer, page).

    * across pages, one peer: coefficient of variation of δ_rand (and δ_assigned) over pages;
    * across peers, one page (what one validator-window sees: every peer of S_t on the same random
      pages): per page, the sd of δ_rand / mean δ_rand over peers (the simulator fit's measure,
      `subnet_sim_fit.json` honest `rand_mean_sd`) and 1.4826 · MAD / median (the tie band's σ̂);
    * `window_noise`: the sd of log(σ̂) over pages, the simulator's spread of windows' noise
      (its localnets' windows: 0.94; windows here differ only in their random page).
    """
    peers = list(rows)
    rand = [[float(v) for v in rows[p]["delta_rand_pages"]] for p in peers]
    out: dict[str, Any] = {
        "rand_cv_across_pages": {p: spread_stats(r).get("cv") for p, r in zip(peers, rand, strict=True)},
        "assigned_cv_across_pages": {p: spread_stats(rows[p]["delta_assigned_pages"]).get("cv") for p in peers},
        "mean_delta_rand": statistics.fmean(v for r in rand for v in r),
        "mean_delta_assigned": statistics.fmean(v for p in peers for v in rows[p]["delta_assigned_pages"]),
    }
    relative_sd, sigma_hat = [], []
    for page in range(len(rand[0])):
        xs = [r[page] for r in rand]
        mean, med = statistics.fmean(xs), statistics.median(xs)
        if len(xs) >= 2 and mean > 0:
            relative_sd.append(statistics.stdev(xs) / mean)
        if len(xs) >= 3 and med > 0:
            sigma_hat.append(1.4826 * statistics.median(abs(x / med - 1) for x in xs))
    out["relative_sd_across_peers"] = relative_sd
    out["sigma_hat_across_peers"] = sigma_hat
    positive = [v for v in sigma_hat if v > 0]
    out["window_noise"] = statistics.stdev(math.log(v) for v in positive) if len(positive) > 1 else None
    if relative_sd and FIT_FILE.is_file():
        import json

        fit_sd = json.loads(FIT_FILE.read_text())["summary"]["honest"]["rand_mean_sd"][1]
        out["fit_honest_relative_sd"] = fit_sd
        out["subnet_sim_noise"] = statistics.median(relative_sd) / fit_sd
    return out


def _fmt(value: Any, unit: str = "", digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, int):
        return f"{value:,}{unit}"
    if isinstance(value, float):
        return f"{value:.{digits}g}{unit}"
    return str(value)


def table(result: Mapping[str, Any]) -> list[list[str]]:
    """[figure, measured, estimate] rows: what each phase measured beside the figure it replaces. A
    section that cannot be read says so in its row instead of losing the others."""
    phases = result["phases"]
    est = phases.get("setup", {}).get("estimate", {})
    rows: list[list[str]] = []
    for name in PHASES[1:]:
        p = phases.get(name)
        if p is None:
            continue
        if p.get("status") != "ok":
            rows.append([name, p.get("status", "?") + ": " + str(p.get("error") or p.get("reason"))[:70], ""])
            continue
        try:
            rows += ROWS[name](p, est)
        except Exception as exc:
            rows.append([name, f"unreadable for the table: {type(exc).__name__}: {exc}"[:90], ""])
    return rows


def _rows_corpus(c: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    rows.append(["corpus: pages × tokens", f"{c['pages']} × {c['page_tokens']:,} ({c['vocab']:,}-entry tokenizer)", ""])
    return rows


def _rows_window(w: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for label, m in (("paper", w["paper"]), ("production", w["production"])):
        if not isinstance(m, dict):
            rows.append([f"window ({label})", m, ""])
            continue
        fb = m.get("forward_backward_per_micro_batch", {})
        rows += [
            [f"window ({label}): tokens, steps", f"{m['tokens']:,}, {m['steps_per_window']}",
             _fmt(est.get("tokens_per_window_per_peer"))],
            [f"window ({label}): forward+backward, whole window", _fmt(m["train_seconds"], " s"),
             _fmt(est.get("h100_train_seconds"), " s")],
            [f"window ({label}): tokens/s, MFU", f"{m['tokens_per_second']:,.0f}, {_fmt(m['mfu'])}",
             _fmt(est.get("mfu_assumed"))],
            [f"window ({label}): forward+backward per micro-batch",
             f"{_fmt(fb.get('median_seconds'), ' s')} ({m['micro_batch']} seq), MFU {_fmt(fb.get('mfu'))}", ""],
            [f"window ({label}): compression (DeMo step)", _fmt(m["compress_seconds"], " s"), ""],
            [f"window ({label}): encoding own payload", f"{m['encode_seconds']:.3g} s ({m['payload_bytes'] / 1e6:.1f} MB)", ""],
            [f"window ({label}): decoding {m['aggregate_peers']} peers", _fmt(m["decode_seconds"], " s"), ""],
            [f"window ({label}): aggregating {m['aggregate_peers']} peers, CPU (today)",
             _fmt(m["aggregate_cpu_seconds"], " s"), ""],
            [f"window ({label}): aggregating {m['aggregate_peers']} peers, device",
             _fmt(m.get("aggregate_device_seconds"), " s"), ""],
            [f"window ({label}): outer step (apply)", _fmt(m["outer_step_seconds"], " s"), ""],
            [f"window ({label}): peak GPU memory", _fmt(m["peak_memory_gb"], " GB"),
             _fmt(est.get("miner_gpu_memory_gb"), " GB")],
        ]
    busy = w.get("busy")
    if isinstance(busy, dict):
        rows += [
            ["window (production): GPU work outside the inner steps (compress, step, state copy)",
             _fmt(busy["gpu_overhead_seconds"], " s"), _fmt(est.get("miner_gpu_overhead_seconds"), " s")],
            ["window (production): share of the window training, blocking",
             _fmt(busy["blocking_busy_fraction"]), ""],
            [f"window (production): share of the window training, {busy['overlap']}",
             _fmt(busy["overlapped_busy_fraction"]), _fmt(est.get("miner_compute_utilisation"))],
        ]
    return rows


def _rows_memory(m: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    for name, r in m["settings"].items():
        rows += [
            [f"memory ({name}): peak GPU memory", _fmt(r["peak_memory_gb"], " GB"),
             _fmt(r["estimate_gb"], " GB")],
            [f"memory ({name}): {m['inner_steps']} inner steps + DeMo step, seconds (added; first run)",
             f"{r['seconds']:.3g} s ({r['added_seconds']:+.3g} s; {r['first_seconds']:.3g} s)", ""],
            [f"memory ({name}): update identical to the default's (its own repeat)",
             f"{_fmt(r['update_identical_to_default'])} ({_fmt(r['repeat_identical'])})", "yes"],
        ]
    for name, r in m.get("deterministic", {}).get("settings", {}).items():
        rows.append([f"memory ({name}): identical to the default's, deterministic kernels",
                     _fmt(r["versus_default"]["identical"]), "yes"])
    return rows


def _rows_validator(v: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    rows += [
        ["validator: sign decode per peer, CPU / device",
         f"{_fmt(v['sign_decode_cpu_seconds'], ' s')} / {_fmt(v.get('sign_decode_device_seconds'), ' s')}", ""],
        [f"validator: score_peers, {v['score_peers_peers']} peers", _fmt(v["score_peers_seconds"], " s"), ""],
        ["validator: score_peers with the proof's common steps (3 groups), over plain; on a quarter",
         f"{_fmt(v.get('common_over_plain'), 'x')}; {_fmt(v.get('common_quarter_over_plain'), 'x')}", ""],
        ["validator: score_peers with the other peers' steps, over plain; on a quarter",
         f"{_fmt(v.get('others_over_plain'), 'x')}; {_fmt(v.get('others_quarter_over_plain'), 'x')}", ""],
        ["validator: evaluation per peer (page before, step, pages after, restore)",
         _fmt(v["seconds_per_peer"], " s"), ""],
        [f"validator: held-out ({v['holdout_pages']} pages) + shared random pages", _fmt(v["fixed_seconds"], " s"), ""],
        [f"validator: {v['uids_per_window']} peers' evaluation", _fmt(v["eval_seconds_per_window"], " s"),
         _fmt(est.get("h100_validator_eval_seconds"), " s")],
        [f"validator: {v['uids_per_window']} peers' evaluation, the other peers' steps on a quarter",
         _fmt(v.get("others_quarter_eval_seconds_per_window"), " s"), ""],
        [f"validator: peers that fit a {v['window_seconds']:.0f} s window", _fmt(v["peers_per_window"]),
         _fmt(v["uids_per_window"])],
        ["validator: peak GPU memory", _fmt(v["peak_memory_gb"], " GB"), _fmt(est.get("validator_gpu_memory_gb"), " GB")],
    ]
    if reads := v.get("gather_reads"):  # measured since 2026-12-04
        rows.append([f"validator: {reads['validator_reads']} strict reads of a gather in {reads['threads']} threads "
                     f"({'C kernels' if reads['kernels'] else 'numpy reader'}; one read)",
                     f"{_fmt(reads['validator_reads_seconds'], ' s')} ({_fmt(reads['read_seconds'], ' s')}, "
                     f"{_fmt(reads['threaded_speedup'], 'x')} in threads)",
                     f"within {reads['gather_seconds']:.0f} s"])
    return rows


def _rows_consensus(k: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    ks, acc, sg, fp = k["kept_sets"], k["accumulators"], k["signs"], k["fingerprint"]
    rows += [
        [f"consensus: {k['candidate']} vs {k['reference']}", "consistent" if k["consistent"] else "INCONSISTENT", ""],
        ["consensus: kept sets identical", f"{ks['share_identical']:.6f} of {ks['chunks']:,} chunks "
         f"(worst gap {ks['worst_gap_over_chunk_max']:.1e})", "near-ties only"],
        ["consensus: fixed-point accumulators", f"{acc['bit_identical']}/{acc['tensors']} bit-identical", "all"],
        ["consensus: signs differing", f"{sg['differing']:,} of {sg['coordinates']:,}", "near 0"],
        ["consensus: model_in_sync", f"{_fmt(fp['model_in_sync'])} ({fp['off']}/{fp['positions']} off)", "yes"],
    ]
    return rows


def _rows_noise(n: Mapping[str, Any], est: Mapping[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    sd = n["relative_sd_across_peers"]
    rows += [
        ["noise: loss on random pages, δ_rand mean", f"{n['loss_rand_before']:.3f}, {n['mean_delta_rand']:.3g}", ""],
        ["noise: δ_rand sd/mean across peers, per page",
         ", ".join(f"{x:.3f}" for x in sd), _fmt(n.get("fit_honest_relative_sd"))],
        ["noise: σ̂ (1.4826·MAD/median) across peers", ", ".join(f"{x:.3f}" for x in n["sigma_hat_across_peers"]), ""],
        ["noise: δ_rand cv across pages, per peer",
         ", ".join(f"{x:.3f}" for x in n["rand_cv_across_pages"].values()), ""],
        ["noise: subnet_sim `noise` factor", _fmt(n.get("subnet_sim_noise")), "1.0"],
        ["noise: log-sd of σ̂ over pages (`window_noise`)", _fmt(n.get("window_noise")), "0.94"],
    ]
    proof = n.get("proof_credit") or {}
    if proof.get("credit"):
        rows.append(["noise: proof credit by size per honest peer (share at full credit)",
                     ", ".join(f"{c:.2f} ({proof['full_credit_share'][p]:.2f})" for p, c in proof["credit"].items()),
                     "1.0 intended; micro 0.5"])
    for key, label, micro in (("common", "common steps, 3 groups", "micro: 0.64-0.76"),
                              ("others", "the other peers' steps", "")):
        for suffix, what in (("", f"against each unit's own baseline ({label})"),
                             ("_quarter", f"the same ({label}), reading a secret quarter of the sequences")):
            credit = n.get(f"proof_credit_{key}{suffix}") or {}
            if credit.get("credit"):
                rows.append([f"noise: {what}", ", ".join(f"{c:.2f} ({credit['full_credit_share'][p]:.2f})"
                                                         for p, c in credit["credit"].items()), "" if suffix else micro])
    return rows


ROWS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], list[list[str]]]] = {
    "corpus": _rows_corpus, "window": _rows_window, "memory": _rows_memory, "validator": _rows_validator,
    "consensus": _rows_consensus,
    "noise": _rows_noise,
}


def print_table(result: Mapping[str, Any]) -> None:
    rows = [["figure", "measured", "estimate / reference"], *result.get("table", [])]
    widths = [max(len(str(r[i])) for r in rows) for i in range(3)]
    print()
    for r in rows:
        print("  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(f"\n  {result.get('device_name', result.get('device'))}, {result['mode']} mode, "
          f"{result.get('elapsed_seconds', 0):.0f} s in all", flush=True)
