"""Group-relative advantages: how much better each rollout did than the others of its example.

A group is the rollouts of one example in a batch (same start, same opponent seed), so their
rewards differ only through the policy's own choices. Pure Python on ``Rollout`` records: no
torch, testable alone.

- ``center="group"`` (default): A_i = r_i − mean(r_group) — GRPO's baseline (Shao et al. 2024,
  DeepSeekMath, arXiv:2402.03300), without its division by the group's std, as Dr. GRPO argues
  (Liu et al. 2025, arXiv:2503.20783: the std favours groups that are nearly all right or wrong).
- ``scale="group_std"``: A_i / (std(r_group) + eps), GRPO as published.
- ``scale="batch_std"``: A_i / (std of all advantages in the batch + eps), a batch-level
  normalisation that keeps the relative size of groups (as in REINFORCE++).

A group whose rewards are all equal carries no signal: its advantages are 0 and it is counted.
A rollout without a reward (it failed) never reaches training: it is left out, and its group is
judged on the others.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from palaestra.types import Rollout

Scale = Literal["none", "group_std", "batch_std"]


@dataclass(frozen=True)
class Advantages:
    """The trainable rollouts, their advantages (same order), and counts for the log."""

    rollouts: list[Rollout]
    values: list[float]
    groups: int
    zero_groups: int  # groups whose rewards were all equal: no learning signal
    dropped: int  # rollouts without a reward (failed), never trained on
    flat: frozenset[int] = frozenset()  # example ids of those groups: nothing to train on


def group_advantages(rollouts: Sequence[Rollout], *, scale: Scale = "none", eps: float = 1e-6) -> Advantages:
    """Advantages of ``rollouts`` relative to the other rollouts of their example."""
    if scale not in ("none", "group_std", "batch_std"):
        raise ValueError(f"scale must be none, group_std or batch_std, not {scale!r}")
    groups: dict[int, list[Rollout]] = defaultdict(list)
    dropped = 0
    for rollout in rollouts:
        if rollout.reward is None or rollout.error is not None:
            dropped += 1
        else:
            groups[rollout.example_id].append(rollout)
    kept: list[Rollout] = []
    values: list[float] = []
    flat: set[int] = set()
    for example_id, group in groups.items():
        rewards = [r.reward for r in group if r.reward is not None]
        mean = math.fsum(rewards) / len(rewards)
        centred = [x - mean for x in rewards]
        if all(abs(c) <= eps for c in centred):
            flat.add(example_id)
            centred = [0.0] * len(group)
        elif scale == "group_std":
            std = _std(rewards)
            centred = [c / (std + eps) for c in centred]
        kept.extend(group)
        values.extend(centred)
    if scale == "batch_std" and len(values) > 1:
        std = _std(values)
        values = [v / (std + eps) for v in values]
    return Advantages(
        kept, values, groups=len(groups), zero_groups=len(flat), dropped=dropped, flat=frozenset(flat)
    )


def _std(values: Sequence[float]) -> float:
    """Population standard deviation (the group is all there is, not a sample of it)."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))
