"""Stratified sampling: spread a numeric dataset column evenly over bands of its range.

The range ``[low, high]`` is cut into ``num_groups`` equal bands. Example ``i`` falls in band
``order[i % num_groups]``, where ``order`` is one seeded permutation of the bands, and draws its
value uniformly inside that band. The band sequence repeats with period ``num_groups``, so
**any** run of ``num_groups`` consecutive examples covers every band once, and any run of
``k × num_groups`` covers each band ``k`` times: a trainer that batches consecutive examples
gets an even spread of difficulty in every batch, whatever the batch size (a multiple of
``num_groups`` for an exact balance). Shuffling the rows afterwards breaks this.

Everything derives from ``seed`` and the example's index: the first ``n`` values do not depend
on how many are asked for, and no global randomness is touched.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from typing import Any

from palaestra.types import derive_seed


def band_edges(low: float, high: float, num_groups: int) -> list[tuple[float, float]]:
    """The ``num_groups`` equal bands of ``[low, high]``, lowest first, as (start, end) pairs."""
    _check_range(low, high, num_groups)
    width = (high - low) / num_groups
    edges = [low + b * width for b in range(num_groups)] + [high]
    return [(edges[b], edges[b + 1]) for b in range(num_groups)]


def stratified_bands(n: int, *, num_groups: int, seed: int) -> list[int]:
    """The band index of each of ``n`` examples: a seeded order of the bands, repeated."""
    _check_count(n, num_groups, seed)
    order = list(range(num_groups))
    random.Random(derive_seed("stratified-bands", seed, num_groups)).shuffle(order)
    return [order[i % num_groups] for i in range(n)]


def stratified_values(n: int, low: float, high: float, *, num_groups: int, seed: int) -> list[float]:
    """``n`` values in ``[low, high]``: example ``i`` gets a uniform draw inside its band.

    With ``low == high`` every value is ``low``. Values stay inside their band's edges (see
    ``band_edges``), so ``band_edges(...)[stratified_bands(...)[i]]`` bounds value ``i``.
    """
    edges = band_edges(low, high, num_groups)
    values = []
    for i, band in enumerate(stratified_bands(n, num_groups=num_groups, seed=seed)):
        start, end = edges[band]
        u = random.Random(derive_seed("stratified-value", seed, i)).random()
        values.append(min(max(start + u * (end - start), start), end))
    return values


def with_stratified_column(
    rows: Iterable[Mapping[str, Any]],
    column: str,
    low: float,
    high: float,
    *,
    num_groups: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Copies of ``rows`` with ``column`` set by ``stratified_values``, in the same order.

    ``ValueError`` if a row already has ``column``: overwriting data silently is never wanted.
    """
    if not isinstance(column, str) or not column:
        raise ValueError(f"column must be a non-empty string, got {column!r}")
    out = [dict(row) for row in rows]
    for i, row in enumerate(out):
        if column in row:
            raise ValueError(f"row {i} already has a {column!r} column")
    values = stratified_values(len(out), low, high, num_groups=num_groups, seed=seed)
    for row, value in zip(out, values, strict=True):
        row[column] = value
    return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_count(n: int, num_groups: int, seed: int) -> None:
    if not _is_int(n) or n < 0:
        raise ValueError(f"n must be an integer ≥ 0, got {n!r}")
    if not _is_int(num_groups) or num_groups < 1:
        raise ValueError(f"num_groups must be an integer ≥ 1, got {num_groups!r}")
    if not _is_int(seed):
        raise ValueError(f"seed must be an integer, got {seed!r}")


def _check_range(low: float, high: float, num_groups: int) -> None:
    for name, value in (("low", low), ("high", high)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
    if low > high:
        raise ValueError(f"low ({low}) must not exceed high ({high})")
    if not _is_int(num_groups) or num_groups < 1:
        raise ValueError(f"num_groups must be an integer ≥ 1, got {num_groups!r}")
