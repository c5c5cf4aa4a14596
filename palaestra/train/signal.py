"""What an RL batch offers to learn from, beyond its mean reward: pure functions over rollouts.

Each is logged every step (``rl_records.step_record``) and read by ``palaestra train diagnose``
(``diagnose.py``), which names the likely cause when RL does not learn:

- ``flat_groups``: the share of groups whose rollouts all got one reward, so their advantages are
  0 and the step learns nothing from them; ``flat_reward``, the mean reward of those groups (0:
  every attempt failed, the task is too hard for the policy; the top: too easy).
- ``unparsed``: the share of final replies (those without tool calls) in which the environment's
  parser finds no answer.
- ``advantage_balance``: Σ A·n / Σ |A|·n over the trained rollouts, n each one's sampled tokens.
  With a token-level mean (cispo, dapo, masked_is), a group's advantages sum to 0 but its tokens
  do not: when the worse rollouts are the longer ones (more turns, retries, rambling), most of the
  update pushes sampled tokens *down*, the tokens every rollout shares (the format, the tool-call
  markup) included, and the policy unlearns what all its rollouts do. Near 0 is balanced; −1
  is an update that only pushes down.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from palaestra.parsers import Parser
from palaestra.types import Rollout


def flat_groups(rollouts: Sequence[Rollout], eps: float = 1e-6) -> tuple[float | None, float | None]:
    """(share of groups with one reward, mean reward of those groups); None where there are none."""
    groups: dict[int, list[float]] = defaultdict(list)
    for rollout in rollouts:
        if rollout.reward is not None and rollout.error is None:
            groups[rollout.example_id].append(rollout.reward)
    if not groups:
        return None, None
    flat = [rewards[0] for rewards in groups.values() if max(rewards) - min(rewards) <= eps]
    return len(flat) / len(groups), (math.fsum(flat) / len(flat) if flat else None)


def unparsed(rollouts: Sequence[Rollout], parser: Parser | None) -> float | None:
    """The share of final replies (no tool calls) in which ``parser`` finds no answer."""
    if parser is None:
        return None
    replies = [
        message
        for rollout in rollouts
        for message in rollout.completion
        if isinstance(message, dict) and message.get("role") == "assistant" and not message.get("tool_calls")
    ]
    if not replies:
        return None
    return sum(parser.parse_answer([message]) is None for message in replies) / len(replies)


def advantage_balance(rollouts: Sequence[Rollout], advantages: Sequence[float]) -> float | None:
    """Σ A·n / Σ |A|·n, n the sampled tokens of each rollout (see the module docstring)."""
    signed = absolute = 0.0
    for rollout, advantage in zip(rollouts, advantages, strict=True):
        tokens = sum(len(turn.token_ids or ()) for turn in rollout.turns)
        signed += advantage * tokens
        absolute += abs(advantage) * tokens
    return signed / absolute if absolute > 0 else None
