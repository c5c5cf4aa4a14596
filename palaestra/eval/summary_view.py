"""An eval run's summary in the terminal, with Rich: ``render_summary`` prints what ``summarize``
made, ``render_rollout`` prints one rollout in full. Every string that came from a model, a
dataset or an exception is printed through ``Text`` so Rich markup in it is shown literally.
"""

from __future__ import annotations

import json
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from palaestra.types import Message, Rollout, content_text

_BLOCKS = " ▏▎▍▌▋▊▉█"
_BAR_WIDTH = 36
_ROLE_STYLES = {"system": "magenta", "user": "cyan", "assistant": "green", "tool": "yellow"}


def _num(x: float | None) -> str:
    if x is None:
        return "–"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:.3f}"


def _bar(count: int, top: int) -> str:
    """A bar of unicode blocks, ``_BAR_WIDTH`` cells for ``top``, in eighths of a cell."""
    eighths = round(count / top * _BAR_WIDTH * 8) if top else 0
    if count and not eighths:
        eighths = 1  # a non-empty bin always shows
    full, part = divmod(eighths, 8)
    return "█" * full + (_BLOCKS[part] if part else "")


def render_summary(console: Console, summary: dict[str, Any], *, title: str | None = None) -> None:
    """Print a summary from ``summarize``: reward and metrics, pass@k, histogram, stops, errors, timing."""
    if title:
        console.rule(Text(title, style="bold"))
    reward = summary["reward"]
    n_err = sum(e["count"] for e in summary["errors"])
    console.print(
        Text(
            f"{summary['n_rollouts']} rollouts · {summary['n_examples']} examples × "
            f"{summary['rollouts_per_example']} · {reward['n']} scored · {n_err} failed"
        )
    )
    for key, note in (summary.get("notes") or {}).items():  # e.g. a weaker sandbox: said with the results
        console.print(Text(f"note: {key}: {note}", style="bold yellow"))

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for header in ("", "mean", "± std", "95% CI", "min", "max", "n"):  # names wrap, never cut
        table.add_column(header, justify="left" if header in ("", "95% CI") else "right", overflow="fold")
    ci = reward["ci95"]
    ci_text = f"[{_num(ci[0])}, {_num(ci[1])}]" if ci else "–"
    table.add_row(
        Text("reward", style="bold"),
        _num(reward["mean"]),
        _num(reward["std"]),
        Text(ci_text),
        _num(reward["min"]),
        _num(reward["max"]),
        str(reward["n"]),
    )
    for name, stats in summary["metrics"].items():
        table.add_row(Text(name), _num(stats["mean"]), _num(stats["std"]), "", "", "", str(stats["n"]))
    console.print(table)

    if summary.get("by_env"):
        _render_by_env(console, summary["by_env"])

    if summary["pass_at_k"]:
        parts = [f"pass@{k} {_num(v)}" for k, v in summary["pass_at_k"].items()]
        console.print(Text(f"pass@k (reward ≥ {summary['pass_threshold']:g}): " + " · ".join(parts)))

    hist = summary["histogram"]
    if reward["n"]:
        console.print(Text("\nreward histogram", style="bold"))
        top = max(hist["counts"])
        edges = hist["edges"]
        for i, count in enumerate(hist["counts"]):
            close = "]" if i == len(hist["counts"]) - 1 else ")"
            label = f"[{_num(edges[i]):>6}, {_num(edges[i + 1]):>6}{close}"
            line = Text(f"  {label} ")
            line.append(f"{_bar(count, top):<{_BAR_WIDTH}}", style="blue")
            line.append(f" {count}")
            console.print(line)

    if summary["stop_reasons"]:
        stops = " · ".join(f"{reason} {count}" for reason, count in summary["stop_reasons"].items())
        console.print(Text.assemble("\n", ("stop reasons: ", "bold"), stops))

    if summary["errors"]:
        errors = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="errors", title_justify="left")
        errors.add_column("stage")
        errors.add_column("type")
        errors.add_column("n", justify="right")
        errors.add_column("example", overflow="fold")
        for e in summary["errors"]:
            ex = e["example"]
            message = " ".join(ex["message"].split())
            if len(message) > 120:
                message = message[:119] + "…"
            where = f"#{ex['example_id']}/{ex['rollout_index']}: "
            errors.add_row(
                Text(e["stage"]), Text(e["type"], style="red"), str(e["count"]), Text(where + message)
            )
        console.print(errors)

    timing = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="time per rollout (s)", title_justify="left")
    for header in ("", "min", "mean", "max"):
        timing.add_column(header, justify="left" if not header else "right")
    for stage, stats in summary["timing"].items():
        timing.add_row(stage, *(_num(stats[key]) for key in ("min", "mean", "max")))
    console.print(timing)

    tokens = summary["tokens"]
    console.print(
        Text(
            f"tokens: prompt {tokens['prompt']:,} · completion {tokens['completion']:,} · "
            f"total {tokens['total']:,}"
        )
    )


def _render_by_env(console: Console, by_env: dict[str, Any]) -> None:
    """One row per environment of a group: its reward, pass@1 and its own metrics' means; plain
    lines when the output is not a terminal (a log, a pipe), where a wide table would be cut up."""
    if not console.is_terminal:
        console.print(Text("per environment", style="bold"))
        for name, stats in by_env.items():
            reward, ci = stats["reward"], stats["reward"]["ci95"]
            bar = stats.get("pass_threshold")
            parts = [
                f"{stats['n_rollouts']} rollouts",
                f"reward {_num(reward['mean'])}" + (f" [{_num(ci[0])}, {_num(ci[1])}]" if ci else ""),
                f"pass@1 {_num(stats['pass_at_k'].get('1'))}"
                + (f" (reward ≥ {bar:g})" if bar is not None else ""),
                f"failed {stats['errors']}",
                *(f"{m} {_num(v['mean'])}" for m, v in stats["metrics"].items()),
            ]
            console.print(Text(f"  {name}: " + " · ".join(parts)), soft_wrap=True)
        return
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="per environment", title_justify="left")
    for header in ("environment", "rollouts", "reward", "95% CI", "pass@1", "failed", "its metrics (mean)"):
        table.add_column(
            header,
            justify="right" if header in ("rollouts", "reward", "pass@1", "failed") else "left",
            overflow="fold",
        )
    for name, stats in by_env.items():
        reward, ci = stats["reward"], stats["reward"]["ci95"]
        metrics = " · ".join(f"{m} {_num(v['mean'])}" for m, v in stats["metrics"].items())
        table.add_row(
            Text(name, style="bold"),
            str(stats["n_rollouts"]),
            _num(reward["mean"]),
            Text(f"[{_num(ci[0])}, {_num(ci[1])}]" if ci else "–"),
            _num(stats["pass_at_k"].get("1")),
            str(stats["errors"]),
            Text(metrics),
        )
    console.print(table)


def _truncate(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"… ({len(text) - max_chars} more chars)"


def _tool_call_text(call: Any) -> str:
    """``name(arguments)`` of an OpenAI tool call dict."""
    if not isinstance(call, dict):
        return str(call)
    function = call.get("function") or {}
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return f"{function.get('name', '?')}({arguments})"


def _message_panel(message: Message, max_chars: int) -> Panel:
    role = str(message.get("role", "?"))
    style = _ROLE_STYLES.get(role, "white")
    title = Text(role, style=f"bold {style}")
    if message.get("tool_call_id"):
        title.append(f" · {message['tool_call_id']}")
    body = Text(_truncate(content_text(message.get("content"), placeholders=True), max_chars))
    for call in message.get("tool_calls") or []:
        if body:
            body.append("\n")
        body.append("→ ", style="bold")
        body.append(_truncate(_tool_call_text(call), max_chars), style=style)
    return Panel(body, title=title, title_align="left", border_style=style)


def render_rollout(console: Console, rollout: Rollout, *, max_chars: int = 2000) -> None:
    """Print one rollout in full: a header with its scores, then every message as a panel."""
    console.rule(Text(f"example {rollout.example_id} · rollout {rollout.rollout_index}", style="bold"))
    reward = "–" if rollout.reward is None else _num(rollout.reward)
    header = Text(f"reward {reward} · stop {rollout.stop_reason or 'none'}")
    if rollout.metrics:
        header.append(" · " + " ".join(f"{name}={_num(v)}" for name, v in sorted(rollout.metrics.items())))
    lines: list[Text] = [header]
    if rollout.error is not None:
        err = rollout.error
        lines.append(Text(f"error [{err.stage}] {err.type}: {_truncate(err.message, 500)}", style="red"))
    console.print(Group(*lines))
    for message in rollout.messages:
        console.print(_message_panel(message, max_chars))
