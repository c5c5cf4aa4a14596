"""Reward and metric functions: exact match on the parsed answer, and whether the gold section was read.

``exact_match`` compares ``normalize(parsed answer)`` with ``normalize(gold)`` for the gold answer
and each alias, for equality only. "Contains" is not accepted: a reply listing several candidates
("AssertionError or TypeError") would then score, and a policy trained on this reward learns to
list candidates. Other spellings a reader would accept are listed as ``aliases`` in the dataset.

``normalize`` removes what wraps an answer, not what is in it: case, Unicode compatibility forms,
runs of whitespace, backticks, quotes and ``*`` around it (Markdown code and bold), a trailing
``.``, ``,``, ``;``, ``:``, ``!`` or ``?``, a trailing ``()`` and a leading "the", "a" or "an".
Punctuation inside is kept: in this dataset it is the answer (``__init__``, ``-(x+1)``, ``0.01``,
``UTF-8``). An answer that is only punctuation (``...``) keeps it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import palaestra as pa

WRAPPERS = "`'\"*“”‘’ \t\n"
TRAILING = ".,;:!?"


def normalize(text: str | None) -> str:
    """``text`` as compared by ``exact_match`` (see the module docstring)."""
    if text is None:
        return ""
    value = " ".join(unicodedata.normalize("NFKC", text).casefold().split())
    value = value.strip(WRAPPERS)
    stripped = value.rstrip(TRAILING).strip(WRAPPERS)
    if stripped:  # "..." stays "..."
        value = stripped
    value = re.sub(r"^(?:the|a|an) (?=\S)", "", value)
    if value.endswith("()") and len(value) > 2:
        value = value[:-2]
    return value


def exact_match(parser: pa.Parser, completion: pa.Messages, answer: str, info: dict[str, Any]) -> float:
    """1.0 if the parsed answer equals the gold answer or an alias once normalized, else 0.0."""
    parsed = normalize(parser.parse_answer(completion))
    if not parsed:
        return 0.0
    gold = [answer, *info.get("aliases", [])]
    return 1.0 if any(parsed == normalize(g) for g in gold) else 0.0


def read_sections(completion: pa.Messages) -> list[str]:
    """The texts ``read_section`` returned in this rollout, in order (error replies left out)."""
    calls: dict[str, bool] = {}
    texts = []
    for message in completion:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict):
                    calls[str(call.get("id", ""))] = function.get("name") == "read_section"
        elif message.get("role") == "tool" and calls.get(str(message.get("tool_call_id", ""))):
            content = pa.content_text(message.get("content"))
            if not content.startswith("Error:"):
                texts.append(content)
    return texts


def read_gold_section(completion: pa.Messages, info: dict[str, Any]) -> float:
    """1.0 if a section the model read holds the question's evidence (the gold section, or a
    copy of it: several pages repeat sections of others, like ``try`` and ``compound``)."""
    evidence = " ".join(str(info.get("evidence", "")).split())
    if not evidence:
        return 0.0
    return 1.0 if any(evidence in " ".join(text.split()) for text in read_sections(completion)) else 0.0


def answer_format(parser: pa.Parser, completion: pa.Messages) -> float:
    """The parser's format score of the last reply, the answer (1.0: one ``<answer>`` block);
    the replies that call tools carry no text and are not scored."""
    texts = parser.assistant_texts(completion)
    return parser.format_score(texts[-1]) if texts else 0.0
