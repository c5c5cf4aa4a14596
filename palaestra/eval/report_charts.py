"""The report's charts, drawn as inline SVG: the reward histogram and each function's mean.

Reward functions and metrics can be on different scales (a 0–1 score beside the turns a game
took): the ones whose values all lie in [0, 1] share one axis, and every other one is drawn on
its own axis, from its lowest to its highest value, with both ends labelled.
"""

from __future__ import annotations

from typing import Any

from palaestra.eval.report_format import esc, is_number, num, svg, weight_text


def histogram_svg(hist: dict[str, Any] | None) -> str:
    """Reward histogram as an SVG bar chart (10 bins, counts above bars)."""
    if not hist or not hist.get("counts") or not any(hist["counts"]) or len(hist.get("edges") or []) < 2:
        return '<p class="muted">No scored rollouts.</p>'
    counts, edges = hist["counts"], hist["edges"]
    w, h, left, bottom, top = 460, 190, 34, 26, 16
    bw = (w - left - 8) / len(counts)
    peak = max(counts)
    parts = [f'<line x1="{left}" y1="{h - bottom}" x2="{w - 4}" y2="{h - bottom}" class="axis"/>']
    for i, c in enumerate(counts):
        bh = (h - bottom - top) * c / peak
        x, y = left + i * bw, h - bottom - bh
        label = f"[{num(edges[i])}, {num(edges[i + 1])}): {c}"
        parts.append(
            f'<rect class="bar" x="{x + 1:.1f}" y="{y:.1f}" width="{bw - 2:.1f}" height="{bh:.1f}"><title>{label}</title></rect>'
            + (
                f'<text x="{x + bw / 2:.1f}" y="{y - 3:.1f}" class="lbl" text-anchor="middle">{c}</text>'
                if c
                else ""
            )
        )
    for i in range(0, len(edges), 2 if len(edges) > 6 else 1):
        tick = f"{edges[i]:g}" if isinstance(edges[i], (int, float)) else esc(edges[i])
        parts.append(
            f'<text x="{left + i * bw:.1f}" y="{h - 8}" class="tick" text-anchor="middle">{tick}</text>'
        )
    parts.append(f'<text x="{left - 6}" y="{top + 4}" class="tick" text-anchor="end">{peak}</text>')
    return svg(w, h, "reward histogram", "".join(parts))


def axis_of(stats: dict[str, Any]) -> tuple[float, float]:
    """The axis a metric is drawn on: [0, 1] when its values lie there, else its own range (0 included)."""
    mean = float(stats["mean"])
    lo = float(stats["min"]) if is_number(stats.get("min")) else mean
    hi = float(stats["max"]) if is_number(stats.get("max")) else mean
    if 0 <= lo and hi <= 1:
        return 0.0, 1.0
    lo, hi = min(0.0, lo, mean), max(0.0, hi, mean)
    return lo, hi if hi > lo else lo + 1.0


def metric_bars_svg(metrics: dict[str, Any], rubric: dict[str, Any] | None = None) -> str:
    """Each reward function's and metric's mean as a bar on its axis, with its weight beside its name.

    The 0–1 ones first, sharing an axis; then each of the others on its own, its ends labelled."""
    items = [(str(n), m) for n, m in metrics.items() if isinstance(m, dict) and is_number(m.get("mean"))]
    if not items:
        return '<p class="muted">No reward functions recorded.</p>'
    items.sort(key=lambda item: axis_of(item[1]) != (0.0, 1.0))  # stable: the shared axis first
    w, row, label_w, value_w = 460, 30, 170, 54
    plot = w - label_w - value_w
    parts, y = [], 4
    for name, stats in items:
        lo, hi = axis_of(stats)
        mean, span = float(stats["mean"]), hi - lo
        zero = label_w + plot * (0 - lo) / span
        x0, x1 = sorted((zero, label_w + plot * (mean - lo) / span))
        info = (rubric or {}).get(name)
        note = weight_text(info)
        short = name if len(name) <= 22 else name[:21] + "…"
        cls = "bar neg" if mean < 0 else "bar"
        own = (lo, hi) != (0.0, 1.0)
        parts.append(
            f'<g class="metric" data-name="{esc(name)}" data-axis="{lo:g}..{hi:g}">'
            f'<text x="{label_w - 8}" y="{y + 13}" class="lbl" text-anchor="end">{esc(short)}<title>{esc(name)}</title></text>'
            + (
                f'<text x="{label_w - 8}" y="{y + 25}" class="tick" text-anchor="end">{esc(note)}</text>'
                if note
                else ""
            )
            + f'<rect x="{label_w}" y="{y + 3}" width="{plot}" height="{row - 14}" class="track"/>'
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{max(x1 - x0, 1):.1f}" height="{row - 14}" class="{cls}"/>'
            f'<line x1="{zero:.1f}" y1="{y}" x2="{zero:.1f}" y2="{y + row - 8}" class="axis"/>'
            + (
                f'<text x="{label_w}" y="{y + row - 1}" class="tick">{lo:g}</text>'
                f'<text x="{label_w + plot}" y="{y + row - 1}" class="tick" text-anchor="end">{hi:g} (own scale)</text>'
                if own
                else ""
            )
            + f'<text x="{w - value_w + 6}" y="{y + 13}" class="lbl">{num(mean)}</text></g>'
        )
        y += row + (6 if own else 0)
    return svg(w, y + 4, "reward function means", "".join(parts))
