"""The report's HTML helpers: escaping, numbers, key=value lists, an SVG frame.

Shared by the page (``report.py``), its charts (``report_charts.py``) and the comparison of runs
(``report_compare.py``); everything that reaches the page from a run goes through ``esc``.
"""

from __future__ import annotations

import html
import json
import math
from typing import Any


def esc(value: Any) -> str:
    """HTML-escaped text; ``None`` as a dash."""
    return "—" if value is None else html.escape(str(value), quote=True)


def num(value: Any) -> str:
    """A number as the report shows it (three decimals for a float); anything else escaped."""
    if value is None:
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return esc(value)
    return str(value) if isinstance(value, int) else f"{value:.3f}"


def is_number(value: Any) -> bool:
    """A finite int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def kv(d: dict[str, Any]) -> str:
    """``key=value`` chips for a dict (sampling, env args, versions)."""
    if not d:
        return "—"
    items = (
        f"<code>{esc(k)}={esc(v if isinstance(v, str) else json.dumps(v))}</code>"
        for k, v in d.items()
        if v is not None
    )
    return " ".join(items) or "—"


def weight_text(info: dict[str, Any] | None) -> str:
    """What a function counts for: ``×0.5``, ``metric`` (weight 0); ``↓ lower is better``; or ""."""
    if not isinstance(info, dict):
        return ""
    weight, better = info.get("weight"), info.get("higher_is_better", True)
    parts = []
    if is_number(weight):
        parts.append("metric" if weight == 0 else f"×{weight:g}")
    if better is False:
        parts.append("↓ lower is better")
    return " · ".join(parts)


def weight_note(info: dict[str, Any] | None) -> str:
    """``weight_text`` as a small note to put beside a function's name, or ""."""
    text = weight_text(info)
    return f' <small class="weight">{esc(text)}</small>' if text else ""


def svg(w: int, h: int, label: str, inner: str) -> str:
    """An inline SVG chart of ``w`` × ``h`` with an accessible label."""
    return f'<svg class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{label}">{inner}</svg>'
