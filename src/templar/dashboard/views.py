"""The dashboard's HTML: overview, peers, one peer, miners, one miner.

Pure functions of a `Board` (called under its lock). Everything that came from a file or the
chain is escaped; hotkeys in links are checked against the base58 alphabet first. Each page is a
shell (`page`) around a `<main id="live">` fragment that the browser script swaps in place when
the server announces a new version, so a live update never reloads the page or loses the sort.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Iterable
from html import escape
from urllib.parse import quote

from templar.core.verdicts import Status, label_meaning
from templar.dashboard.board import Board
from templar.dashboard.chainwatch import agreement, bucket_label, pairwise
from templar.dashboard.sources import STRIP_WINDOWS, MinerSource, ValidatorSource, valid_hotkey
from templar.dashboard.svg import PALETTE, line_chart, sparkline
from templar.runtime.records import PeerScoreRecord

PASSING = frozenset(s.value for s in Status if s.passes)
"""Status labels that cost a peer nothing (`templar.gauntlet.Status.passes`)."""
WEIGHT_OUTCOMES = {
    "refused": "weights: the chain refused this attempt; the node retries (see next)",
    "gave_up": "weights: no more attempts for this window's weights (see next)",
    "superseded": "weights: replaced by the next weights window's weights before they landed",
    "shadow": "weights: computed and not set (the validator runs with --shadow)",
}
TIMING_WINDOWS = 60
"""Windows of the overview's put and gather timing chart."""
SPARK_WINDOWS = 40
"""Windows of a weight or tokens/s sparkline."""
AGREEMENT_GOOD, AGREEMENT_POOR = 0.9, 0.6
"""Validator agreement (cosine against the others): green from the first, red below the second."""
RUN_STATES = {"live": "live", "behind": "behind", "stale": "stopped or stalled", "finished": "finished",
              "waiting": "waiting"}
"""The run state's label at the top of every page (`Board.run_state`); only `live` is green."""


def meaning(status: str) -> str:
    return WEIGHT_OUTCOMES.get(status) or label_meaning(status)


# ---- formatting ---------------------------------------------------------------------------------

def num(value: float | int | None, fmt: str = ".3f") -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, float) and math.isinf(value):
        return "∞" if value > 0 else "−∞"
    return format(value, fmt)


def sort_value(value: float | int | None) -> str:
    """The `data-v` a table cell sorts by: missing values sort below every number."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-1e308"
    if isinstance(value, float) and math.isinf(value):
        return "1e308" if value > 0 else "-1e307"
    return repr(float(value))


def short(hotkey: str) -> str:
    return hotkey[:8] + "…" if len(hotkey) > 9 else hotkey


def ago(ts: float) -> str:
    s = max(0.0, time.time() - ts)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.1f} h ago"


def peer_link(hotkey: str, label: str = "") -> str:
    text = escape(label or short(hotkey))
    if not valid_hotkey(hotkey):
        return text
    return f'<a href="/peers/{quote(hotkey)}" title="{escape(hotkey)}">{text}</a>'


def badge(status: str) -> str:
    kind = "good" if status == Status.OK else "idle" if status in PASSING else "bad"
    return f'<span class="badge {kind}" title="{escape(meaning(status))}">{escape(status)}</span>'


def strip(statuses: Iterable[tuple[int, str]]) -> str:
    cells = []
    for window, status in statuses:
        kind = "good" if status == Status.OK else "idle" if status in PASSING else "bad"
        cells.append(f'<i class="{kind}" title="window {window}: {escape(status)}"></i>')
    return f'<span class="strip">{"".join(cells)}</span>'


def card(label: str, value: str, sub: str = "", *, cid: str = "") -> str:
    ident = f' id="{cid}"' if cid else ""
    return (f'<div class="card"{ident}><div class="k">{escape(label)}</div><div class="v">{value}</div>'
            f'<div class="s">{sub}</div></div>')


def table(columns: list[tuple[str, str]], rows: list[str], *, tid: str, sortable: bool = True,
          empty: str = "nothing yet", optional: frozenset[int] = frozenset()) -> str:
    """`columns`: (header, type) with type num|text|none; rows are pre-rendered `<tr>`s.

    Columns whose index is in `optional` carry class `opt` and are hidden on a phone-sized screen.
    """
    if not rows:
        return f'<p class="muted">{escape(empty)}</p>'
    head = "".join(
        f'<th data-type="{t}" class="{"sort" if sortable and t != "none" else ""}{" opt" if i in optional else ""}">'
        f"{escape(h)}</th>" for i, (h, t) in enumerate(columns))
    cls = "sortable" if sortable else ""
    return (f'<div class="scroll"><table id="{tid}" class="{cls}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table></div>')


def td(text: str, value: float | int | None = None, cls: str = "") -> str:
    v = f' data-v="{sort_value(value)}"' if value is not None or "num" in cls.split() else ""
    c = f' class="{cls}"' if cls else ""
    return f"<td{c}{v}>{text}</td>"


# ---- the shell ----------------------------------------------------------------------------------

NAV = (("/", "Overview"), ("/peers", "Peers"), ("/miners", "Miners"))


def page(board: Board, title: str, body: str, active: str) -> str:
    nav = "".join(f'<a href="{href}"{" class=active" if href == active else ""}>{name}</a>'
                  for href, name in NAV)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · templar</title>
<link rel="stylesheet" href="/static/dashboard.css">
<link rel="icon" href="data:,">
<script src="/static/dashboard.js" defer></script>
</head><body>
<header><span class="brand">templar</span><nav>{nav}</nav>
<span id="live-state" class="live" title="this page updates itself while connected; the run's own state is the line at the top of the page">connecting…</span></header>
<main id="live" data-version="{board.version}">{body}</main>
<footer>read-only · local · {escape(board.config.chain_label or "no chain")}</footer>
</body></html>"""


def run_line(board: Board, v: ValidatorSource | None) -> str:
    """What the run is doing (live, behind, stopped or stalled, finished), and its alert states."""
    state = board.run_state(v)
    alerts = "".join(f"<li>{escape(a)}</li>" for a in state.alerts)
    return (f'<section class="runstate {state.kind}" id="run-state"><span class="dot" aria-hidden="true"></span>'
            f'<b>{escape(RUN_STATES[state.kind])}</b> <span class="muted">{escape(state.detail)}</span>'
            + (f'<ul class="alerts">{alerts}</ul>' if alerts else "") + "</section>")


def problems_box(board: Board) -> str:
    items = board.problems()
    if not items:
        return ""
    lis = "".join(f"<li>{escape(p)}</li>" for p in items[:40])
    more = f"<li>… and {len(items) - 40} more</li>" if len(items) > 40 else ""
    return (f'<details class="problems" open><summary>{len(items)} thing(s) missing or unreadable</summary>'
            f"<ul>{lis}{more}</ul></details>")


def validator_picker(board: Board, chosen: ValidatorSource | None, base: str) -> str:
    if len(board.validators) < 2 or chosen is None:
        return ""
    links = " ".join(
        f'<a href="{base}?v={quote(v.name)}"{" class=active" if v is chosen else ""}>{escape(v.name)}</a>'
        for v in board.validators)
    return f'<p class="picker">validator view: {links}</p>'


# ---- overview -----------------------------------------------------------------------------------

def overview(board: Board, vname: str | None) -> str:
    v = board.validator(vname)
    snap = board.snapshot
    last = v.last_window if v else None
    parts = [run_line(board, v), problems_box(board), validator_picker(board, v, "/")]
    current = board.current_window()
    live = board.run_state(v).kind in ("live", "behind")
    window_sub = f"last scored {last.window}" if last else "no window scored yet"
    if not live and last is not None:  # a finished or stopped run: its last window, not the chain's
        current, window_sub = last.window, "last scored" + (f"; the chain is at {board.current_window()}"
                                                             if board.current_window() is not None else "")
    lead = snap.lead() if snap else None
    lead_text, lead_sub = "–", ""
    if lead:
        lead_text = f"uid {lead.uid}"
        lead_sub = f"{escape(board.label(lead.hotkey) or short(lead.hotkey))} · {lead.stake:,.0f} τ"
    windows = list(v.windows) if v else []
    loss_sub = ""
    if len(windows) > 1:
        loss_sub = f"from {windows[0].holdout_loss:.3f} at window {windows[0].window}"
    cards = [
        card("window", num(current if current is not None else (last.window if last else None), "d"),
             escape(window_sub), cid="c-window"),
        card("global step", num(last.global_step if last else None, "d"), cid="c-step"),
        card("learning rate", num(last.learning_rate if last else None, ".2e")),
        card("held-out loss", num(last.holdout_loss if last else None, ".4f"), escape(loss_sub), cid="c-loss"),
        card("peers aggregated", num(last.peers_aggregated if last else None, "d"),
             f"gathered {last.gathered} · evaluated {last.evaluated}" if last else ""),
        card("lead validator", lead_text, lead_sub),
        _weights_card(v),
        card("block", num(snap.block if snap else None, "d"), escape(ago(snap.taken_at)) if snap else ""),
    ]
    parts.append(f'<section class="cards">{"".join(cards)}</section>')
    loss_pts = [(w.window, w.holdout_loss) for w in windows]
    timing = [("validator: window (gather → saved)",
               [(w.window, w.wall_seconds) for w in windows[-TIMING_WINDOWS:]])]
    gathers = [(w.window, w.gather_seconds) for w in windows[-TIMING_WINDOWS:] if w.gather_seconds is not None]
    if gathers:
        timing.append(("validator: gather", gathers))
    put = _median_put(board.miners, {w.window for w in windows[-TIMING_WINDOWS:]} if windows else None)
    if put:
        timing.append(("miners: put (median upload)", put))
    parts.append('<section class="grid2">'
                 f'<div class="panel">{line_chart([("held-out loss", loss_pts)], title="Held-out loss", y_label="loss")}</div>'
                 f'<div class="panel">{line_chart(timing, title="Put / gather timing (s)", y_label="seconds", y_min=0)}</div>'
                 "</section>")
    parts.append(f'<section class="grid2"><div class="panel"><h2>Recent windows</h2>{_windows_table(windows)}</div>'
                 f'<div class="panel"><h2>Top-G now</h2>{_top_g(board, v)}</div></section>')
    parts.append(f'<section class="panel"><h2>Validator agreement</h2>{_agreement(board)}</section>')
    parts.append(f'<section class="panel"><h2>Weight setting</h2>{_weights_table(v)}</section>')
    return "".join(parts)


def _weights_card(v: ValidatorSource | None) -> str:
    """The last word on this validator's weights: set (which window), or refused and what next."""
    last = v.weights[-1] if v and v.weights else None
    if last is None:
        return card("weights", "–", "none attempted yet", cid="c-weights")
    if last.outcome == "set":
        return card("weights", f"set w{last.window}", f"attempt {last.attempt}", cid="c-weights")
    if last.outcome == "shadow":
        return card("weights", "shadow", escape(f"w{last.window}: {last.uids} uids computed, never set (--shadow)"),
                    cid="c-weights")
    label = {"refused": "retrying", "gave_up": "not set", "superseded": "replaced"}.get(last.outcome, last.outcome)
    return card("weights", escape(label), escape(f"{last.reason or last.outcome}: {last.next}"[:120]),
                cid="c-weights")


def _weights_table(v: ValidatorSource | None) -> str:
    """The recent attempts: every refusal the chain gave, as the chain said it, and what came next."""
    records = list(v.weights)[-12:] if v else []
    rows = [f"<tr>{td(str(r.window), r.window, 'num')}{td(str(r.attempt), r.attempt, 'num opt')}"
            f"{td(badge(r.outcome if r.outcome != 'set' else 'ok'))}{td(escape(r.reason or '–'), cls='opt')}"
            f"{td(escape(r.detail or '–'), cls='opt')}{td(escape(r.next or '–'), cls='wrap')}</tr>"
            for r in reversed(records)]
    cols = [("window", "num"), ("attempt", "num"), ("outcome", "text"), ("reason", "text"), ("chain said", "text"),
            ("next", "text")]
    return table(cols, rows, tid="weights", sortable=False, empty="no weights attempted yet",
                 optional=frozenset({1, 3, 4}))


def _median_put(miners: list[MinerSource], windows: set[int] | None) -> list[tuple[float, float]]:
    by_window: dict[int, list[float]] = {}
    for m in miners:
        for r in m.windows:
            if r.uploaded and (windows is None or r.window in windows):
                by_window.setdefault(r.window, []).append(r.upload_seconds)
    return [(w, statistics.median(s)) for w, s in sorted(by_window.items())][-TIMING_WINDOWS:]


def _windows_table(windows) -> str:
    rows = [f"<tr>{td(str(w.window), w.window, 'num')}{td(str(w.global_step), w.global_step, 'num opt')}"
            f"{td(num(w.holdout_loss, '.4f'), w.holdout_loss, 'num')}{td(f'{w.gathered}', w.gathered, 'num opt')}"
            f"{td(str(w.evaluated), w.evaluated, 'num opt')}{td(str(w.peers_aggregated), w.peers_aggregated, 'num')}"
            f"{td(num(w.wall_seconds, '.1f'), w.wall_seconds, 'num opt')}{td('✓' if w.weights_set else '')}</tr>"
            for w in reversed(windows[-10:])]
    cols = [("window", "num"), ("step", "num"), ("loss", "num"), ("gathered", "num"), ("evaluated", "num"),
            ("aggregated", "num"), ("wall s", "num"), ("weights", "text")]
    return table(cols, rows, tid="windows", sortable=False, empty="no window scored yet",
                 optional=frozenset({1, 3, 4, 6}))


def _top_g(board: Board, v: ValidatorSource | None) -> str:
    if v is None:
        return '<p class="muted">no validator state dir</p>'
    top = sorted((r for r in board.peers(v).values() if r.in_top_g), key=lambda r: -r.weight)
    if not top:
        return '<p class="muted">no peer in the top-G yet</p>'
    best = max(r.weight for r in top) or 1.0
    rows = []
    for r in top:
        name = board.label(r.hotkey)
        width = 100 * r.weight / best
        rows.append(f'<div class="barrow"><span class="bl">uid {r.uid} {peer_link(r.hotkey, name)}</span>'
                    f'<svg class="bar" viewBox="0 0 100 10" preserveAspectRatio="none" aria-hidden="true">'
                    f'<rect width="{width:.1f}" height="10" rx="2" fill="{PALETTE[0]}"/></svg>'
                    f'<span class="bv">{r.weight:.3f}</span></div>')
    return "".join(rows)


def _agreement(board: Board) -> str:
    snap = board.snapshot
    if snap is None:
        return '<p class="muted">needs the chain: no snapshot yet</p>'
    weights = snap.validator_weights  # not the miners' self-weights: any uid may set one
    if not weights:
        return '<p class="muted">no validator has set weights yet</p>'
    stakes = {n.uid: n.stake for n in snap.neurons}
    rows = []
    for a in agreement(weights, stakes):
        n = snap.by_uid.get(a.uid)
        hk = n.hotkey if n else ""
        cos = "–" if a.cosine is None else f"{a.cosine:.3f}"
        cls = ("" if a.cosine is None else "good" if a.cosine >= AGREEMENT_GOOD
               else "warn" if a.cosine >= AGREEMENT_POOR else "bad")
        rows.append(f"<tr>{td(str(a.uid), a.uid, 'num')}<td>{peer_link(hk, board.label(hk) or short(hk))}</td>"
                    f"{td(f'{a.stake:,.1f}', a.stake, 'num opt')}{td(str(a.uids_weighted), a.uids_weighted, 'num opt')}"
                    f"{td('–' if a.top_uid is None else str(a.top_uid), a.top_uid, 'num opt')}"
                    f'<td class="num {cls}" data-v="{sort_value(a.cosine)}">{cos}</td>'
                    f"{td(str(n.last_update) if n else '–', n.last_update if n else None, 'num opt')}</tr>")
    cols = [("uid", "num"), ("validator", "text"), ("stake τ", "num"), ("uids weighted", "num"), ("top uid", "num"),
            ("cosine vs others", "num"), ("last update", "num")]
    out = table(cols, rows, tid="agreement", optional=frozenset({2, 3, 4, 6}))
    if len(weights) > 1:
        uids = sorted(weights)
        pw = pairwise(weights, uids[:16])
        head = "".join(f"<th>{u}</th>" for u in uids)
        body = "".join(
            f"<tr><th>{a}</th>" + "".join(
                f'<td class="num">{"–" if pw[(a, b)] is None else f"{pw[(a, b)]:.2f}"}</td>' for b in uids)
            + "</tr>" for a in uids[:16])
        out += f'<div class="scroll"><table class="matrix"><thead><tr><th>uid</th>{head}</tr></thead>{body}</table></div>'
    else:
        out += '<p class="muted">one validator has set weights: agreement needs a second</p>'
    return out


# ---- peers --------------------------------------------------------------------------------------

def peers(board: Board, vname: str | None) -> str:
    v = board.validator(vname)
    parts = [run_line(board, v), problems_box(board), validator_picker(board, v, "/peers")]
    if v is None:
        return "".join(parts) + subnet_table(board)
    current = board.peers(v)
    hidden = len(v.current()) - len(current)
    snap = board.snapshot
    chain_hk = snap.by_hotkey if snap else {}
    rows = []
    for hotkey, r in sorted(current.items(), key=lambda kv: (-kv[1].weight, kv[1].uid)):
        name = board.label(hotkey)
        hist = v.history.get(hotkey, ())
        weights = [x.weight for x in hist][-SPARK_WINDOWS:]
        neuron = chain_hk.get(hotkey)
        top = "✓" if r.in_top_g else ""
        rows.append(
            f'<tr data-hotkey="{escape(hotkey)}">{td(str(r.uid), r.uid, "num")}'
            f'<td data-v="{escape(name or hotkey)}">{peer_link(hotkey, name)}'
            f'{"" if not name else f"<small class=opt> {escape(short(hotkey))}</small>"}</td>'
            f'<td><span class="opt">{strip(v.recent_statuses(hotkey))}</span> {badge(r.status)}</td>'
            f"{td(num(r.sync_steps, '.2f'), r.sync_steps, 'num opt')}"
            f"{td(num(r.delta_assigned, '+.4f'), r.delta_assigned, 'num opt')}"
            f"{td(num(r.delta_rand, '+.4f'), r.delta_rand, 'num opt')}"
            f"{td(num(r.mu, '+.3f'), r.mu, 'num opt')}{td(num(r.paid_mu, '+.3f'), r.paid_mu, 'num opt')}"
            f"{td(num(r.rating, '.2f'), r.rating, 'num opt')}"
            f"{td(num(r.score, '.3f'), r.score, 'num')}{td(num(r.weight, '.3f'), r.weight, 'num')}"
            f'<td data-v="{1 if r.in_top_g else 0}" class="c">{top}</td>'
            f"<td class=opt>{sparkline(weights, label=f'weight of uid {r.uid}, last {len(weights)} windows', lo=0)}</td>"
            f"{td(num(neuron.stake, ',.0f') if neuron else '–', neuron.stake if neuron else None, 'num opt')}</tr>")
    cols = [("uid", "num"), ("peer", "text"), ("status", "none"), ("sync", "num"), ("δ assigned", "num"),
            ("δ rand", "num"), ("μ", "num"), ("μ̃ (paid)", "num"), ("rating", "num"), ("score", "num"),
            ("weight", "num"), ("top-G", "num"), ("weight history", "none"), ("stake τ", "num")]
    window = v.table_window()
    parts.append(f'<section class="panel"><h2>Peers <small>{escape(v.name)}\'s view, window '
                 f'{num(window, "d")} · {len(rows)} peers{_hidden_note(hidden)} · click a header to sort</small></h2>'
                 f'{STRIP_LEGEND}'
                 f'{table(cols, rows, tid="peers", empty="no peer scored yet", optional=frozenset({3, 4, 5, 6, 7, 8, 12, 13}))}'
                 "</section>")
    return "".join(parts)


STRIP_LEGEND = (f'<p class="legend muted opt" id="strip-legend">status: one cell per window, the last {STRIP_WINDOWS}, '
                'oldest first: <span class="strip"><i class="good"></i></span>ok '
                '<span class="strip"><i class="idle"></i></span>warm-up, not sampled, or another status that costs '
                'the peer nothing <span class="strip"><i class="bad"></i></span>a failed fast evaluation (hover a '
                'cell for its window and status); then the last status</p>')
"""What the status strip's colours mean (`strip`), above the table that shows it."""


def _hidden_note(hidden: int) -> str:
    if not hidden:
        return ""
    return (f' · <span title="registered, no bucket committed, never scored but missing (the subnet owner\'s uid 0, '
            f'or a hotkey never started)">{hidden} hotkey{"s" if hidden > 1 else ""} without a bucket not shown</span>')


def proof_failed(rec: PeerScoreRecord) -> bool:
    """Primary evaluation ran and the assigned-data gain did not beat the random-data gain."""
    return (rec.evaluated and rec.delta_assigned is not None and rec.delta_rand is not None
            and not rec.delta_assigned > rec.delta_rand)


def chain_role(neuron) -> str:
    """The role a neuron's commitment declares, and its permit where the two part: validators score the
    miners' side (a permit from stake anyone may add makes no validator), and only a declared validator
    with a permit may lead. A hotkey that committed nothing declares no role (validators find no payload)."""
    if not neuron.commitment:
        return "none"
    if neuron.validates:
        return "validator" if neuron.validator_permit else "validator, no permit"
    return "miner, permit" if neuron.validator_permit else "miner"


def subnet_table(board: Board) -> str:
    """Without a validator's score log, the chain's own view: every neuron with the lead's weight."""
    snap = board.snapshot
    note = ('<p class="muted">no validator state dir (--validator.dir or --localnet): scores, statuses and '
            "histories come from a validator's score log; below is what the chain says</p>")
    if snap is None:
        return note
    lead = snap.lead()
    lead_row = snap.weights.get(lead.uid, {}) if lead else {}
    rows = []
    for n in snap.neurons:
        w = lead_row.get(n.uid)
        rows.append(f'<tr data-hotkey="{escape(n.hotkey)}">{td(str(n.uid), n.uid, "num")}'
                    f'<td data-v="{escape(n.hotkey)}">{peer_link(n.hotkey, board.label(n.hotkey))}</td>'
                    f"{td(f'{n.stake:,.1f}', n.stake, 'num opt')}<td>{chain_role(n)}</td>"
                    f"{td(str(n.last_update), n.last_update, 'num opt')}<td class=opt>{escape(bucket_label(n))}</td>"
                    f"{td(num(w, '.3f'), w, 'num')}</tr>")
    cols = [("uid", "num"), ("hotkey", "text"), ("stake τ", "num"), ("role", "text"), ("last update", "num"),
            ("bucket", "text"), ("lead's weight", "num")]
    return note + (f'<section class="panel"><h2>Subnet <small>block {snap.block} · {len(rows)} neurons</small></h2>'
                   f'{table(cols, rows, tid="subnet", optional=frozenset({2, 4, 5}))}</section>')


def why(rec: PeerScoreRecord, prev: PeerScoreRecord | None) -> str:
    """Why this window moved the peer's standing, in words an operator can act on."""
    reasons = []
    if rec.status not in PASSING:
        reasons.append(f"fast evaluation failed: {meaning(rec.status)}; μ multiplied by φ")
    if rec.evaluated and rec.delta_assigned is not None and rec.delta_rand is not None:
        change = f"; μ {prev.mu:+.3f} → {rec.mu:+.3f}" if prev is not None else ""
        if proof_failed(rec):
            reasons.append(f"primary evaluation: δ assigned {num(rec.delta_assigned, '+.4f')} did not beat "
                           f"δ rand {num(rec.delta_rand, '+.4f')} (no proof of its assigned work){change}")
        else:
            reasons.append(f"primary evaluation: δ assigned beat δ rand (proof of computation){change}")
    if rec.score <= 0 and rec.mu <= 0 and not reasons:
        reasons.append("score 0: μ ≤ 0 (no proof of computation yet)")
    return "; ".join(reasons)


def peer(board: Board, hotkey: str, vname: str | None) -> str | None:
    v = board.validator(vname)
    snap = board.snapshot
    neuron = snap.by_hotkey.get(hotkey) if snap else None
    hist = list(v.history.get(hotkey, ())) if v else []
    if not hist and neuron is None and hotkey not in board.labels:
        return None
    name = board.label(hotkey)
    node = board.labels.get(hotkey)
    book = v.book.get(hotkey) if v else None
    last = hist[-1] if hist else None
    title = f"uid {last.uid if last else (neuron.uid if neuron else '?')}" + (f" · {name}" if name else "")
    facts = [
        ("hotkey", f"<code>{escape(hotkey)}</code>"),
        ("role / strategy", escape(f"{node.role} / {node.strategy}") if node else "–"),
        ("status now", badge(last.status) + f" {escape(meaning(last.status))}" if last else "–"),
        ("μ · μ̃ (paid) · rating · score", f"{num(last.mu, '+.3f')} · {num(last.paid_mu, '+.3f')} · "
         f"{num(last.rating, '.2f')} · {num(last.score, '.3f')}" if last else "–"),
        ("weight (this validator)", num(last.weight, ".4f") if last else "–"),
        ("in top-G", ("yes" if last.in_top_g else "no") if last else "–"),
    ]
    if book:
        facts += [("evaluations", f"{book.primary_evals} primary · {book.fast_eval_passes} fast passed · "
                                  f"{book.fast_eval_fails} fast failed"),
                  ("rating (μ, σ)", f"{book.rating_mu:.2f}, {book.rating_sigma:.2f}"),
                  ("seen", f"windows {book.first_seen_window}–{book.last_seen_window}")]
    if neuron:
        facts += [("role on chain", "validator (its commitment declares it)" if neuron.validates
                   else "miner" if neuron.commitment else "none (no commitment)"),
                  ("stake", f"{neuron.stake:,.3f} τ"), ("validator permit", "yes" if neuron.validator_permit else "no"),
                  ("last update (block)", str(neuron.last_update)), ("bucket", escape(bucket_label(neuron)))]
        if snap and neuron.uid is not None:
            given = [(vu, row.get(neuron.uid, 0.0)) for vu, row in sorted(snap.validator_weights.items())]
            if given:
                facts.append(("weight on chain by validator",
                              ", ".join(f"uid {vu}: {w:.3f}" for vu, w in given)))
    dl = "".join(f"<dt>{escape(k)}</dt><dd>{val}</dd>" for k, val in facts)
    parts = [f'<p class="crumbs"><a href="/peers">Peers</a> › {escape(title)}</p>', run_line(board, v),
             validator_picker(board, v, f"/peers/{quote(hotkey)}"),
             f'<section class="panel"><h2>{escape(title)}</h2><dl class="facts">{dl}</dl></section>']
    if hist:
        xs = [r.window for r in hist]
        parts.append('<section class="grid3">'
                     f'<div class="panel">{line_chart([("weight", list(zip(xs, [r.weight for r in hist], strict=True))), ("score", list(zip(xs, [r.score for r in hist], strict=True)))], title="Weight and score", y_min=0)}</div>'
                     f'<div class="panel">{line_chart([("μ", list(zip(xs, [r.mu for r in hist], strict=True)))], title="μ (proof of computation)")}</div>'
                     f'<div class="panel">{line_chart([("rating", list(zip(xs, [r.rating for r in hist], strict=True)))], title="LossRating")}</div>'
                     "</section>")
        penalties = []
        rows = []
        prev = None
        for r in hist:
            reason = why(r, prev)
            if r.status not in PASSING or proof_failed(r):
                penalties.append(f"<li><b>window {r.window}</b>: {escape(reason)}</li>")
            rows.append(
                f"<tr>{td(str(r.window), r.window, 'num')}<td>{badge(r.status)}</td>"
                f"{td(num(r.sync_steps, '.2f'), r.sync_steps, 'num opt')}"
                f"{td(num(r.delta_assigned, '+.4f'), r.delta_assigned, 'num opt')}"
                f"{td(num(r.delta_rand, '+.4f'), r.delta_rand, 'num opt')}{td(num(r.mu, '+.3f'), r.mu, 'num')}"
                f"{td(num(r.rating, '.2f'), r.rating, 'num opt')}{td(num(r.score, '.3f'), r.score, 'num')}"
                f"{td(num(r.weight, '.3f'), r.weight, 'num')}<td class='c opt'>{'✓' if r.in_top_g else ''}</td>"
                f"<td class='why opt'>{escape(reason)}</td></tr>")
            prev = r
        counts: dict[str, int] = {}
        for r in hist:
            counts[r.status] = counts.get(r.status, 0) + 1
        summary = " ".join(f"{badge(s)}×{c}" for s, c in sorted(counts.items(), key=lambda kv: -kv[1]))
        pen = (f"<ul class=penalties>{''.join(reversed(penalties[-30:]))}</ul>" if penalties
               else '<p class="muted">never penalised in the windows kept</p>')
        parts.append(f'<section class="panel"><h2>Why it was penalised</h2><p>{summary}</p>{pen}</section>')
        cols = [("window", "num"), ("status", "text"), ("sync", "num"), ("δ assigned", "num"), ("δ rand", "num"),
                ("μ", "num"), ("rating", "num"), ("score", "num"), ("weight", "num"), ("top-G", "text"),
                ("why", "text")]
        parts.append(f'<section class="panel"><h2>History <small>{len(hist)} windows</small></h2>'
                     f'{table(cols, list(reversed(rows)), tid="history", optional=frozenset({2, 3, 4, 6, 9, 10}))}</section>')
    else:
        parts.append('<p class="muted">this validator has not scored this peer yet</p>')
    return "".join(parts)


def not_found(board: Board, what: str) -> str:
    return f'<section class="panel"><h2>Not found</h2><p>{escape(what)}</p><p><a href="/">Overview</a></p></section>'
