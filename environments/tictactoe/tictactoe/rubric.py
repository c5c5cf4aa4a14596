"""Rewards and metrics. Each reads the game's result from ``state``, which the env keeps.

Rewards: ``win_reward`` 1.0 (1 win, 0.5 draw, 0 loss, and an unfinished game's value),
``format_reward`` 0.2 (share of replies in the format), ``invalid_move_penalty`` 1.0. Two named
sets of rules (``REWARD_RULES``) fix the penalty and the unfinished game's value:

- ``talk`` (the spec's default): −0.1 once if the game had any invalid move, however many; an
  unfinished game scores 0, like a loss.
- ``strict``: −0.1 for **every** invalid reply, and an unfinished game scores −0.5, below a loss.

Under ``talk`` an invalid reply leaves the board and the opponent where they were, so once a game
has one invalid move, stalling to the turn cap costs nothing more than losing: both score 0.1
(0.2 × format) against an optimal opponent. ``strict`` makes stalling for eight replies
−0.5 − 0.8 + 0.2 × format ≈ −1.1, against 0.2 for a legal loss, so RL cannot buy a lower loss
rate with invalid moves. The talk's first version scores win + 0.2 × format only.

Metrics (weight 0, so an eval summary shows them as rates and means): ``won``, ``drew``,
``lost``, ``unfinished``, ``invalid_moves``, ``had_invalid_move``, ``turns``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import palaestra as pa
from tictactoe.protocol import Variant

WIN_VALUES = {"win": 1.0, "draw": 0.5, "loss": 0.0, "unfinished": 0.0}
RewardsName = Literal["talk", "strict"]


@dataclass(frozen=True)
class RewardRules:
    """How invalid moves and unfinished games are scored."""

    invalid_move_penalty: float = 0.1  # the size of the penalty (subtracted)
    per_move: bool = False  # False: once per game that had an invalid move; True: per invalid reply
    unfinished_reward: float = 0.0  # win_reward of a game cut off by the turn cap
    format_weight: float = 0.2  # the weight of format_reward (the share of replies in the format)


REWARD_RULES: dict[str, RewardRules] = {
    "talk": RewardRules(),
    "strict": RewardRules(per_move=True, unfinished_reward=-0.5),
}


def outcome_reward(unfinished_value: float = 0.0) -> Callable[[dict[str, Any]], float]:
    """``win_reward``: 1 for a win, 0.5 for a draw, 0 for a loss, ``unfinished_value`` for a game cut off."""
    values = {**WIN_VALUES, "unfinished": unfinished_value}

    def win_reward(state: dict[str, Any]) -> float:
        return values[state["outcome"]]

    win_reward.__doc__ = f"1 win, 0.5 draw, 0 loss, {unfinished_value:g} for a game cut off by the turn cap."
    return win_reward


def invalid_penalty(size: float = 0.1, *, per_move: bool = False) -> Callable[[dict[str, Any]], float]:
    """``invalid_move_penalty``: −``size`` per invalid reply (``per_move``) or once per game that had one."""

    def invalid_move_penalty(state: dict[str, Any]) -> float:
        if per_move:
            return -size * state["invalid_moves"]
        return -size if state["invalid_moves"] else 0.0

    invalid_move_penalty.__doc__ = (
        f"−{size:g} per invalid reply." if per_move else f"−{size:g} if any reply was an invalid move (flat)."
    )
    return invalid_move_penalty


win_reward = outcome_reward()
invalid_move_penalty = invalid_penalty()


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


def make_rubric(
    variant: Variant, parser: pa.XMLParser, rules: RewardRules = REWARD_RULES["talk"]
) -> pa.Rubric:
    """The rubric of ``variant`` under ``rules``: its weighted rewards, then the metrics."""
    rubric = pa.Rubric(parser=parser)
    rubric.add(outcome_reward(rules.unfinished_reward), 1.0)
    rubric.add(format_reward, rules.format_weight)
    if variant == "standard":
        rubric.add(invalid_penalty(rules.invalid_move_penalty, per_move=rules.per_move), 1.0)
    for metric in (won, drew, lost, unfinished, invalid_moves, had_invalid_move, turns):
        rubric.add(metric, 0.0)
    return rubric
