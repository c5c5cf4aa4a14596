"""Rewards and metrics. Each reads the game's result from ``state``, which the env keeps.

Rewards (the spec's defaults): ``win_reward`` 1.0 (1 win, 0.5 draw, 0 loss or unfinished),
``format_reward`` 0.2 (share of replies in the format), ``invalid_move_penalty`` 1.0 (−0.1 flat
if the game had any invalid move). The talk's first version scores win + 0.2 × format only.
Metrics (weight 0, so an eval summary shows them as rates and means): ``won``, ``drew``,
``lost``, ``unfinished``, ``invalid_moves``, ``had_invalid_move``, ``turns``.
"""

from __future__ import annotations

from typing import Any

import palaestra as pa
from tictactoe.protocol import Variant

WIN_VALUES = {"win": 1.0, "draw": 0.5, "loss": 0.0, "unfinished": 0.0}


def win_reward(state: dict[str, Any]) -> float:
    """1 for a win, 0.5 for a draw, 0 for a loss or a game cut off by the turn cap."""
    return WIN_VALUES[state["outcome"]]


def invalid_move_penalty(state: dict[str, Any]) -> float:
    """−0.1 if any reply was an invalid move, else 0: flat, however many there were."""
    return -0.1 if state["invalid_moves"] else 0.0


def format_reward(completion: pa.Messages, parser: pa.XMLParser) -> float:
    """Share of replies in the format: each of the parser's tags exactly once, in order."""
    texts = parser.assistant_texts(completion)
    if not texts:
        return 0.0
    return sum(parser.format_score(text) == 1.0 for text in texts) / len(texts)


def won(state: dict[str, Any]) -> float:
    """1 if the model won (its mean is the win rate)."""
    return 1.0 if state["outcome"] == "win" else 0.0


def drew(state: dict[str, Any]) -> float:
    """1 if the game was a draw."""
    return 1.0 if state["outcome"] == "draw" else 0.0


def lost(state: dict[str, Any]) -> float:
    """1 if the model lost (in ``talk_v1``, an invalid move is a loss)."""
    return 1.0 if state["outcome"] == "loss" else 0.0


def unfinished(state: dict[str, Any]) -> float:
    """1 if the turn cap ended the game before a result."""
    return 1.0 if state["outcome"] == "unfinished" else 0.0


def invalid_moves(state: dict[str, Any]) -> float:
    """How many replies were invalid moves."""
    return float(state["invalid_moves"])


def had_invalid_move(state: dict[str, Any]) -> float:
    """1 if the game had an invalid move (its mean: the share of such games)."""
    return 1.0 if state["invalid_moves"] else 0.0


def turns(completion: pa.Messages) -> float:
    """How many replies the model gave."""
    return float(sum(isinstance(m, dict) and m.get("role") == "assistant" for m in completion))


def make_rubric(variant: Variant, parser: pa.XMLParser) -> pa.Rubric:
    """The rubric of ``variant``: its weighted rewards, then the metrics."""
    rubric = pa.Rubric(parser=parser)
    rubric.add(win_reward, 1.0)
    rubric.add(format_reward, 0.2)
    if variant == "standard":
        rubric.add(invalid_move_penalty, 1.0)
    for metric in (won, drew, lost, unfinished, invalid_moves, had_invalid_move, turns):
        rubric.add(metric, 0.0)
    return rubric
