"""Scripted desk clerks: they play through the tools like a model, reading only what the tools
return (never the gold answer), so their rollouts are demonstrations a model can learn from.

- ``clerk``: the teacher. It looks the customer up, lists their orders, opens the order when the
  total is asked, and answers; but when a customer has several orders, it reads the wrong line
  of the list 30% of the time (the line above or below the day asked), as a hurried clerk does.
  About 80% of its answers are right: every city, about 70% of the rest.
- ``careful_clerk``: the same clerk without the slips: every answer right.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import palaestra as pa

SLIP = 0.3  # the clerk reads a neighbouring line of a customer's order list
_QUESTION = re.compile(
    r"I am (?P<name>[A-Z][a-z]+ [A-Z][a-z]+)(?: and I placed an order on day (?P<city_day>\d+)\. Which city"
    r"|\. What is the (?P<what>status|id|total) of the order I placed on day (?P<day>\d+)\?)"
)


def _call(tool: str, turn: int, **arguments: str) -> dict[str, Any]:
    return {
        "content": "",
        "tool_calls": [
            {
                "id": f"call_{turn}",
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(arguments)},
            }
        ],
    }


def _answer(text: str) -> str:
    return f"<answer>{text}</answer>"


def _play(messages: pa.Messages, rng: random.Random | None) -> dict[str, Any] | str:
    question = next(str(m.get("content") or "") for m in messages if m.get("role") == "user")
    match = _QUESTION.search(question)
    if match is None:
        return _answer("I cannot read the question.")
    results = [pa.content_text(m.get("content")) for m in messages if m.get("role") == "tool"]
    turn = len(results)
    if turn == 0:
        return _call("find_customer", turn, name=match["name"])
    found = re.match(r"Customer (C\d+): .*, city (\w+)\.", results[0])
    if found is None:
        return _answer("unknown")
    if match["city_day"]:
        return _answer(found[2])
    if turn == 1:
        return _call("list_orders", turn, customer_id=found[1])
    rows = re.findall(r"^(W\d+) \| day (\d+) \| (\w+)$", results[1], flags=re.M)
    at = next((i for i, (_, day, _) in enumerate(rows) if day == match["day"]), None)
    if at is None:
        return _answer("unknown")
    if turn == 1 + 1 and rng is not None and len(rows) > 1 and rng.random() < SLIP:
        at = at + 1 if at + 1 < len(rows) and (at == 0 or rng.random() < 0.5) else at - 1
    if turn == 2:
        order_id, _, status = rows[at]
        if match["what"] == "status":
            return _answer(status)
        if match["what"] == "id":
            return _answer(order_id)
        return _call("get_order", turn, order_id=order_id)
    total = re.search(r"^Total: ([\d.]+)$", results[2], flags=re.M)
    return _answer(total[1] if total else "unknown")


def clerk(messages: pa.Messages, rng: random.Random) -> dict[str, Any] | str:
    """The teacher: the whole lookup, with a slip on the order list 30% of the time."""
    return _play(messages, rng)


def careful_clerk(messages: pa.Messages) -> dict[str, Any] | str:
    """The whole lookup, without slips."""
    return _play(messages, None)
