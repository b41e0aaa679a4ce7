"""The dashboard's Miners pages: every miner's state directory at a glance (phase, busy fraction,
tokens/s, uploads) and one miner's windows, read-only (the pages' shared parts are `views`')."""

from __future__ import annotations

import math
from html import escape
from urllib.parse import quote

from templar.dashboard.board import Board
from templar.dashboard.sources import BUSY_WINDOWS, MinerSource
from templar.dashboard.svg import PALETTE, line_chart, sparkline
from templar.dashboard.views import SPARK_WINDOWS, num, problems_box, run_line, table, td


def miners(board: Board) -> str:
    parts = [run_line(board, board.validator(None)), problems_box(board)]
    rows = []
    snap = board.snapshot
    for m in board.miners:
        r = m.trained  # a trailing catch-up is shown beside the phase, not as the miner's numbers
        node = next((n for n in board.labels.values() if n.name == m.name), None)
        uid = node.uid if node else None
        tps = [x.tokens_per_second for x in m.windows if x.phase != "catchup"][-SPARK_WINDOWS:]
        busy = m.busy
        rows.append(
            f"<tr>{td(num(uid, 'd'), uid, 'num opt')}<td data-v=\"{escape(m.name)}\"><a href=\"/miners/{quote(m.name)}\">"
            f"{escape(m.name)}</a></td><td>{_phase(m)}</td>"
            f"<td class=opt>{escape(r.strategy if r else (node.strategy if node else '–'))}</td>"
            f"{td(num(r.window if r else None, 'd'), r.window if r else None, 'num')}"
            f"{td(num(r.global_step if r else None, 'd'), r.global_step if r else None, 'num opt')}"
            f"{td(num(r.loss if r else None, '.4f'), r.loss if r else None, 'num')}"
            f"{td(num(r.tokens_per_second if r else None, ',.0f'), r.tokens_per_second if r else None, 'num opt')}"
            f"{td(num(100 * busy if busy is not None else None, '.0f') + ('%' if busy is not None else ''), busy, 'num')}"
            f"{td(num(100 * r.overhead_share if r else None, '.1f') + ('%' if r else ''), r.overhead_share if r else None, 'num opt')}"
            f"{td(num(r.upload_bytes / 1e3 if r else None, ',.0f'), r.upload_bytes if r else None, 'num opt')}"
            f"{td(num(r.upload_seconds if r else None, '.2f'), r.upload_seconds if r else None, 'num opt')}"
            f"{td(num(r.peers_aggregated if r else None, 'd'), r.peers_aggregated if r else None, 'num opt')}"
            f"<td class=opt>{sparkline(tps, label=f'tokens/s of {m.name}', color=PALETTE[2])}</td></tr>")
    cols = [("uid", "num"), ("miner", "text"), ("phase", "text"), ("strategy", "text"), ("trained", "num"),
            ("step", "num"), ("loss", "num"), ("tok/s", "num"), ("busy", "num"), ("overhead", "num"),
            ("upload kB", "num"), ("upload s", "num"), ("aggregated", "num"), ("tok/s history", "none")]
    note = "" if snap is None else f" · chain block {snap.block}"
    parts.append(f'<section class="panel"><h2>Miners <small>{len(rows)} state dirs{escape(note)}</small></h2>'
                 f'{table(cols, rows, tid="miners", empty="no miner state dir: pass --miner.dir or --localnet", optional=frozenset({0, 3, 5, 7, 9, 10, 11, 12, 13}))}'
                 f'<p class="muted">busy: training seconds over the windows\' wall-clock seconds, the mean of the last '
                 f'{BUSY_WINDOWS} windows trained (the GPU\'s compute utilisation)</p></section>')
    return "".join(parts)


def _phase(m: MinerSource) -> str:
    """The phase of its last trained window, then any catch-up after it: a window that ended waiting
    for the lead's update (a lead that stopped first, or a late one) is said as such, and the
    miner's numbers stay those of the window it trained."""
    trained, after = m.trained, m.catchups_after
    phase = trained.phase if trained else m.phase()
    kind = "good" if phase == "active" else "idle" if phase in {"warmup", "catchup", "startup"} else "bad"
    title = escape(m.sync.text) if m.sync else ""
    out = f'<span class="badge {kind}" title="{title}">{escape(phase)}</span>'
    if trained and after:
        windows = f"w{after[0].window}" + (f"–{after[-1].window}" if len(after) > 1 else "")
        out += (f' <span class="badge idle" title="after its last trained window, {len(after)} window(s) ended '
                f'waiting for the lead\'s update (catch-up): the lead stopped or published late">'
                f"then catch-up {windows}</span>")
    return out


def miner(board: Board, name: str) -> str | None:
    m = board.miner(name)
    if m is None:
        return None
    r = m.trained
    ws = list(m.windows)
    xs = [w.window for w in ws]
    facts = [("phase", _phase(m)), ("join state ([SYNC])", escape(m.sync.text) if m.sync else "–"),
             ("strategy", escape(r.strategy) if r else "–"), ("last window trained", num(r.window if r else None, "d")),
             ("global step", num(r.global_step if r else None, "d")),
             ("tokens/s", num(r.tokens_per_second if r else None, ",.0f")),
             ("busy", (f"{100 * m.busy:.0f}% of the wall-clock training (last {BUSY_WINDOWS} windows trained)"
                       if m.busy is not None else "–")),
             ("overhead", (num(100 * r.overhead_share, ".1f") + "% of the window") if r else "–"),
             ("last upload", f"{r.upload_bytes / 1e3:,.1f} kB in {r.upload_seconds:.2f}s"
              if r and r.uploaded else "not uploaded" if r else "–"),
             ("last aggregate applied", f"{r.peers_aggregated} peers at step {r.global_step}" if r else "–")]
    dl = "".join(f"<dt>{escape(k)}</dt><dd>{val}</dd>" for k, val in facts)
    parts = [f'<p class="crumbs"><a href="/miners">Miners</a> › {escape(name)}</p>', run_line(board, board.validator(None)),
             problems_box(board),
             f'<section class="panel"><h2>{escape(name)}</h2><dl class="facts">{dl}</dl></section>']
    if ws:
        parts.append('<section class="grid2">'
                     f'<div class="panel">{line_chart([("tokens/s", list(zip(xs, [w.tokens_per_second for w in ws], strict=True)))], title="Tokens per second", y_min=0)}</div>'
                     f'<div class="panel">{line_chart([("loss", [(w.window, w.loss if w.loss is not None else math.nan) for w in ws])], title="Training loss")}</div>'
                     f'<div class="panel">{line_chart([("upload kB", [(w.window, w.upload_bytes / 1e3) for w in ws])], title="Upload size (kB)", bars=True, y_min=0)}</div>'
                     f'<div class="panel">{line_chart([("busy %", [(w.window, 100 * w.utilisation) for w in ws if w.train_seconds > 0]), ("overhead %", [(w.window, 100 * w.overhead_share) for w in ws])], title="Busy: training; overhead (% of the window)", y_min=0)}</div>'
                     "</section>")
        rows = [f"<tr>{td(str(w.window), w.window, 'num')}<td>{escape(w.phase)}</td>"
                f"{td(str(w.global_step), w.global_step, 'num opt')}{td(num(w.loss, '.4f'), w.loss, 'num')}"
                f"{td(num(w.tokens_per_second, ',.0f'), w.tokens_per_second, 'num opt')}"
                f"{td(str(w.pages), w.pages, 'num opt')}"
                f"{td(num(100 * w.utilisation, '.0f'), w.utilisation, 'num')}"
                f"{td(num(100 * w.overhead_share, '.1f'), w.overhead_share, 'num opt')}"
                f"{td('✓' if w.uploaded else '✗', cls='opt')}"
                f"{td(num(w.upload_bytes / 1e3, ',.1f'), w.upload_bytes, 'num')}"
                f"{td(num(w.upload_seconds, '.2f'), w.upload_seconds, 'num opt')}"
                f"{td(str(w.peers_aggregated), w.peers_aggregated, 'num opt')}</tr>" for w in reversed(ws[-200:])]
        cols = [("window", "num"), ("phase", "text"), ("step", "num"), ("loss", "num"), ("tok/s", "num"),
                ("pages", "num"), ("busy %", "num"), ("overhead %", "num"), ("uploaded", "text"), ("kB", "num"),
                ("upload s", "num"), ("aggregated", "num")]
        parts.append(f'<section class="panel"><h2>Windows</h2>'
                     f'{table(cols, rows, tid="mwindows", optional=frozenset({2, 4, 5, 7, 8, 10, 11}))}</section>')
    return "".join(parts)
