"""Training curves as a picture: one self-contained HTML page of SVG charts, from ``metrics.jsonl``.

Written into each run folder at every checkpoint (``curves.html``), and by
``palaestra train curves RUN_DIR...``, which overlays several runs (LoRA against full fine-tuning,
say). Charts are grouped by what they measure, per kind of run: an SFT run's cross-entropy,
optimizer and speed; an RL run's reward, held-out evaluations (with a table linking each one's
report), environment metrics, policy, loss and time. No JavaScript, no network: the page opens
anywhere.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from palaestra.train.metrics import METRICS_FILE, read_metrics

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")
# per kind of run: sections of (metrics key, title); a key ending in "/" is every key with that prefix
SFT_SECTIONS = (
    ("what it learns", (("loss", "cross-entropy of the assistant tokens (nats)"),)),
    ("the optimizer", (("lr", "learning rate"), ("grad_norm", "gradient norm (before clipping)"))),
    ("speed", (("trained_tokens_per_s", "trained tokens / s"),)),
)
RL_SECTIONS = (
    ("reward", (("reward", "mean reward of the batch's rollouts"), ("reward/", "reward of"))),
    (
        "held-out evaluations",
        (("eval/reward", "held-out reward (mean over the eval sets)"), ("eval/", "held-out")),
    ),
    ("the environment's metrics", (("metrics/", "batch mean of"),)),
    (
        "the signal (palaestra train diagnose names what these mean)",
        (
            ("flat_groups", "share of groups whose rollouts all have one reward (no signal)"),
            ("truncated", "share of replies cut at max_tokens"),
            ("unparsed", "share of final replies the parser finds no answer in"),
            ("advantage_balance", "advantage balance (sum of A x tokens / sum of |A| x tokens)"),
            ("mismatch/kl", "sampler-trainer KL per token"),
        ),
    ),
    (
        "the policy",
        (
            ("entropy", "entropy of the sampled tokens (nats)"),
            ("clipped_fraction", "tokens clipped, capped or masked by the loss"),
            ("completion_tokens", "tokens per reply"),
        ),
    ),
    (
        "the loss and the optimizer",
        (
            ("loss", "policy loss (the RL objective: not a cross-entropy)"),
            ("grad_norm", "gradient norm (before clipping)"),
            ("lr", "learning rate"),
        ),
    ),
    (
        "time",
        (
            ("seconds_sampling", "seconds sampling per step"),
            ("seconds_training", "seconds training per step"),
        ),
    ),
)
W, H, LEFT, RIGHT, TOP, BOTTOM = 520, 260, 64, 16, 28, 36

Series = tuple[str, str, list[float], list[float]]  # label, color, x, y
Run = tuple[str, str, list[dict[str, Any]]]  # label, color, records


def write_curves(run_dirs: Sequence[Path], out: Path) -> Path:
    """Write the HTML page of the runs in ``run_dirs`` to ``out``; returns ``out``.

    Series are grouped by what they measure: SFT runs and RL runs get sections of their own (an
    SFT cross-entropy and an RL loss never share an axis), each chart one quantity. ``loss`` and
    ``reward`` are smoothed (each step faint); SFT's loss and the gradient norms use a log scale
    where they span more than 20×. An RL run's held-out evaluations are listed too, each linked to
    its report (written next to it the first time).
    """
    runs: dict[str, list[Run]] = {"sft": [], "rl": []}
    for i, run_dir in enumerate(run_dirs):
        path = Path(run_dir) / METRICS_FILE
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir}: no {METRICS_FILE} (is it a training run folder?)")
        records = read_metrics(path)
        kind = "rl" if any("reward" in r or "groups" in r for r in records) else "sft"
        runs[kind].append((str(run_dir), COLORS[i % len(COLORS)], records))
    body = []
    for kind, sections in (("sft", SFT_SECTIONS), ("rl", RL_SECTIONS)):
        if not runs[kind]:
            continue
        if kind == "rl":
            body.append(held_out_table([Path(label) for label, _, _ in runs["rl"]], out))
        for title, charts in sections:
            pictures = [_chart(kind, key, name, runs[kind]) for key, name in _expand(charts, runs[kind])]
            if pictures:
                body.append(
                    f'<h3>{kind.upper()}: {html.escape(title)}</h3><div class="charts">{"".join(pictures)}</div>'
                )
    legend = "".join(
        f'<span style="color:{color}">&#9632;</span> {html.escape(label)} ({kind.upper()}, {len(records)} steps)<br>'
        for kind in runs
        for label, color, records in runs[kind]
    )
    out.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>training curves</title>"
        "<style>body{font:14px sans-serif;margin:16px}svg{margin:4px;background:#fff;"
        "border:1px solid #ddd}figure{display:inline-block;margin:0}table{border-collapse:collapse}"
        "td,th{border:1px solid #ddd;padding:3px 8px;text-align:right}</style></head><body>"
        f"<h2>training curves</h2><p>{legend}</p>{''.join(body)}</body></html>\n"
    )
    return out


def _expand(charts: Sequence[tuple[str, str]], runs: Sequence[Run]) -> list[tuple[str, str]]:
    """The charts of a section: fixed keys the runs logged, and one per logged key of each prefix."""
    logged = dict.fromkeys(k for _, _, records in runs for r in records for k in r)
    fixed = {key for key, _ in charts if not key.endswith("/")}
    out = []
    for key, title in charts:
        if not key.endswith("/"):
            if key in logged:
                out.append((key, title))
            continue
        out += [(k, f"{title} {k.removeprefix(key)}") for k in logged if k.startswith(key) and k not in fixed]
    return out


def _chart(kind: str, key: str, title: str, runs: Sequence[Run]) -> str:
    """One chart of ``key`` over ``runs`` (all of one kind), wrapped in a figure naming them."""
    lines: list[Series] = []
    faint: list[Series] = []
    for label, color, records in runs:
        points = [(r["step"], r[key]) for r in records if isinstance(r.get(key), (int, float))]
        xs, ys = [float(x) for x, _ in points], [float(y) for _, y in points]
        if key in ("loss", "reward") and len(ys) > 4:
            faint.append((label, color, xs, ys))
            ys = moving_average(ys, max(1, len(ys) // 40))
        lines.append((label, color, xs, ys))
    log_y = key == "grad_norm" or (key == "loss" and kind == "sft")
    names = html.escape("\n".join(label for label, _, _ in runs))
    figure = f'<figure data-kind="{kind}" data-key="{html.escape(key)}" data-runs="{names}">'
    return f"{figure}{svg_chart(title, lines, faint, log_y=log_y)}</figure>"


def held_out_table(run_dirs: Sequence[Path], out: Path) -> str:
    """Every held-out evaluation of the RL runs (``RUN/evals/step-N/SET``): its mean reward, linked
    to its report, written beside it if it has none yet."""
    from palaestra.eval.report import write_report

    rows = []
    for run_dir in run_dirs:
        for meta in sorted(run_dir.glob("evals/step-*/*/metadata.json")):
            folder = meta.parent
            try:
                summary = json.loads(meta.read_text(encoding="utf-8")).get("summary") or {}
                report = folder / "report.html"
                if not report.is_file():
                    write_report([folder], report)
            except (OSError, ValueError):
                continue  # a folder being written, or damaged: left out, the curves still come
            reward = (summary.get("reward") or {}).get("mean")
            step = int(folder.parent.name.removeprefix("step-") or 0)
            href = html.escape(os.path.relpath(report, out.parent))
            shown = "–" if reward is None else f"{reward:.3f}"
            cells = (
                html.escape(str(run_dir)),
                step,
                html.escape(folder.name),
                summary.get("n_rollouts", "–"),
            )
            rows.append(
                "<tr>"
                + "".join(f"<td>{c}</td>" for c in cells)
                + f'<td><a href="{href}">{shown}</a></td></tr>'
            )
    if not rows:
        return ""
    head = "<tr><th>run</th><th>step</th><th>set</th><th>rollouts</th><th>reward (its report)</th></tr>"
    return f'<h3>RL: held-out evaluation runs</h3><table class="held-out">{head}{"".join(rows)}</table>'


def moving_average(values: Sequence[float], half: int) -> list[float]:
    """The mean of each value and its ``half`` neighbours on each side: smooth, and with no lag."""
    out = []
    for i in range(len(values)):
        window = values[max(0, i - half) : i + half + 1]
        out.append(sum(window) / len(window))
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
    y_ticks = log_ticks(y0, y1) if log_y else ticks(y0, y1)
    for tick in y_ticks:
        y = py(tick)
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{W - RIGHT}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(
            f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{fmt(tick)}</text>'
        )
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" height="{H - TOP - BOTTOM}" '
        'fill="none" stroke="#999"/>'
    )
    parts.append(f'<text x="{W / 2}" y="{H - 6}" text-anchor="middle" font-size="11">step</text>')
    for series, style in [(s, 'stroke-opacity="0.35" stroke-width="1"') for s in faint] + [
        (s, 'stroke-width="2"') for s in lines
    ]:
        _, color, sx, sy = series
        points = " ".join(
            f"{px(x):.1f},{py(y):.1f}"
            for x, y in zip(sx, sy, strict=True)
            if math.isfinite(y) and (y > 0 or not log_y)
        )
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


def log_ticks(low: float, high: float) -> list[float]:
    """Round numbers (1, 2, 5 times a power of ten) between ``10**low`` and ``10**high``."""
    decades = range(math.floor(low), math.ceil(high) + 1)
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        found = [m * 10.0**k for k in decades for m in mantissas if low <= math.log10(m * 10.0**k) <= high]
        if len(found) <= 7:
            return found
    return found


def fmt(value: float) -> str:
    """A tick label: short, without float noise."""
    if value == 0:
        return "0"
    if abs(value) >= 1e4 or abs(value) < 1e-3:
        return f"{value:.0e}"
    return f"{value:.4g}"
