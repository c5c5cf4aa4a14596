"""Chat messages to token ids through a Hugging Face chat template: the one path for sampling and training.

``LocalClient`` renders every prompt with ``prompt_ids``; the trainers tokenise conversations with
the same functions, so a model is trained on exactly the ids it samples from.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from palaestra.types import Messages


def template_messages(messages: Messages) -> Messages:
    """Messages as chat templates expect them: text content, tool-call arguments as dicts."""
    out = []
    for message in messages:
        message = {**message, "content": message.get("content") or ""}
        if message.get("tool_calls"):
            calls = []
            for call in message["tool_calls"]:
                function = dict(call.get("function") or {})
                if isinstance(function.get("arguments"), str):
                    with contextlib.suppress(json.JSONDecodeError):
                        function["arguments"] = json.loads(function["arguments"])
                calls.append({**call, "function": function})
            message["tool_calls"] = calls
        out.append(message)
    return out


def render(
    tokenizer: Any,
    messages: Messages,
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The text of ``messages`` under the tokenizer's chat template (with the assistant header)."""
    extra = {"tools": tools} if tools else {}
    text = tokenizer.apply_chat_template(
        template_messages(messages), add_generation_prompt=add_generation_prompt, tokenize=False, **extra
    )
    return str(text)


def prompt_ids(tokenizer: Any, messages: Messages, *, tools: list[dict[str, Any]] | None = None) -> list[int]:
    """The token ids a model is prompted with for ``messages``: the rendered text, no extra specials."""
    return list(tokenizer(render(tokenizer, messages, tools=tools), add_special_tokens=False)["input_ids"])


def takes_tools(tokenizer: Any) -> bool:
    """Whether the chat template mentions ``tools`` (a template without it would drop them silently)."""
    template = tokenizer.chat_template  # a string, or a dict of named templates
    return "tools" in (template if isinstance(template, str) else " ".join(template.values()))
