"""Conversations to token ids and a loss mask: train on every assistant turn, nothing else.

An assistant message with ``"weight": 0`` (OpenAI's fine-tuning format) stays in the conversation,
so the turns after it see it, but is not trained: a teacher's deliberate mistake that the
environment rejected teaches the student the recovery that follows it, not the mistake.

The ids come from ``palaestra.chat_template``, the path ``LocalClient`` samples from, so the model
is trained on exactly the ids it will see. The mask is found by rendering the conversation prefix
by prefix: assistant turn ``i`` starts where the rendered prompt of ``messages[:i]`` (with the
assistant header, as when sampling) ends, and stops after the end-of-turn token of
``messages[:i+1]``. System, user, tool and environment tokens, the assistant header and whatever
follows the end-of-turn token (ChatML's newline and next ``<|im_start|>``) are masked. Each prefix's
ids must be a prefix of the whole conversation's ids; a template that breaks this (one that
rewrites earlier turns, say) is refused with a clear error rather than trained on wrongly.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from palaestra import chat_template
from palaestra.types import Messages

IGNORE = -100  # the label of a position that is not trained (PyTorch's cross-entropy ignore_index)


class TemplateError(ValueError):
    """The chat template does not render a conversation as a sequence of growing prefixes."""


@dataclass(frozen=True)
class Encoded:
    """One conversation: ``input_ids`` and ``labels`` (the id where trained, ``IGNORE`` elsewhere).

    The ids end at the last trained token: later tokens cannot change the loss. ``cut`` counts the
    trained tokens lost to ``max_length``; ``prompt_length`` is where the first trained token is.
    """

    input_ids: list[int]
    labels: list[int]
    prompt_length: int
    cut: int = 0

    @property
    def trained(self) -> int:
        return sum(label != IGNORE for label in self.labels)


def token_ids(
    tokenizer: Any, messages: Messages, *, generation_prompt: bool, tools: list[dict[str, Any]] | None = None
) -> list[int]:
    """The ids of ``messages`` (and ``tools``) rendered by the chat template, as ``LocalClient``
    tokenises prompts."""
    text = chat_template.render(tokenizer, messages, tools=tools, add_generation_prompt=generation_prompt)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def assistant_spans(
    tokenizer: Any,
    messages: Messages,
    end_of_turn: Collection[int],
    tools: list[dict[str, Any]] | None = None,
) -> tuple[list[int], list[tuple[int, int]]]:
    """The conversation's ids and the ``[start, stop)`` token span of each assistant turn."""
    full = token_ids(tokenizer, messages, generation_prompt=False, tools=tools)
    spans = []
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = token_ids(tokenizer, messages[:i], generation_prompt=True, tools=tools)
        start = len(_prefix(full, prompt, i, "prompt"))
        turn = token_ids(tokenizer, messages[: i + 1], generation_prompt=False, tools=tools)
        stop = len(_prefix(full, turn, i, "turn"))
        ends = [j for j in range(start, stop) if full[j] in end_of_turn]
        spans.append((start, ends[-1] + 1 if ends else stop))  # content + end-of-turn token, no more
    return full, spans


def encode(
    tokenizer: Any,
    messages: Messages,
    *,
    max_length: int,
    end_of_turn: Collection[int],
    tools: list[dict[str, Any]] | None = None,
) -> Encoded:
    """``messages`` (given ``tools``) as ids and labels, cut at ``max_length`` tokens (the cut is counted)."""
    full, spans = assistant_spans(tokenizer, messages, end_of_turn, tools)
    weights = [message.get("weight", 1) for message in messages if message.get("role") == "assistant"]
    spans = [span for span, weight in zip(spans, weights, strict=True) if weight]
    if not spans:
        raise ValueError(
            "the conversation has no assistant message to learn"
            + (" (every one has weight 0)" if weights else "")
        )
    labels = [IGNORE] * len(full)
    for start, stop in spans:
        labels[start:stop] = full[start:stop]
    end = spans[-1][1]
    kept = min(end, max_length)
    cut = sum(label != IGNORE for label in labels[kept:end])
    return Encoded(full[:kept], labels[:kept], prompt_length=spans[0][0], cut=cut)


def end_of_turn_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    """The ids that end an assistant turn: the tokenizer's EOS and the model's generation EOS ids."""
    ids = {tokenizer.eos_token_id} - {None}
    eos = getattr(generation_config, "eos_token_id", None)
    ids |= {eos} if isinstance(eos, int) else set(eos or [])
    return ids


def _prefix(full: Sequence[int], part: list[int], turn: int, what: str) -> list[int]:
    if full[: len(part)] != part:
        at = next(
            (j for j, (a, b) in enumerate(zip(full, part, strict=False)) if a != b), min(len(full), len(part))
        )
        raise TemplateError(
            f"the chat template does not render conversations prefix by prefix: the {what} before message "
            f"{turn} differs from the whole conversation at token {at}, so assistant tokens cannot be "
            "masked exactly (templates that rewrite earlier turns are not supported)"
        )
    return part
