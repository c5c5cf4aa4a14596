"""Training curves as a picture: one self-contained HTML page of SVG charts, from ``metrics.jsonl``.

Written into each run folder at every checkpoint (``curves.html``), and by
``palaestra train curves RUN_DIR...``, which overlays several runs (LoRA against full fine-tuning,
say). Charts: the loss (each step faint, an exponential moving average bold), the learning rate,
the gradient norm and the trained tokens per second, all against the step. No JavaScript, no
network: the page opens anywhere.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from pathlib import Path

from palaestra.train.metrics import METRICS_FILE, read_metrics

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
CHARTS = (
    ("loss", "training loss (assistant tokens)"),
    ("lr", "learning rate"),
    ("grad_norm", "gradient norm (before clipping)"),
    ("trained_tokens_per_s", "trained tokens / s"),
)
RL_CHARTS = (
    ("reward", "mean reward of the batch's rollouts"),
    ("eval/reward", "held-out reward (mean over the eval sets)"),
    ("entropy", "entropy of the sampled tokens (nats)"),
    ("clipped_fraction", "tokens clipped, capped or masked by the loss"),
    ("completion_tokens", "tokens per reply"),
    ("loss", "loss"),
    ("grad_norm", "gradient norm (before clipping)"),
    ("seconds_sampling", "seconds sampling per step"),
    ("seconds_training", "seconds training per step"),
)
W, H, LEFT, RIGHT, TOP, BOTTOM = 520, 260, 64, 16, 28, 36

Series = tuple[str, str, list[float], list[float]]  # label, color, x, y


def write_curves(
    run_dirs: Sequence[Path],
    out: Path,
    *,
    smoothing: float = 0.8,
    charts: Sequence[tuple[str, str]] | None = None,
) -> Path:
    """Write the HTML page of the runs in ``run_dirs`` to ``out``; returns ``out``.

    ``charts`` is (metrics key, title) per chart; default: the SFT charts, or the RL ones for runs
    whose records have a ``reward``. Smoothing (and a log scale) applies to ``loss`` and ``reward``.
    """
    runs = []
    for i, run_dir in enumerate(run_dirs):
        path = Path(run_dir) / METRICS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir}: no {METRICS_FILE} (is it a training run folder?)")
        runs.append((str(run_dir), COLORS[i % len(COLORS)], read_metrics(path)))
    rl = any("reward" in record for _, _, records in runs for record in records)
    if charts is None:
        charts = CHARTS
        if rl:  # the fixed charts, then one per environment metric and held-out figure
            found = dict.fromkeys(k for _, _, records in runs for r in records for k in r
                                  if k.startswith(("metrics/", "eval/")) and k != "eval/reward")  # fmt: skip
            charts = (*RL_CHARTS, *((k, k) for k in found))
    pictures = []
    for key, title in charts:
        lines: list[Series] = []
        faint: list[Series] = []
        for label, color, records in runs:
            points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
            xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
            if key in ("loss", "reward") and len(ys) > 1:
                faint.append((label, color, xs, ys))
                ys = ema(ys, smoothing)
            lines.append((label, color, xs, ys))
        pictures.append(svg_chart(title, lines, faint, log_y=key == "loss" and not rl))
    legend = "".join(
        f'<span style="color:{color}">&#9632;</span> {html.escape(label)} ({len(records)} steps)<br>'
        for label, color, records in runs
    )
    out.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>training curves</title>"
        "<style>body{font:14px sans-serif;margin:16px}svg{margin:4px;background:#fff;"
        "border:1px solid #ddd}</style></head><body>"
        f"<h3>training curves</h3><p>{legend}</p>{''.join(pictures)}</body></html>\n"
    )
    return out


def ema(values: Sequence[float], smoothing: float) -> list[float]:
    """Exponential moving average, debiased at the start (as TensorBoard draws it)."""
    out, avg = [], 0.0
    for i, value in enumerate(values, 1):
        avg = smoothing * avg + (1 - smoothing) * value
        out.append(avg / (1 - smoothing**i))
    return out


def svg_chart(title: str, lines: list[Series], faint: list[Series], *, log_y: bool = False) -> str:
    """One chart: axes with ticks, faint series under bold ones."""
    xs = [x for s in lines + faint for x in s[2]]
    ys = [y for s in lines + faint for y in s[3] if math.isfinite(y) and (y > 0 or not log_y)]
    head = f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}">'
    caption = f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="14">{html.escape(title)}</text>'
    if not xs or not ys:
        return f'{head}{caption}<text x="{W / 2}" y="{H / 2}" text-anchor="middle">no data</text></svg>'
    log_y = log_y and min(ys) > 0 and max(ys) / min(ys) > 20
    fy = math.log10 if log_y else float
    x0, x1 = min(xs), max(xs) if max(xs) > min(xs) else min(xs) + 1
    y0, y1 = fy(min(ys)), fy(max(ys))
    y0, y1 = (y0, y1) if y1 > y0 else (y0 - 1, y1 + 1)

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * (W - LEFT - RIGHT)

    def py(y: float) -> float:
        return H - BOTTOM - (fy(y) - y0) / (y1 - y0) * (H - TOP - BOTTOM)

    parts = [head, caption]
    for tick in ticks(x0, x1):
        parts.append(
            f'<line x1="{px(tick):.1f}" y1="{TOP}" x2="{px(tick):.1f}" y2="{H - BOTTOM}" stroke="#eee"/>'
        )
        parts.append(
            f'<text x="{px(tick):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle" font-size="11">{fmt(tick)}</text>'
        )
    y_ticks = [10**t for t in ticks(y0, y1) if float(t).is_integer()] if log_y else ticks(y0, y1)
    if log_y and len(y_ticks) < 2:
        y_ticks = [10**t for t in ticks(y0, y1)]
    for tick in y_ticks:
        y = py(tick)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{fmt(tick)}</text>'
        )
    parts.append(f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
                 'fill="none" stroke="#999"/>')  # fmt: skip
    parts.append(f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle" font-size="11">step</text>')
    for series, style in [(s, 'stroke-opacity="0.25" stroke-width="1"') for s in faint] + [
        (s, 'stroke-width="2"') for s in lines
    ]:
        _, color, sx, sy = series
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(sx, sy, strict=True) if math.isfinite(y)
                          and (y > 0 or not log_y))  # fmt: skip
        if len(sx) == 1:
            parts.append(f'<circle cx="{px(sx[0]):.1f}" cy="{py(sy[0]):.1f}" r="3" fill="{color}"/>')
        else:
            parts.append(f'<polyline points="{points}" fill="none" stroke="{color}" {style}/>')
    parts.append("</svg>")
    return "".join(parts)


def ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round numbers between ``low`` and ``high``."""
    span = high - low
    raw = span / count
    step = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if span / (step * factor) <= count:
            step *= factor
            break
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(int((high - first) / step + 1e-9) + 1)]


def fmt(value: float) -> str:
    """A tick label: short, without float noise."""
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.0e}"
    return f"{value:.4g}"
