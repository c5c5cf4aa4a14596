"""Rollouts as a Hugging Face ``datasets.Dataset``: what ``--save-dataset`` writes and SFT reads.

Columns: ``example_id``, ``rollout_index``, ``prompt`` and ``completion`` (chat messages),
``answer`` and ``info`` (JSON strings, since their types vary from row to row; no answer is
null), ``reward`` (null for a failed rollout), one
column per reward function, ``stop_reason``, ``error`` (``"stage/Type: message"`` or ``""``) and
``tools`` (the tool schemas the model was given, a JSON string; ``""`` for none).
Messages are normalised to the same keys (``role``, ``content``, ``tool_calls`` as a JSON string,
``tool_call_id``, ``weight``) so that Arrow can store a conversation with and without tool calls
side by side. ``weight`` is OpenAI's fine-tuning field: 1, or 0 for an assistant reply that SFT
keeps in the conversation but does not train (``rejected``: the replies the environment answered
with a message that matches it, such as a teacher's deliberate invalid move).
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from palaestra.types import Messages, Rollout, content_text

if TYPE_CHECKING:
    import datasets


def _message_row(message: dict[str, Any], weight: int = 1) -> dict[str, Any]:
    content = message.get("content")
    return {
        "role": str(message.get("role", "")),
        "content": content
        if isinstance(content, str)
        else json.dumps(content)
        if content is not None
        else "",
        "tool_calls": json.dumps(message["tool_calls"]) if message.get("tool_calls") else "",
        "tool_call_id": str(message.get("tool_call_id") or ""),
        "weight": weight,
    }


def messages_from_row(messages: Sequence[dict[str, str]]) -> Messages:
    """The chat messages of a dataset row, back in OpenAI form (empty fields dropped)."""
    out: Messages = []
    for row in messages:
        message: dict[str, Any] = {"role": row["role"], "content": row["content"]}
        if row.get("tool_calls"):
            message["tool_calls"] = json.loads(row["tool_calls"])
        if row.get("tool_call_id"):
            message["tool_call_id"] = row["tool_call_id"]
        if row.get("weight", 1) == 0:
            message["weight"] = 0
        out.append(message)
    return out


def reply_weights(messages: Messages, rejected: re.Pattern[str] | None) -> list[int]:
    """Each message's ``weight``: 0 for an assistant reply whose next message (the environment's
    or a tool's answer) matches ``rejected``, else 1."""
    weights = [1] * len(messages)
    if rejected is None:
        return weights
    for i, (message, answer) in enumerate(itertools.pairwise(messages)):
        if message.get("role") == "assistant" and rejected.search(content_text(answer.get("content"))):
            weights[i] = 0
    return weights


def rollouts_to_rows(
    rollouts: Sequence[Rollout], rejected: re.Pattern[str] | None = None
) -> list[dict[str, Any]]:
    """One row per rollout, with the same columns for every row; ``rejected``: see the module."""
    names = sorted({name for r in rollouts for name in r.metrics})
    rows = []
    for r in rollouts:
        error = f"{r.error.stage}/{r.error.type}: {r.error.message}" if r.error else ""
        weights = reply_weights(r.messages, rejected)
        row: dict[str, Any] = {
            "example_id": r.example_id,
            "rollout_index": r.rollout_index,
            "prompt": [_message_row(m, w) for m, w in zip(r.prompt, weights[: len(r.prompt)], strict=True)],
            "completion": [
                _message_row(m, w) for m, w in zip(r.completion, weights[len(r.prompt) :], strict=True)
            ],
            "answer": None if r.answer is None else json.dumps(r.answer, default=repr),
            "info": json.dumps(r.info, default=repr),
            "reward": r.reward,
            "stop_reason": r.stop_reason or "",
            "error": error,
            "tools": json.dumps(r.tools) if r.tools else "",
            "env": r.env or "",  # an EnvGroup rollout's environment
        }
        for name in names:
            row[name] = r.metrics.get(name)
        rows.append(row)
    return rows


def rollouts_to_dataset(
    rollouts: Sequence[Rollout], rejected: re.Pattern[str] | None = None
) -> datasets.Dataset:
    """A ``datasets.Dataset`` of the rollouts (needs the ``datasets`` extra)."""
    try:
        import datasets
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ImportError(
            "saving a dataset needs the datasets package: pip install 'palaestra[datasets]'"
        ) from exc
    return datasets.Dataset.from_list(rollouts_to_rows(rollouts, rejected))


def save_dataset(
    rollouts: Sequence[Rollout], path: Path | str, rejected: re.Pattern[str] | None = None
) -> Path:
    """Write the rollouts with ``Dataset.save_to_disk``; load with ``datasets.load_from_disk``."""
    import datasets

    path = Path(path)
    was_enabled = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # a bar per save is noise in a command's output
    try:
        rollouts_to_dataset(rollouts, rejected).save_to_disk(str(path))
    finally:
        if was_enabled:
            datasets.enable_progress_bars()
    return path
