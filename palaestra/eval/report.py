"""One self-contained HTML page for one or more saved evaluation runs.

The page has no external references: the CSS and JS in ``report_assets/`` are inlined, charts are
SVG drawn here, and the rollouts are embedded as JSON that the page renders with ``textContent``
(model text is never parsed as HTML). Conversations are built only when a rollout is expanded,
so a run of a few thousand rollouts stays quick to open.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson

from palaestra.eval.report_charts import histogram_svg, metric_bars_svg
from palaestra.eval.report_compare import comparison, run_label
from palaestra.eval.report_format import esc as _e
from palaestra.eval.report_format import kv as _kv
from palaestra.eval.report_format import num as _num
from palaestra.eval.report_format import weight_note
from palaestra.eval.store import RESULTS, EvalRun, load_run
from palaestra.types import Rollout

ASSETS = Path(__file__).with_name("report_assets")


def write_report(run_dirs: Sequence[Path], out: Path | None = None) -> Path:
    """Write the report for ``run_dirs`` to ``out`` (default ``<first run>/report.html``)."""
    if not run_dirs:
        raise ValueError("give at least one run directory")
    runs = [load_run(Path(d)) for d in run_dirs]
    out = Path(out) if out is not None else Path(run_dirs[0]) / "report.html"
    out.write_text(render_report(runs), encoding="utf-8")
    return out


def main_report(run_dirs: list[str], out: str | None) -> Path:
    """Entry point for ``palaestra report``: validates paths, then writes the page."""
    target = Path(out) if out else None
    if target is not None:
        if target.is_dir():
            raise ValueError(f"{target}: is a directory; give a file name such as report.html")
        if not target.parent.is_dir():
            raise ValueError(f"{target.parent}: output directory does not exist")
    return write_report([Path(d) for d in run_dirs], target)


# ---------------------------------------------------------------- page


def render_report(runs: Sequence[EvalRun]) -> str:
    """The full HTML page for ``runs`` (the first is the baseline of a comparison)."""
    title = " vs ".join(f"{r.metadata.env_id} · {r.metadata.model}" for r in runs)
    nav = ""
    if len(runs) > 1:
        links = "".join(f'<a href="#run-{i}">{_e(run_label(r, i))}</a>' for i, r in enumerate(runs))
        nav = f'<nav class="runs-nav"><a href="#comparison">Comparison</a>{links}</nav>'
    body = (
        nav
        + (comparison(runs) if len(runs) > 1 else "")
        + "".join(_run_section(r, i) for i, r in enumerate(runs))
    )
    data = {
        "runs": [[_record(x) for x in r.rollouts] for r in runs],
        "rubric": [r.metadata.rubric for r in runs],
    }
    return _fill(
        "page.html",
        title=_e(f"Palaestra report: {title}"),
        css=(ASSETS / "report.css").read_text(encoding="utf-8"),
        js=(ASSETS / "report.js").read_text(encoding="utf-8"),
        body=body,
        data=_script_json(data),
    )


def _fill(template: str, **parts: str) -> str:
    """``template`` from report_assets with ``{{name}}`` replaced in one pass (values are not rescanned)."""
    text = (ASSETS / template).read_text(encoding="utf-8")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], text)


def _record(r: Rollout) -> dict[str, Any]:
    """What the page needs of a rollout: everything but token ids and logprobs."""
    d = r.to_dict()
    d["turns"] = len(r.turns)
    return d


def _script_json(data: Any) -> str:
    """JSON safe inside ``<script>``: ``<``, ``>`` and ``&`` are written as ``\\u`` escapes."""
    text = orjson.dumps(data).decode()  # NaN and infinities become null
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _run_section(run: EvalRun, i: int) -> str:
    md, s = run.metadata, run.summary
    heading = f"{md.env_id} · {md.model}"
    notice = ""
    if run.skipped:
        lines = ", ".join(map(str, run.skipped[:10])) + (" …" if len(run.skipped) > 10 else "")
        notice = (
            f'<p class="notice">Skipped {len(run.skipped)} unreadable line(s) of {RESULTS} '
            f"(line {lines}); the run was probably stopped mid-write.</p>"
        )
    charts = (
        f'<div class="card"><h3>Reward distribution</h3>{histogram_svg(s.get("histogram"))}</div>'
        f'<div class="card"><h3>Reward functions (mean)</h3>{metric_bars_svg(s.get("metrics") or {}, md.rubric)}</div>'
    )
    return (
        f'<section class="run" id="run-{i}"><h2>{_e(heading)}</h2>{notice}{_header(run)}'
        f'<div class="grid2"><div class="card"><h3>Summary</h3>{_summary_table(s, md.rubric)}</div>'
        f'<div class="card">{_stops_errors(s)}</div></div>{_by_env(s)}<div class="grid2">{charts}</div>'
        f"{_fill('browser.html', run=str(i), total=str(len(run.rollouts)))}</section>"
    )


def _header(run: EvalRun) -> str:
    md = run.metadata.to_dict()
    counts = md.get("counts") or {}
    status = str(md.get("status", "unknown"))
    status_cls = status if status in ("complete", "running", "interrupted") else "other"
    started, finished, url = md.get("started_at"), md.get("finished_at"), md.get("base_url")
    items = [
        ("Environment", _e(md.get("env_id"))),
        ("Model", _e(md.get("model")) + (f" <small>@ {_e(url)}</small>" if url else "")),
        ("Run id", f"<code>{_e(md.get('run_id'))}</code>"),
        ("Status", f'<span class="status status-{status_cls}">{_e(status)}</span>'),
        ("Rollouts", _e(" · ".join(f"{k} {v}" for k, v in counts.items()) or str(len(run.rollouts)))),
        ("Examples", _e(f"{_examples(md, run.summary)} × {md.get('rollouts_per_example', '—')} rollouts")),
        ("Started", _e(started or "—")),
        ("Finished", _e(finished or "—") + _duration(started, finished)),
        ("Seed", _e(md.get("seed", "—"))),
        ("Concurrency", _e(md.get("max_concurrent", "—"))),
        ("Sampling", _kv(md.get("sampling") or {})),
        ("Env args", _kv(md.get("env_args") or {})),
        ("Versions", _kv(md.get("versions") or {})),
        ("Directory", f"<code>{_e(run.path)}</code>"),
    ]
    return '<dl class="meta">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


def _examples(md: dict[str, Any], summary: dict[str, Any]) -> str:
    """How many examples the run has: the spec's count, or for "all" (-1) the count the run holds."""
    n = md.get("num_examples")
    if isinstance(n, int) and n >= 0:
        return str(n)
    held = summary.get("n_examples")
    return f"all ({held})" if isinstance(held, int) else "all"


def _duration(start: Any, end: Any) -> str:
    try:
        seconds = (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
    except (TypeError, ValueError):
        return ""
    return f" <small>({seconds:.1f} s)</small>"


def _by_env(s: dict[str, Any]) -> str:
    """An EnvGroup run's per-environment card: reward, CI, pass@1, failures and each one's own metrics."""
    by_env = s.get("by_env")
    if not isinstance(by_env, dict) or not by_env:
        return ""
    rows = []
    for name, e in by_env.items():
        reward = e.get("reward") or {}
        ci = reward.get("ci95")
        metrics = ", ".join(
            f"<code>{_e(n)}</code> {_num(m.get('mean'))}" for n, m in (e.get("metrics") or {}).items()
        )
        rows.append(
            f"<tr><th>{_e(name)}</th><td>{_num(e.get('n_rollouts'))}</td><td><b>{_num(reward.get('mean'))}</b></td>"
            f"<td>{f'[{_num(ci[0])}, {_num(ci[1])}]' if ci else '—'}</td>"
            f"<td>{_num((e.get('pass_at_k') or {}).get('1'))}</td><td>{_num(e.get('errors'))}</td><td>{metrics}</td></tr>"
        )
    head = "<tr><th>environment</th><th>rollouts</th><th>reward</th><th>95% CI</th><th>pass@1</th><th>failed</th><th>its metrics (mean)</th></tr>"
    return f'<div class="card"><h3>Per environment</h3><table class="summary by-env">{head}{"".join(rows)}</table></div>'


def _summary_table(s: dict[str, Any], rubric: dict[str, Any]) -> str:
    reward = s.get("reward") or {}
    ci = reward.get("ci95")
    rows = [
        ("Rollouts", _e(f"{_num(s.get('n_rollouts'))} ({_num(s.get('n_examples'))} examples)")),
        ("Reward", f"<b>{_num(reward.get('mean'))}</b> ± {_num(reward.get('std'))}"),
        ("95% CI", f"[{_num(ci[0])}, {_num(ci[1])}]" if ci else "—"),
        ("Min / max", f"{_num(reward.get('min'))} / {_num(reward.get('max'))}"),
        ("Scored", _num(reward.get("n"))),
    ]
    rows += [
        (f"<code>{_e(n)}</code>{weight_note(rubric.get(n))}", f"{_num(m.get('mean'))} ± {_num(m.get('std'))}")
        for n, m in (s.get("metrics") or {}).items()
    ]
    threshold = s.get("pass_threshold")
    rows += [(f"pass@{_e(k)}", _num(p)) for k, p in (s.get("pass_at_k") or {}).items()]
    if threshold is not None:
        rows.append(("Pass threshold", f"reward ≥ {_num(threshold)}"))
    tokens = s.get("tokens") or {}
    rows.append(("Tokens", _e(" · ".join(f"{k} {_num(v)}" for k, v in tokens.items()) or "—")))
    table = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    timing = s.get("timing") or {}
    trows = "".join(
        f"<tr><th>{_e(k)}</th><td>{_num(t.get('min'))}</td><td>{_num(t.get('mean'))}</td><td>{_num(t.get('max'))}</td></tr>"
        for k, t in timing.items()
        if isinstance(t, dict)
    )
    times = f'<table class="timing"><tr><th>time (s)</th><th>min</th><th>mean</th><th>max</th></tr>{trows}</table>'
    return f'<table class="summary">{table}</table>{times if trows else ""}'


def _stops_errors(s: dict[str, Any]) -> str:
    stops = s.get("stop_reasons") or {}
    stop_rows = "".join(f"<tr><td><code>{_e(k)}</code></td><td>{_num(v)}</td></tr>" for k, v in stops.items())
    out = f'<h3>Stop reasons</h3><table class="stops">{stop_rows or "<tr><td>none</td></tr>"}</table><h3>Errors</h3>'
    errors = s.get("errors") or []
    if not errors:
        return out + '<p class="muted">No errors.</p>'
    rows = ""
    for err in errors:
        ex = err.get("example") or {}
        where = f"example {ex.get('example_id')} · rollout {ex.get('rollout_index')}"
        rows += (
            f"<tr><td><code>{_e(err.get('type'))}</code></td><td>{_e(err.get('stage'))}</td>"
            f'<td>{_num(err.get("count"))}</td><td><div class="errmsg">{_e(ex.get("message", ""))}</div>'
            f'<small class="muted">{_e(where)}</small></td></tr>'
        )
    return (
        out
        + f'<table class="errors"><tr><th>type</th><th>stage</th><th>count</th><th>example</th></tr>{rows}</table>'
    )
