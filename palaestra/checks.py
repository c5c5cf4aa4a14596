"""Argument checks for ``load_environment`` functions: one clear ``ValueError`` naming the argument.

``palaestra eval -a '{...}'`` passes JSON values straight to an environment, so its arguments
need checking (a bool is not an int, a NaN is not a probability); these keep the messages alike.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any


def check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """``value`` if it is an integer (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = f" ≥ {minimum}" if minimum is not None else ""
        raise ValueError(f"{name} must be an integer{bound}, got {value!r}")
    return value


def check_number(name: str, value: Any, *, low: float | None = None, high: float | None = None) -> float:
    """``value`` as a float if it is a finite number (not a bool) in [``low``, ``high``]."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        where = f" in [{low:g}, {high:g}]" if low is not None and high is not None else ""
        where = where or (f" ≥ {low:g}" if low is not None else f" ≤ {high:g}" if high is not None else "")
        raise ValueError(f"{name} must be a number{where}, got {value!r}")
    return float(value)


def check_text(name: str, value: Any) -> str:
    """``value`` if it is a string that is not blank."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, got {value!r}")
    return value


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """``value`` if it is one of ``choices``."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value
