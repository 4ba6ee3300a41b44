"""Server-drawn SVG charts: a timeline and a histogram per measure, as Spark's Streaming tab has.

No JavaScript and nothing fetched at run time; 1000 points are one ``<polyline>`` (a few
kilobytes), which any browser draws at once.
"""

from __future__ import annotations

from html import escape

WIDTH, HEIGHT, PAD = 560, 150, 36


def _fmt(value: float, unit: str) -> str:
    if unit == "ms" and value >= 1000:
        return f"{value / 1000:.1f} s"
    return f"{value:.0f} {unit}" if value >= 10 or value == 0 else f"{value:.2f} {unit}"


def timeline(title: str, points: list[tuple[int, float]], unit: str, batch_ms: int = 0) -> str:
    """``points``: (batch time in ms, value); a dashed line at ``batch_ms`` for delays."""
    label = escape(title)
    if not points:
        return (f'<svg class="timeline" role="img" aria-label="{label}" width="{WIDTH}" height="{HEIGHT}">'
                f'<text x="{WIDTH // 2}" y="{HEIGHT // 2}" text-anchor="middle">no batches yet</text></svg>')
    t0, t1 = points[0][0], points[-1][0]
    top = max(max(v for _, v in points), float(batch_ms) if batch_ms else 0.0, 1e-9)
    span = max(t1 - t0, 1)

    def x(t):
        return PAD + (t - t0) * (WIDTH - PAD - 8) / span

    def y(v):
        return HEIGHT - 20 - v * (HEIGHT - 30) / top

    x_scale, y_scale, bottom = (WIDTH - PAD - 8) / span, (HEIGHT - 30) / top, HEIGHT - 20
    line = " ".join([f"{PAD + (t - t0) * x_scale:.0f},{bottom - v * y_scale:.0f}" for t, v in _thin(points)])
    parts = [f'<svg class="timeline" role="img" aria-label="{label}" width="{WIDTH}" height="{HEIGHT}" '
             f'viewBox="0 0 {WIDTH} {HEIGHT}">',
             f'<line x1="{PAD}" y1="{HEIGHT - 20}" x2="{WIDTH - 8}" y2="{HEIGHT - 20}" class="axis"/>',
             f'<line x1="{PAD}" y1="10" x2="{PAD}" y2="{HEIGHT - 20}" class="axis"/>',
             f'<text x="2" y="16" class="tick">{escape(_fmt(top, unit))}</text>',
             f'<text x="2" y="{HEIGHT - 22}" class="tick">0</text>']
    if batch_ms:
        parts.append(f'<line x1="{PAD}" y1="{y(batch_ms):.1f}" x2="{WIDTH - 8}" y2="{y(batch_ms):.1f}" '
                     'class="limit"><title>batch interval</title></line>')
    parts.append(f'<polyline points="{line}" class="series"/>')
    if len(points) <= 120:  # a dot per batch while they are few enough to tell apart
        parts.extend(f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="2">'
                     f'<title>{t}: {escape(_fmt(v, unit))}</title></circle>' for t, v in points)
    parts.append("</svg>")
    return "".join(parts)


def _thin(points: list[tuple[int, float]], width: int = WIDTH) -> list[tuple[int, float]]:
    """At most two points per pixel column (its lowest and highest, in time order): the same
    line as every point gives, for a fraction of the bytes once batches outnumber pixels."""
    if len(points) <= 2 * width:
        return points
    t0, span = points[0][0], max(points[-1][0] - points[0][0], 1)
    columns: dict[int, list] = {}
    for p in points:
        columns.setdefault(int((p[0] - t0) * (width - 1) / span), []).append(p)
    out = []
    for column in columns.values():
        low, high = min(column, key=lambda p: p[1]), max(column, key=lambda p: p[1])
        out.extend(sorted({low, high}))
    return out


def histogram(title: str, values: list[float], unit: str, bins: int = 12) -> str:
    label = escape(title + " histogram")
    width = 260
    if not values:
        return f'<svg class="histogram" role="img" aria-label="{label}" width="{width}" height="{HEIGHT}"></svg>'
    low, high = min(values), max(values)
    step = (high - low) / bins or 1.0
    counts = [0] * bins
    for v in values:
        counts[min(int((v - low) / step), bins - 1)] += 1
    top = max(counts)
    bar_h = (HEIGHT - 30) / bins
    parts = [f'<svg class="histogram" role="img" aria-label="{label}" width="{width}" height="{HEIGHT}" '
             f'viewBox="0 0 {width} {HEIGHT}">']
    for i, c in enumerate(counts):
        w = c * (width - 90) / top
        y = 10 + (bins - 1 - i) * bar_h
        parts.append(f'<rect x="80" y="{y:.1f}" width="{w:.1f}" height="{bar_h - 1:.1f}" class="bar">'
                     f'<title>{escape(_fmt(low + i * step, unit))}: {c}</title></rect>')
    parts.append(f'<text x="2" y="{HEIGHT - 22}" class="tick">{escape(_fmt(low, unit))}</text>')
    parts.append(f'<text x="2" y="16" class="tick">{escape(_fmt(high, unit))}</text></svg>')
    return "".join(parts)
