"""Parsers: pull answers out of model replies, and score whether replies follow a format.

Contract:
- ``parse``, ``parse_answer``, ``format_score`` and ``format_reward`` never raise for any ``str``
  input (any unicode, control characters, NUL, lone surrogates, megabytes), and run in time
  linear in the input: no backtracking regex spans tag contents.
- A completion is a ``str`` (one assistant reply) or a list of OpenAI chat messages. Message
  content may be ``None`` (read as ``""``), a ``str``, or a list of content parts whose text parts
  are joined with no separator; anything else reads as ``""``, and non-dict list items are skipped.
- Tags are exact and case-sensitive: ``<answer>`` and ``</answer>``, with no whitespace or
  attributes inside the brackets (``< answer>`` and ``<answer id="1">`` are plain text). This keeps
  matching unambiguous and cheap; models trained on a format emit its tags exactly.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from palaestra.types import Messages, content_text

FieldSpec = str | tuple[str, ...]  # a tag name, or alternative names with the canonical one first
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"


def _last_text(completion: Messages | str) -> str | None:
    """The text of the last assistant reply, or None when there is none or it is blank."""
    texts = Parser.assistant_texts(completion)
    if not texts or not texts[-1].strip():
        return None
    return texts[-1]


def _mean_format_score(parser: Parser, completion: Messages | str) -> float:
    """Mean of ``parser.format_score`` over the assistant replies; 0.0 when there are none."""
    texts = Parser.assistant_texts(completion)
    if not texts:
        return 0.0
    return sum(parser.format_score(text) for text in texts) / len(texts)


class Parser:
    """The identity parser: a reply's answer is its whole text, stripped."""

    def parse(self, text: str) -> Any:
        """The parsed form of one reply; here the text itself, stripped."""
        return text.strip()

    @staticmethod
    def assistant_texts(completion: Messages | str) -> list[str]:
        """The text of every assistant reply in order; a ``str`` completion is one reply."""
        if isinstance(completion, str):
            return [completion]
        if not isinstance(completion, (list, tuple)):
            return []
        return [
            content_text(message.get("content"))
            for message in completion
            if isinstance(message, dict) and message.get("role") == "assistant"
        ]

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The answer in the last assistant reply; None if there is no reply or it is blank."""
        text = _last_text(completion)
        return None if text is None else self.parse(text)

    def format_score(self, text: str) -> float:
        """How well one reply follows the format, in [0, 1]; here 1.0 for any non-blank text."""
        return 1.0 if text.strip() else 0.0

    def format_reward(self, completion: Messages | str) -> float:
        """1.0 if at least one assistant reply has non-blank text, else 0.0."""
        return 1.0 if any(text.strip() for text in self.assistant_texts(completion)) else 0.0

    def format_reward_func(self) -> Callable[..., float]:
        """``format_reward`` as a plain function, for a rubric that binds arguments by name."""

        def format_reward(completion: Messages | str) -> float:
            """How well ``completion`` follows the parser's format, in [0, 1]."""
            return self.format_reward(completion)

        return format_reward


class ParsedXML:
    """The fields of one reply: ``p.answer``, ``p["answer"]`` or ``p.get("answer")``.

    A field is its stripped content, ``""`` if present but empty, ``None`` if absent. Item access
    works for every field name; attribute access for names that are identifiers and not methods.
    """

    def __init__(self, values: dict[str, str | None]) -> None:
        self._values = dict(values)

    def __getattr__(self, name: str) -> str | None:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        raise AttributeError(f"no field {name!r}; fields are {list(values)}")

    def __getitem__(self, name: str) -> str | None:
        return self._values[name]

    def get(self, name: str, default: str | None = None) -> str | None:
        """The field's content, or ``default`` if the field is absent or unknown."""
        value = self._values.get(name)
        return default if value is None else value

    def as_dict(self) -> dict[str, str | None]:
        """All fields as a dict, in declared order."""
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ParsedXML) and self._values == other._values

    def __repr__(self) -> str:
        return f"ParsedXML({self._values!r})"


class XMLParser(Parser):
    r"""Replies made of ``<tag>...</tag>`` fields: ``XMLParser(["think", ("answer", "final")])``.

    A field is a tag name, or a tuple of alternative names whose first is the canonical one.
    ``parse`` is lenient: each field is the content of its last closed occurrence, matched like
    ``re.findall(r"<(a|b)>(.*?)</\1>", text, re.S)[-1]`` (an opening tag pairs with the nearest
    later closing tag of the same name; unclosed tags never match). ``format_score`` is strict.
    """

    def __init__(self, fields: Sequence[FieldSpec], answer_field: str | None = None) -> None:
        if isinstance(fields, str) or not isinstance(fields, Sequence):
            raise TypeError(f"fields must be a list of tag names or name tuples, not {fields!r}")
        self.fields: tuple[tuple[str, ...], ...] = ()
        self._field_of: dict[str, int] = {}
        for spec in fields:
            names = (spec,) if isinstance(spec, str) else spec
            if not isinstance(names, (tuple, list)) or not names:
                raise ValueError(f"field {spec!r}: expected a tag name or a non-empty tuple")
            for name in names:
                if not isinstance(name, str) or not _NAME.fullmatch(name):
                    raise ValueError(f"invalid tag name {name!r}: must match {_NAME.pattern}")
                if name in self._field_of:
                    raise ValueError(f"duplicate tag name {name!r} in fields")
                self._field_of[name] = len(self.fields)
            self.fields += (tuple(names),)
        if not self.fields:
            raise ValueError("XMLParser needs at least one field")
        self.field_names: tuple[str, ...] = tuple(alts[0] for alts in self.fields)
        answer_field = self.field_names[-1] if answer_field is None else answer_field
        if answer_field not in self.field_names:
            raise ValueError(f"answer_field {answer_field!r} not in {list(self.field_names)}")
        self.answer_field = answer_field
        alternation = "|".join(re.escape(name) for name in self._field_of)
        self._tag = re.compile(f"<(/?)({alternation})>")

    def _tokens(self, text: str) -> list[tuple[int, int, bool, str]]:
        """Every declared tag in ``text``: (start, end, is_closing, name), in order."""
        return [(m.start(), m.end(), m[1] == "/", m[2]) for m in self._tag.finditer(text)]

    def parse(self, text: str) -> ParsedXML:
        """Each field's content in its last closed occurrence, stripped; None where absent."""
        tokens = self._tokens(text)
        last_close = {name: i for i, (_, _, closing, name) in enumerate(tokens) if closing}
        spans: list[tuple[int, int] | None] = [None] * len(self.fields)
        open_tags: list[tuple[str, int] | None] = [None] * len(self.fields)
        for i, (start, end, closing, name) in enumerate(tokens):
            field = self._field_of[name]
            current = open_tags[field]
            if current is None:
                if not closing and last_close.get(name, -1) > i:
                    open_tags[field] = (name, end)
            elif closing and name == current[0]:
                spans[field] = (current[1], start)
                open_tags[field] = None
        values = [None if span is None else text[span[0] : span[1]].strip() for span in spans]
        return ParsedXML(dict(zip(self.field_names, values, strict=True)))

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The ``answer_field`` of the last assistant reply; None if absent."""
        text = _last_text(completion)
        return None if text is None else self.parse(text)[self.answer_field]

    def format(self, **values: Any) -> str:
        r"""Render fields as ``<tag>\nvalue\n</tag>`` in declared order, e.g. for few-shot turns.

        Fields left out (or None) are skipped; an unknown field name is a ``ValueError``.
        """
        unknown = set(values) - set(self.field_names)
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}; known: {list(self.field_names)}")
        return "\n".join(
            f"<{name}>\n{values[name]}\n</{name}>"
            for name in self.field_names
            if values.get(name) is not None
        )

    def format_score(self, text: str) -> float:
        """One reply's format score in [0, 1]: 1.0 only for each field once, in order, no stray tag.

        Declared tags must form flat blocks: each opening tag immediately followed (among declared
        tags) by the closing tag of the same name. Any other tag is stray (unclosed, unopened,
        mismatched or nested) and makes the score 0.0. Otherwise the score is the share of fields
        that occur as exactly one block, halved if those blocks are out of declared order. Text
        around the blocks is allowed; empty content counts as present.
        """
        tokens = self._tokens(text)
        blocks: list[int] = []
        i = 0
        while i < len(tokens):
            _, _, closing, name = tokens[i]
            if closing or i + 1 == len(tokens) or tokens[i + 1][2:] != (True, name):
                return 0.0
            blocks.append(self._field_of[name])
            i += 2
        counts = Counter(blocks)
        once = [field for field in blocks if counts[field] == 1]
        score = len(once) / len(self.fields)
        return score if once == sorted(once) else score / 2

    def format_reward(self, completion: Messages | str) -> float:
        """Mean ``format_score`` over assistant replies; 0.0 when there are none."""
        return _mean_format_score(self, completion)


class ThinkParser(Parser):
    """Replies of ``<think>reasoning</think>`` then an answer, which ``answer_parser`` may parse."""

    def __init__(self, answer_parser: Parser | None = None) -> None:
        self.answer_parser = answer_parser

    @staticmethod
    def _after_think(text: str) -> str | None:
        """Text after the last ``</think>``; None if reasoning was opened but never closed."""
        end = text.rfind(_THINK_CLOSE)
        if end >= 0:
            return text[end + len(_THINK_CLOSE) :].strip()
        return None if _THINK_OPEN in text else text.strip()

    def parse(self, text: str) -> Any:
        """The reply after its reasoning, stripped (parsed by ``answer_parser`` if given).

        None when a ``<think>`` was never closed. A reply with no think tags is all answer.
        """
        rest = self._after_think(text)
        if rest is None or self.answer_parser is None:
            return rest
        return self.answer_parser.parse(rest)

    def parse_answer(self, completion: Messages | str) -> str | None:
        """The answer after the last reply's reasoning (via ``answer_parser``); None if absent."""
        text = _last_text(completion)
        rest = None if text is None else self._after_think(text)
        if not rest:
            return None
        return rest if self.answer_parser is None else self.answer_parser.parse_answer(rest)

    def think(self, text: str) -> str | None:
        """The reasoning: from the first ``<think>`` (or the start) to the last ``</think>``.

        None when there is no ``</think>``. Starting at the text's start covers chat templates
        that put the opening ``<think>`` in the prompt.
        """
        end = text.rfind(_THINK_CLOSE)
        if end < 0:
            return None
        start = text.find(_THINK_OPEN, 0, end)
        start = 0 if start < 0 else start + len(_THINK_OPEN)
        return text[start:end].strip()

    def format_score(self, text: str) -> float:
        """1.0 iff the reply opens with its only think block, then an answer that passes; else 0.0.

        The answer is the non-blank text after ``</think>``; with an ``answer_parser`` it must
        also score 1.0 on that parser's ``format_score``.
        """
        body = text.lstrip()
        if not body.startswith(_THINK_OPEN):
            return 0.0
        if body.count(_THINK_OPEN) != 1 or body.count(_THINK_CLOSE) != 1:
            return 0.0
        rest = body[body.index(_THINK_CLOSE) + len(_THINK_CLOSE) :].strip()
        if not rest:
            return 0.0
        if self.answer_parser is None:
            return 1.0
        return 1.0 if self.answer_parser.format_score(rest) == 1.0 else 0.0

    def format_reward(self, completion: Messages | str) -> float:
        """Mean ``format_score`` over assistant replies; 0.0 when there are none."""
        return _mean_format_score(self, completion)
