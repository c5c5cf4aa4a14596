"""The report's comparison of runs: one table of their figures, and the same examples side by side.

Deltas are against run 1 and only for runs of one environment. Each is coloured by what is
better for its row: the reward and pass@k higher, a metric as its ``higher_is_better`` says (a
saved run's ``rubric``), so fewer turns used shows green. The per-example card lists the
examples both runs have, with each one's mean reward and the difference; opening one shows a
rollout of each run side by side (``report.js`` builds it from the embedded rollouts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from palaestra.eval.report_format import esc, num, weight_note
from palaestra.eval.store import EvalRun


def run_label(run: EvalRun, i: int) -> str:
    """How the page names run ``i``: its number and model."""
    return f"{i + 1}. {run.metadata.model}"


def directions(runs: Sequence[EvalRun]) -> dict[str, dict[str, Any]]:
    """Each function's weight and direction, from the first run that recorded it."""
    out: dict[str, dict[str, Any]] = {}
    for run in runs:
        for name, info in (run.metadata.rubric or {}).items():
            if isinstance(info, dict):
                out.setdefault(name, info)
    return out


def delta_cell(value: float, base: float, *, higher_is_better: bool) -> str:
    """The signed difference from run 1, green when it is an improvement, red when not."""
    d = value - base
    sign = "+" if d > 5e-4 else "-" if d < -5e-4 else "±"
    better = d > 5e-4 if higher_is_better else d < -5e-4
    worse = d < -5e-4 if higher_is_better else d > 5e-4
    cls = "pos" if better else "neg" if worse else "zero"
    return f' <span class="delta {cls}" data-delta="{d:.6f}">{sign}{abs(d):.3f}</span>'


def comparison(runs: Sequence[EvalRun]) -> str:
    """The comparison section: a table of every run's figures, then the per-example card."""
    envs = [r.metadata.env_id for r in runs]
    same_env = len(set(envs)) == 1
    info = directions(runs)
    metric_names = list(dict.fromkeys(n for r in runs for n in (r.summary.get("metrics") or {})))
    ks = sorted({k for r in runs for k in (r.summary.get("pass_at_k") or {})}, key=lambda k: (len(k), k))
    rows: list[tuple[str, list[float | None]]] = [("reward mean", [_get(r, "reward", "mean") for r in runs])]
    rows += [(n, [_get(r, "metrics", n, "mean") for r in runs]) for n in metric_names]
    rows += [(f"pass@{k}", [_get(r, "pass_at_k", k) for r in runs]) for k in ks]
    head = "".join(f"<th>{esc(run_label(r, i))}</th>" for i, r in enumerate(runs))
    cis = [(r.summary.get("reward") or {}).get("ci95") for r in runs]
    body = "".join(
        f"<tr><th>{label}</th>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
        for label, cells in (
            ("model", [esc(r.metadata.model) for r in runs]),
            ("environment", [f"<code>{esc(e)}</code>" for e in envs]),
            ("rollouts", [num(r.summary.get("n_rollouts")) for r in runs]),
        )
    )
    ci_cells = "".join(f"<td>[{num(ci[0])}, {num(ci[1])}]</td>" if ci else "<td>—</td>" for ci in cis)
    for n, (name, values) in enumerate(rows):
        is_metric = 0 < n <= len(metric_names)
        higher = (info.get(name) or {}).get("higher_is_better", True) is not False if is_metric else True
        cells = ""
        for i, v in enumerate(values):
            base = values[0]
            delta = ""
            if same_env and i > 0 and v is not None and base is not None:
                delta = delta_cell(v, base, higher_is_better=higher)
            cells += f"<td>{num(v)}{delta}</td>"
        label = f"<code>{esc(name)}</code>{weight_note(info.get(name))}" if is_metric else esc(name)
        better = "higher" if higher else "lower"
        body += (
            f'<tr class="cmp-row" data-name="{esc(name)}" data-better="{better}"><th>{label}</th>{cells}</tr>'
        )
        if n == 0:
            body += f"<tr><th>reward 95% CI</th>{ci_cells}</tr>"
    listed = ", ".join(esc(e) for e in dict.fromkeys(envs))
    note = f"The runs use different environments ({listed}): shown side by side; deltas are not computed."
    note = "Deltas are against run 1 (same environment), green where the run is better." if same_env else note
    return (
        f'<section id="comparison"><h2>Comparison</h2><p class="muted cmp-note">{note}</p>'
        f'<div class="card"><table class="compare"><tr><th></th>{head}</tr>{body}</table></div>'
        f"{pairs_card(runs) if same_env else ''}</section>"
    )


def pairs_card(runs: Sequence[EvalRun]) -> str:
    """The per-example card: run 1 against another run (a choice when there are more than two)."""
    options = "".join(
        f'<option value="{i}">{esc(run_label(r, i))}</option>' for i, r in enumerate(runs) if i > 0
    )
    return (
        '<div class="card pairs" data-a="0" data-b="1"><h3>Per example: the same example in both runs</h3>'
        f'<div class="filters"><label>run 1 against <select class="p-other">{options}</select></label>'
        '<label><input type="checkbox" class="p-differ"> only examples whose reward differs</label>'
        '<label>sort <select class="p-sort"><option value="id">example id</option>'
        '<option value="delta-asc">difference ↑</option><option value="delta-desc">difference ↓</option>'
        '</select></label></div><p class="count p-count" aria-live="polite"></p>'
        '<div class="rows p-rows" role="list"></div></div>'
    )


def _get(run: EvalRun, *keys: str) -> float | None:
    value: Any = run.summary
    for k in keys:
        value = value.get(k) if isinstance(value, dict) else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
