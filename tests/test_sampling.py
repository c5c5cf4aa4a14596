"""palaestra.data.sampling: stratified values spread every window of examples over all bands."""

from __future__ import annotations

import itertools

import pytest

from palaestra.data import band_edges, stratified_bands, stratified_values, with_stratified_column


@pytest.mark.parametrize("num_groups", [1, 2, 3, 5, 7])
def test_every_window_of_num_groups_consecutive_examples_covers_every_band(num_groups: int) -> None:
    n, low, high = 103, 0.2, 0.7
    values = stratified_values(n, low, high, num_groups=num_groups, seed=11)
    bands = stratified_bands(n, num_groups=num_groups, seed=11)
    edges = band_edges(low, high, num_groups)
    for value, band in zip(values, bands, strict=True):
        start, end = edges[band]
        assert start <= value <= end
    for i in range(n - num_groups + 1):
        assert sorted(bands[i : i + num_groups]) == list(range(num_groups)), f"window at {i}"
    # a run of k × num_groups examples holds every band exactly k times
    window = bands[5 : 5 + 4 * num_groups]
    assert all(window.count(b) == 4 for b in range(num_groups))


def test_bands_are_equal_slices_of_the_range() -> None:
    assert band_edges(0.0, 1.0, 4) == [(0.0, 0.25), (0.25, 0.5), (0.5, 0.75), (0.75, 1.0)]
    assert band_edges(0.2, 0.7, 1) == [(0.2, 0.7)]
    edges = band_edges(0.2, 0.7, 5)
    assert edges[0][0] == 0.2 and edges[-1][1] == 0.7
    assert all(a[1] == b[0] for a, b in itertools.pairwise(edges))


def test_values_spread_inside_each_band_not_only_at_its_centre() -> None:
    values = stratified_values(400, 0.0, 1.0, num_groups=2, seed=0)
    low_band = [v for v in values if v < 0.5]
    assert len(low_band) == 200
    assert min(low_band) < 0.05 and max(low_band) > 0.45


def test_deterministic_from_the_seed_and_prefix_stable() -> None:
    first = stratified_values(50, 0.0, 1.0, num_groups=5, seed=3)
    assert first == stratified_values(50, 0.0, 1.0, num_groups=5, seed=3)
    assert first[:20] == stratified_values(20, 0.0, 1.0, num_groups=5, seed=3)
    assert first != stratified_values(50, 0.0, 1.0, num_groups=5, seed=4)
    # the band order itself is drawn from the seed
    orders = {tuple(stratified_bands(6, num_groups=6, seed=s)) for s in range(10)}
    assert len(orders) > 1


def test_an_empty_range_gives_its_single_value() -> None:
    assert stratified_values(6, 1.0, 1.0, num_groups=3, seed=0) == [1.0] * 6
    assert stratified_values(0, 0.0, 1.0, num_groups=3, seed=0) == []


def test_with_stratified_column_adds_the_column_to_copies() -> None:
    rows = [{"question": f"q{i}"} for i in range(9)]
    out = with_stratified_column(rows, "difficulty", 0.0, 3.0, num_groups=3, seed=1)
    assert [r["question"] for r in out] == [r["question"] for r in rows]
    assert "difficulty" not in rows[0]  # the input rows are not modified
    assert [r["difficulty"] for r in out] == stratified_values(9, 0.0, 3.0, num_groups=3, seed=1)
    with pytest.raises(ValueError, match="row 0 already has a 'difficulty' column"):
        with_stratified_column(out, "difficulty", 0.0, 1.0, num_groups=3, seed=1)


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        ((5, 0.7, 0.2), {"num_groups": 2, "seed": 0}, r"low \(0.7\) must not exceed high \(0.2\)"),
        ((5, 0.0, float("nan")), {"num_groups": 2, "seed": 0}, "high must be a finite number"),
        ((5, "0", 1.0), {"num_groups": 2, "seed": 0}, "low must be a finite number"),
        ((5, 0.0, 1.0), {"num_groups": 0, "seed": 0}, "num_groups must be an integer ≥ 1"),
        ((5, 0.0, 1.0), {"num_groups": 2.0, "seed": 0}, "num_groups must be an integer ≥ 1"),
        ((-1, 0.0, 1.0), {"num_groups": 2, "seed": 0}, "n must be an integer ≥ 0"),
        ((5, 0.0, 1.0), {"num_groups": 2, "seed": "x"}, "seed must be an integer"),
    ],
)
def test_bad_arguments_raise_clear_errors(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stratified_values(*args, **kwargs)
