"""Keep the rollouts a student should learn from: teacher data for SFT.

``Condition`` is a filter written like ``won == 1 or drew == 1`` or ``reward >= 0.5 and
format_reward == 1``: names are ``reward``, any reward function or metric, ``turns``,
``stop_reason`` and ``env`` (an ``EnvGroup`` rollout's environment); values are numbers or quoted words (``stop_reason == "game_over"``). It is parsed with Python's own grammar and then
interpreted node by node over a small set of allowed forms — never ``eval``-ed — so a condition
cannot run code. A condition is at most ``MAX_CHARS`` characters and ``MAX_DEPTH`` levels deep, so
parsing and applying one takes bounded time and memory (Python's parser and a recursive walk
would otherwise fail with a ``RecursionError`` on ``not not not ...``).

``filter_rollouts`` applies conditions, drops rollouts that failed or whose final reply was cut at
``max_tokens`` (unless asked not to), says which condition dropped each, and counts text that a
student should not imitate: replies cut at ``max_tokens``, an empty ``<think>`` block, a reply
without one (when others have one), and a refusal inside it (a teacher that writes "I cannot
share my internal chain of thought" teaches the student to write it too).
"""

from __future__ import annotations

import ast
import operator
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from palaestra.types import Rollout, content_text

_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
REFUSALS = re.compile(
    r"\b(can(?:no|')t|unable to|won't|will not|not able to)\b[^.\n]{0,40}\b(share|reveal|disclose|provide)\b"
    r"|\bchain[- ]of[- ]thought\b|\binternal (reasoning|thoughts)\b",
    re.I,
)


MAX_CHARS = 2000  # a longer condition is a generated one gone wrong: give several --where instead
MAX_DEPTH = 32  # nesting of and/or/not/comparisons/minus


class ConditionError(ValueError):
    """A condition that is not one this filter understands."""


def _shown(text: str) -> str:
    """A condition for an error message: cut to its first 60 characters."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + f"... ({len(text):,} characters)"


@dataclass(frozen=True)
class Condition:
    """A parsed filter condition; ``holds(rollout)`` applies it."""

    text: str
    tree: ast.expr

    @classmethod
    def parse(cls, text: str) -> Condition:
        text = text.strip()
        if len(text) > MAX_CHARS:
            raise ConditionError(
                f"condition {_shown(text)} is longer than {MAX_CHARS:,} characters; "
                "give several --where conditions instead (all must hold)"
            )
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError as exc:
            raise ConditionError(f"cannot parse condition {_shown(text)}: {exc.msg}") from None
        except (RecursionError, MemoryError):  # the parser's own limit on nesting
            raise ConditionError(f"condition {_shown(text)} is nested more than {MAX_DEPTH} deep") from None
        depth = _depth(tree)
        if depth > MAX_DEPTH:
            raise ConditionError(f"condition {_shown(text)} is nested {depth} deep, more than {MAX_DEPTH}")
        _check(tree, text)
        return cls(text, tree)

    def holds(self, rollout: Rollout) -> bool:
        return bool(_value(self.tree, rollout))

    def names(self) -> set[str]:
        return {n.id for n in ast.walk(self.tree) if isinstance(n, ast.Name)} - _WORDS.keys()


_WORDS = {"true": True, "false": False, "none": None, "True": True, "False": False, "None": None}


def _depth(tree: ast.AST) -> int:
    """How deep ``tree``'s expressions nest, found without recursion (it may be thousands deep)."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, depth = todo.pop()
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr))
    return deepest


def _check(node: ast.AST, text: str) -> None:
    """Allow only: and/or/not, comparisons, names, numbers, strings, a leading minus."""
    allowed = (
        ast.BoolOp,
        ast.And,
        ast.Or,
        ast.UnaryOp,
        ast.Not,
        ast.USub,
        ast.Compare,
        ast.Name,
        ast.Constant,
        ast.Load,
        *_COMPARE,
    )
    for child in ast.walk(node):
        if not isinstance(child, allowed):
            what = type(child).__name__
            raise ConditionError(
                f"condition {_shown(text)}: {what} is not allowed (use names, numbers, comparisons, and/or/not)"
            )
        if isinstance(child, ast.Constant) and not isinstance(child.value, (int, float, str)):
            raise ConditionError(f"condition {_shown(text)}: {child.value!r} is not a number or a word")


def _value(node: ast.expr, rollout: Rollout) -> Any:
    if isinstance(node, ast.BoolOp):
        values = (_value(v, rollout) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):
        inner = _value(node.operand, rollout)
        if isinstance(node.op, ast.Not):
            return not inner
        return None if inner is None else -inner
    if isinstance(node, ast.Compare):
        left = _value(node.left, rollout)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _value(right_node, rollout)
            try:
                if not _COMPARE[type(op)](left, right):
                    return False
            except TypeError:  # None (no reward) or a word against a number: the row does not match
                return False
            left = right
        return True
    if isinstance(node, ast.Name):
        return _field(node.id, rollout)
    assert isinstance(node, ast.Constant)
    return node.value


def _field(name: str, rollout: Rollout) -> Any:
    if name in _WORDS:
        return _WORDS[name]
    if name == "reward":
        return rollout.reward
    if name == "turns":
        return len(rollout.turns)
    if name == "stop_reason":
        return rollout.stop_reason
    if name == "env":
        return rollout.env
    return rollout.metrics.get(name)  # a metric this rollout lacks (it failed): matches nothing


@dataclass
class FilterReport:
    """What ``filter_rollouts`` kept, why it dropped the rest, and what it warns about."""

    kept: list[Rollout]
    total: int
    dropped: Counter[str] = field(default_factory=Counter)  # reason → rollouts
    warnings: Counter[str] = field(default_factory=Counter)  # kind → replies among the kept rollouts


def filter_rollouts(
    rollouts: Sequence[Rollout],
    conditions: Sequence[Condition] = (),
    *,
    keep_errors: bool = False,
    keep_truncated: bool = False,
    drop_flagged: bool = False,
) -> FilterReport:
    """The rollouts that pass every condition; each dropped one is counted under its first reason.

    ``drop_flagged`` also drops kept rollouts with a reply a student should not imitate.
    """
    known = {"reward", "turns", "stop_reason", "env"} | {m for r in rollouts for m in r.metrics}
    for condition in conditions:
        unknown = condition.names() - known
        if unknown:
            raise ConditionError(
                f"condition {condition.text!r} names {', '.join(sorted(unknown))}, which the rollouts do not "
                f'have; they have: {", ".join(sorted(known))} (quote words: stop_reason == "game_over")'
            )
    report = FilterReport(kept=[], total=len(rollouts))
    has_think = any(_THINK.search(t) for r in rollouts for t in _replies(r))
    for rollout in rollouts:
        reason = _drop_reason(rollout, conditions, keep_errors, keep_truncated)
        if reason is None:
            flags = _flags(rollout, has_think)
            report.warnings.update(flags)
            if drop_flagged and flags:
                reason = f"flagged: {', '.join(sorted(set(flags)))}"
        if reason is None:
            report.kept.append(rollout)
        else:
            report.dropped[reason] += 1
    return report


def _drop_reason(
    rollout: Rollout, conditions: Sequence[Condition], keep_errors: bool, keep_truncated: bool
) -> str | None:
    if rollout.error is not None and not keep_errors:
        return f"error ({rollout.error.stage})"
    if rollout.turns and rollout.turns[-1].finish_reason == "length" and not keep_truncated:
        return "final reply cut at max_tokens"
    for condition in conditions:
        if not condition.holds(rollout):
            return f"not {condition.text}"
    return None


def _replies(rollout: Rollout) -> list[str]:
    return [content_text(m.get("content")) for m in rollout.completion if m.get("role") == "assistant"]


def _flags(rollout: Rollout, has_think: bool) -> list[str]:
    """One entry per reply and kind of text a student should not imitate."""
    flags = ["reply cut at max_tokens" for turn in rollout.turns if turn.finish_reason == "length"]
    for text in _replies(rollout):
        thinks = _THINK.findall(text)
        if has_think and not thinks:
            flags.append("no <think> block")
        elif thinks and not any(t.strip() for t in thinks):
            flags.append("empty <think> block")
        if any(REFUSALS.search(t) for t in thinks):
            flags.append("refusal inside <think>")
    return flags
