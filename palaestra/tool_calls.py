"""Hermes-style tool calls in generated text: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Pure functions for clients that generate raw text (``LocalClient``): ``parse`` turns a finished
reply into content and OpenAI tool-call dicts; ``content_span`` says how much of a reply still
being generated may be streamed as content without ever showing tool-call markup.

Rules (``parse``):

- Each ``<tool_call>`` holds one JSON object with a non-empty string ``name`` and ``arguments``,
  an object (absent counts as ``{}``); whitespace around the JSON is ignored. The JSON is read
  with a real decoder, so braces and a ``</tool_call>`` inside its strings are fine.
- Calls become ``{"id": "call_<i>", "type": "function", "function": {"name", "arguments"}}`` in
  order, ``arguments`` a JSON string (as OpenAI sends them).
- A final ``<tool_call>`` with no closing tag counts when the reply ended on its own (``ended``:
  EOS or a stop string) and its JSON is complete; at ``max_tokens`` it is text.
- Anything else after ``<tool_call>`` (bad JSON, no name, non-object arguments, NaN, text after
  the object, an unclosed tag) is not a call: that block stays in the content as it was, up to
  and including the next ``</tool_call>`` (or up to a ``<tool_call>`` that comes first, or to
  the end), and is counted in ``malformed``.
- ``content`` is the text outside the calls, stripped of surrounding whitespace: ``""`` (never
  ``None``) when nothing else was said. Text after a call is kept. Every reply to a request
  with tools goes through this, calls or not, so its content is always stripped.

Not handled: other formats (Mistral's ``[TOOL_CALLS]``, Llama's ``<|python_tag|>``, bare JSON
replies), and a ``<tool_call>`` in the content meant as prose (it is read as a call attempt).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_WHITESPACE = " \t\n\r"


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: Python reads them, JSON has none


_DECODER = json.JSONDecoder(parse_constant=_no_constants)


@dataclass
class Parsed:
    """A reply split into ``content``, OpenAI ``tool_calls`` and the count of ``malformed`` attempts."""

    content: str
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    malformed: int = 0


def parse(text: str, *, ended: bool = True) -> Parsed:
    """The content and tool calls of a finished reply; see the module docstring for the rules.

    ``ended``: the reply ended on its own (EOS or a stop string), not at ``max_tokens``, so a
    last ``<tool_call>`` whose closing tag never came still counts if its JSON is whole.
    """
    pieces: list[str] = []
    calls: list[dict[str, Any]] = []
    malformed = 0
    pos = 0
    while (start := text.find(OPEN, pos)) >= 0:
        pieces.append(text[pos:start])
        call, end = _read_call(text, start + len(OPEN), ended)
        if call is not None:
            call["id"] = f"call_{len(calls)}"
            calls.append(call)
        else:
            malformed += 1
            end = _block_end(text, start + len(OPEN))
            pieces.append(text[start:end])
        pos = end
    pieces.append(text[pos:])
    return Parsed("".join(pieces).strip(), calls, malformed)


def _read_call(text: str, pos: int, ended: bool) -> tuple[dict[str, Any] | None, int]:
    """The call whose JSON starts at or after ``pos`` and where its block ends, or ``(None, pos)``."""
    pos = _skip(text, pos)
    try:
        value, pos = _DECODER.raw_decode(text, pos)
    except ValueError:
        return None, pos
    pos = _skip(text, pos)
    if text.startswith(CLOSE, pos):
        pos += len(CLOSE)
    elif not (ended and pos == len(text)):
        return None, pos
    if not isinstance(value, dict):
        return None, pos
    name, arguments = value.get("name"), value.get("arguments", {})
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None, pos
    function = {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}
    return {"id": "", "type": "function", "function": function}, pos


def _block_end(text: str, pos: int) -> int:
    """Where a malformed block opened before ``pos`` ends: after its ``</tool_call>``, or before
    the next ``<tool_call>`` if that comes first (an unclosed attempt does not swallow the next
    call), or at the end of the text."""
    close, reopen = text.find(CLOSE, pos), text.find(OPEN, pos)
    if reopen >= 0 and (close < 0 or reopen < close):
        return reopen
    return len(text) if close < 0 else close + len(CLOSE)


def _skip(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _WHITESPACE:
        pos += 1
    return pos


def content_span(text: str) -> tuple[int, int]:
    """The part ``text[start:end]`` of a reply so far that a stream may show as content now.

    Held back: leading whitespace (the content is stripped), everything from the first
    ``<tool_call>`` on, a tail that could be the start of one, and trailing whitespace (a call
    may follow it). What is shown is therefore always a prefix of ``parse(final).content``
    for any reply that continues ``text``. ``start <= end``.
    """
    start = len(text) - len(text.lstrip())
    end = text.find(OPEN)
    if end < 0:
        end = len(text)
        for k in range(min(len(OPEN) - 1, end), 0, -1):
            if text.endswith(OPEN[:k]):
                end -= k
                break
    end = len(text[:end].rstrip())
    return start, max(start, end)
