"""Confidence intervals for rates (a win rate, a draw rate) and for the change between two of them.

A rate measured on n games is a binomial proportion; its 95% interval is Wilson's score interval
(Wilson 1927), which stays inside [0, 1] and keeps its coverage at rates near 0 or 1, where the
normal ("Wald") interval fails. The difference between two independent rates (after RL − before,
each on its own games) gets Newcombe's hybrid score interval (Newcombe 1998, method 10), built
from the two Wilson intervals: the change is significant at 95% when that interval excludes 0.

A graded reward (a similarity in [0, 1], say) is a mean: ``Mean`` gives its Student t interval,
and ``paired_change`` the interval of the change between two models scored on the *same*
examples, from the per-example differences (a paired t interval: the examples' own difficulty
cancels, so it is much narrower than comparing the two means' intervals).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from palaestra.eval.summary import t_quantile_975

Z95 = 1.959963984540054  # the normal quantile for a two-sided 95% interval


@dataclass(frozen=True)
class Rate:
    """``k`` successes in ``n`` trials, with its 95% Wilson interval."""

    k: int
    n: int

    def __post_init__(self) -> None:
        if self.n < 1 or not 0 <= self.k <= self.n:
            raise ValueError(f"need n >= 1 and 0 <= k <= n, got k={self.k}, n={self.n}")

    @property
    def value(self) -> float:
        return self.k / self.n

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.k, self.n)

    def __str__(self) -> str:
        low, high = self.interval
        return f"{100 * self.value:.0f}% [{100 * low:.0f}, {100 * high:.0f}]"


def wilson_interval(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of the proportion ``k / n``."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"need n >= 1 and 0 <= k <= n, got k={k}, n={n}")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def difference_interval(after: Rate, before: Rate, z: float = Z95) -> tuple[float, float]:
    """Newcombe's interval for ``after.value − before.value`` (independent samples)."""
    p1, p2 = after.value, before.value
    l1, u1 = wilson_interval(after.k, after.n, z)
    l2, u2 = wilson_interval(before.k, before.n, z)
    d = p1 - p2
    low = d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)
    high = d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)
    return max(-1.0, low), min(1.0, high)


def change(after: Rate, before: Rate) -> str:
    """``after − before`` in points with its 95% interval, and whether it excludes 0."""
    low, high = difference_interval(after, before)
    verdict = "significant" if low > 0 or high < 0 else "not significant"
    return f"{100 * (after.value - before.value):+.0f} pts [{100 * low:+.0f}, {100 * high:+.0f}], {verdict}"


@dataclass(frozen=True)
class Mean:
    """The mean of ``values`` (one per example), with its 95% Student t interval."""

    values: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.values) < 2 or not all(math.isfinite(v) for v in self.values):
            raise ValueError(f"need at least 2 finite values, got {len(self.values)}")

    @property
    def value(self) -> float:
        return math.fsum(self.values) / len(self.values)

    @property
    def interval(self) -> tuple[float, float]:
        return t_interval(self.values)

    def __str__(self) -> str:
        low, high = self.interval
        return f"{self.value:.3f} [{low:.3f}, {high:.3f}]"


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """The 95% Student t interval of the mean of ``values`` (at least 2)."""
    n = len(values)
    if n < 2:
        raise ValueError(f"need at least 2 values, got {n}")
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return mean - half, mean + half


def paired_change(after: Sequence[float], before: Sequence[float]) -> str:
    """``mean(after) − mean(before)`` over the same examples (in the same order), with the paired
    95% t interval of the per-example differences, and whether it excludes 0."""
    if len(after) != len(before):
        raise ValueError(f"paired values need the same examples: {len(after)} against {len(before)}")
    differences = [a - b for a, b in zip(after, before, strict=True)]
    low, high = t_interval(differences)
    verdict = "significant" if low > 0 or high < 0 else "not significant"
    mean = math.fsum(differences) / len(differences)
    return f"{mean:+.3f} [{low:+.3f}, {high:+.3f}], {verdict}"
