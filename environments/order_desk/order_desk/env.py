"""``load_environment``: the order desk, a ``StatefulToolEnv`` whose tools read the example's shop."""

from __future__ import annotations

import math
import re
from typing import Any

import palaestra as pa
from order_desk.shop import KINDS, make_dataset, shop_of
from order_desk.tools import TOOLS
from palaestra.checks import check_int

SYSTEM_PROMPT = """\
You work at a shop's order desk and answer a customer's question about one of their orders. \
Look it up with the tools: find_customer(name) gives the customer's id and city, \
list_orders(customer_id) lists their orders with each order's id, day and status, \
get_order(order_id) shows an order's lines and total. Call one tool at a time. \
When you know the answer, reply without calling a tool and put only the answer inside \
<answer>...</answer> tags: a city, a status, an order id or a total, as the tools write it, \
e.g. <answer>W4821</answer>."""

CLOSED_BOOK_PROMPT = """\
You work at a shop's order desk and answer a customer's question about one of their orders. \
Reply with only the answer inside <answer>...</answer> tags: a city, a status, an order id or a \
total, e.g. <answer>W4821</answer>."""

WRAPPERS = " \t\n`'\"*#$"


def normalize(text: str | None) -> str:
    """An answer as compared: case, spaces, quotes, ``#``, ``$`` and a trailing ``.`` removed;
    a number written with two decimals (``33`` and ``33.0`` are ``33.00``)."""
    value = " ".join((text or "").split()).casefold().strip(WRAPPERS).rstrip(".").strip(WRAPPERS)
    if re.fullmatch(r"-?\d+(\.\d+)?", value):
        number = float(value)
        if math.isfinite(number):
            return f"{number:.2f}"
    return value


def correct(parser: pa.Parser, completion: pa.Messages, answer: str) -> float:
    """1.0 when the answer in the last reply equals the gold one, once normalized."""
    parsed = parser.parse_answer(completion)
    return float(parsed is not None and normalize(parsed) == normalize(answer) != "")


def answer_format(parser: pa.Parser, completion: pa.Messages) -> float:
    """The parser's format score of the last reply (1.0: one ``<answer>`` block)."""
    texts = parser.assistant_texts(completion)
    return parser.format_score(texts[-1]) if texts else 0.0


class OrderDeskEnv(pa.StatefulToolEnv):
    """Each rollout reads its example's shop (rebuilt from ``info["shop_seed"]``) through the tools."""

    async def setup_state(self, state: pa.State) -> None:
        state.resources["shop"] = shop_of(state.example.info["shop_seed"])


def load_environment(
    num_examples: int = 1000,
    seed: int = 0,
    max_turns: int = 6,
    closed_book: bool = False,
    kinds: list[str] | tuple[str, ...] = KINDS,
) -> pa.ToolEnv:
    """The order desk over ``num_examples`` questions generated from ``seed``, each about a shop
    of its own. ``closed_book``: no tools (and a prompt that names none), to measure what a model
    answers without looking. ``kinds``: the questions asked, cycled in this order."""
    check_int("num_examples", num_examples, minimum=1)
    check_int("seed", seed)
    check_int("max_turns", max_turns, minimum=1)
    if not isinstance(closed_book, bool):
        raise ValueError(f"closed_book must be true or false, got {closed_book!r}")
    if (
        not isinstance(kinds, (list, tuple))
        or not kinds
        or any(k not in KINDS for k in kinds)
        or len(set(kinds)) < len(kinds)
    ):
        raise ValueError(f"kinds must be a list of distinct names from {', '.join(KINDS)}; got {kinds!r}")
    parser = pa.XMLParser(["answer"])
    rubric = pa.Rubric(parser=parser)
    rubric.add(correct, weight=1.0)
    rubric.add(answer_format, weight=0.0)
    options: dict[str, Any] = dict(
        dataset=make_dataset(num_examples, seed, tuple(kinds)), parser=parser, rubric=rubric
    )
    if closed_book:
        return pa.ToolEnv(system_prompt=CLOSED_BOOK_PROMPT, max_turns=1, **options)
    env = OrderDeskEnv(system_prompt=SYSTEM_PROMPT, max_turns=max_turns, **options)
    for tool in TOOLS:
        env.add_tool(tool, hidden=["shop"])
    return env
