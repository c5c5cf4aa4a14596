"""Test helpers for code environments: is the sandbox here, which worker processes are alive, and
scripted policies that call the ``python`` tool."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from palaestra.sandbox import Sandbox, SandboxUnavailable
from palaestra.types import Message, Messages

# a line of the worker's source, which is its command line: every process of a worker shows it
MARKER = b"The Python worker that runs model code inside the sandbox"


def sandbox_problem(mode: str = "bubblewrap") -> str | None:
    """Why the sandbox cannot start here (for a skip reason), or None when it can."""
    try:
        Sandbox(mode).check()
    except SandboxUnavailable as exc:
        return str(exc)
    return None


def sandbox_processes() -> list[int]:
    """The ids of every process on this machine that runs, or was forked from, a REPL worker."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if MARKER in f.read():
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def python_call(code: str, call_id: str = "call_0") -> dict[str, Any]:
    """A tool call of the ``python`` tool, as a model sends it."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "python", "arguments": json.dumps({"code": code})},
    }


def code_policy(*codes: str, answer: str = "done") -> Callable[[Messages], Message | str]:
    """A scripted policy that runs ``codes`` one call per turn, then replies ``answer``."""

    def policy(messages: Messages) -> Message | str:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if turn < len(codes):
            return {"content": "", "tool_calls": [python_call(codes[turn], f"call_{turn}")]}
        return answer

    return policy
