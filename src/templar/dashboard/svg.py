"""Charts drawn on the server as inline SVG: no chart library, no CDN, no script needed to see them.

Every function returns an `<svg>` string that scales with its container (`viewBox`, width 100 %).
Non-finite values (a peer never evaluated has no δ; a sync score can be +inf) leave a gap
instead of breaking the scale. Colours are presentation attributes, not inline styles, so the
page's Content-Security-Policy can forbid inline CSS.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

PALETTE = ("#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d",
           "#9333ea", "#ea580c", "#0d9488", "#4f46e5")

Point = tuple[float, float]


def _finite(points: Sequence[Point]) -> list[Point]:
    return [(x, y) for x, y in points if math.isfinite(x) and math.isfinite(y)]


def _nice_ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9 and len(ticks) < 12:
        ticks.append(round(t, 12))
        t += step
    return ticks


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10_000:
        return f"{v / 1000:.0f}k"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3g}"


def _path(points: Sequence[Point], sx, sy) -> str:
    """A path with a gap wherever the series has a non-finite value."""
    parts, pen_down = [], False
    for x, y in points:
        if not (math.isfinite(x) and math.isfinite(y)):
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{sx(x):.1f},{sy(y):.1f}")
        pen_down = True
    return " ".join(parts)


def sparkline(values: Sequence[float], *, width: int = 120, height: int = 28, color: str = PALETTE[0],
              label: str = "", lo: float | None = None, hi: float | None = None) -> str:
    """A tiny trend line with its last point marked; `label` becomes the tooltip and aria-label."""
    pts = [(float(i), float(v)) for i, v in enumerate(values)]
    good = _finite(pts)
    title = f"<title>{escape(label)}</title>" if label else ""
    head = (f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
            f'role="img" aria-label="{escape(label)}">{title}')
    if not good:
        return head + f'<line x1="0" y1="{height / 2}" x2="{width}" y2="{height / 2}" stroke="#cbd5e1" ' \
                      'stroke-dasharray="2 3"/></svg>'
    ys = [y for _, y in good]
    lo = min(ys) if lo is None else lo
    hi = max(ys) if hi is None else hi
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    n = max(len(pts) - 1, 1)
    sx = lambda x: 2 + (width - 4) * x / n  # noqa: E731
    sy = lambda y: height - 3 - (height - 6) * (y - lo) / (hi - lo)  # noqa: E731
    lx, ly = good[-1]
    return (head + f'<path d="{_path(pts, sx, sy)}" fill="none" stroke="{color}" stroke-width="1.5"/>'
            f'<circle cx="{sx(lx):.1f}" cy="{sy(ly):.1f}" r="2.2" fill="{color}"/></svg>')


def line_chart(series: Sequence[tuple[str, Sequence[Point]]], *, title: str, x_label: str = "window",
               y_label: str = "", width: int = 480, height: int = 230, bars: bool = False,
               y_min: float | None = None) -> str:
    """Lines (or bars for a single series) with axes, ticks and a legend; an empty chart says so."""
    left, right, top, bottom = 52, 12, 28, 34
    longest = max((len(name) for name, _ in series), default=0)
    per_row = 1 if longest > 20 else 2 if longest > 12 else 4
    legend_rows = math.ceil(len(series) / per_row) if len(series) > 1 else 0
    top += 16 * legend_rows
    all_pts = [p for _, pts in series for p in _finite(pts)]
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
           f'preserveAspectRatio="xMidYMid meet">',
           f'<text x="{left}" y="16" class="ct">{escape(title)}</text>']
    if not all_pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" class="muted">'
                   "no data yet</text></svg>")
        return "".join(out)
    xs = [p[0] for p in all_pts]
    ys = [p[1] for p in all_pts]
    x0, x1 = min(xs), max(xs)
    if bars:
        x0, x1 = x0 - 0.5, x1 + 0.5
    elif x1 - x0 < 1e-12:
        x0, x1 = x0 - 1, x1 + 1
    y0 = min(ys) if y_min is None else min(y_min, min(ys))
    y1 = max(ys)
    if y1 - y0 < 1e-12:
        y0, y1 = (y0, y0 + 1) if y_min is not None else (y0 - 1, y1 + 1)
    pad = (y1 - y0) * 0.06
    y0, y1 = (y0 if y_min is not None else y0 - pad), y1 + pad
    pw, ph = width - left - right, height - top - bottom
    sx = lambda x: left + pw * (x - x0) / (x1 - x0)  # noqa: E731
    sy = lambda y: top + ph - ph * (y - y0) / (y1 - y0)  # noqa: E731
    for t in _nice_ticks(y0, y1):
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{sy(t) + 4:.1f}" text-anchor="end" class="tick">{_fmt(t)}</text>')
    for t in _nice_ticks(x0, x1, 6):
        if float(t).is_integer():  # windows and steps are whole numbers
            out.append(f'<text x="{sx(t):.1f}" y="{height - bottom + 16}" text-anchor="middle" '
                       f'class="tick">{_fmt(t)}</text>')
    out.append(f'<line x1="{left}" x2="{width - right}" y1="{top + ph}" y2="{top + ph}" class="axis"/>')
    out.append(f'<text x="{width - right}" y="{height - 4}" text-anchor="end" class="tick">'
               f'{escape(x_label)}</text>')
    if y_label:
        out.append(f'<text x="12" y="{top + ph / 2}" class="tick" transform="rotate(-90 12 {top + ph / 2})" '
                   f'text-anchor="middle">{escape(y_label)}</text>')
    for i, (name, pts) in enumerate(series):
        color = PALETTE[i % len(PALETTE)]
        if bars:
            bw = max(2.0, pw / max(1.0, (x1 - x0)) * 0.7)
            base = sy(max(y0, 0.0))
            for x, y in _finite(pts):
                yy = sy(y)
                out.append(f'<rect x="{sx(x) - bw / 2:.1f}" y="{min(yy, base):.1f}" width="{bw:.1f}" '
                           f'height="{abs(base - yy):.1f}" fill="{color}"><title>{escape(name)} '
                           f'{_fmt(x)}: {_fmt(y)}</title></rect>')
        else:
            out.append(f'<path d="{_path(pts, sx, sy)}" fill="none" stroke="{color}" stroke-width="2"/>')
            good = _finite(pts)
            if len(good) <= 60:
                out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}">'
                           f'<title>{escape(name)} {_fmt(x)}: {y:.4g}</title></circle>' for x, y in good)
        if legend_rows:
            lx = left + (i % per_row) * (pw / per_row)
            ly = 30 + 16 * (i // per_row)
            out.append(f'<rect x="{lx:.1f}" y="{ly - 9}" width="10" height="10" fill="{color}"/>'
                       f'<text x="{lx + 14:.1f}" y="{ly}" class="tick">{escape(name[:34])}</text>')
    out.append("</svg>")
    return "".join(out)
