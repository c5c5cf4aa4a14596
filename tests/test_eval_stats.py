"""Intervals for rates and their changes, against published values."""

from __future__ import annotations

import pytest

from palaestra.eval.stats import Rate, change, difference_interval, wilson_interval


def test_wilson_interval_matches_published_values() -> None:
    # Newcombe (1998), table I: 81/263 -> [0.2553, 0.3662]; 15/148 -> [0.0624, 0.1605]
    assert wilson_interval(81, 263) == pytest.approx((0.2553, 0.3662), abs=5e-5)
    assert wilson_interval(15, 148) == pytest.approx((0.0624, 0.1605), abs=5e-5)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=5e-5)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=5e-5)


def test_newcombe_difference_interval_matches_the_paper() -> None:
    # Newcombe (1998), method 10, example (a): 56/70 vs 48/80 -> [0.0524, 0.3339]
    assert difference_interval(Rate(56, 70), Rate(48, 80)) == pytest.approx((0.0524, 0.3339), abs=5e-5)
    # example (e): 5/56 vs 0/29 -> [-0.0381, 0.1926]
    assert difference_interval(Rate(5, 56), Rate(0, 29)) == pytest.approx((-0.0381, 0.1926), abs=5e-5)


def test_change_says_whether_the_interval_excludes_zero() -> None:
    assert change(Rate(130, 200), Rate(66, 200)).endswith("significant") and "+32 pts" in change(
        Rate(130, 200), Rate(66, 200)
    )
    assert change(Rate(70, 200), Rate(66, 200)).endswith("not significant")
    assert str(Rate(72, 100)) == "72% [63, 80]"


@pytest.mark.parametrize("k, n", [(-1, 10), (11, 10), (0, 0)])
def test_bad_counts_are_refused(k: int, n: int) -> None:
    with pytest.raises(ValueError, match="need n >= 1"):
        Rate(k, n)


def test_mean_has_the_student_t_interval() -> None:
    from palaestra.eval.stats import Mean

    m = Mean((0.0, 1.0, 0.5, 0.5))  # mean 0.5, sample std 0.408, t(3) = 3.182
    low, high = m.interval
    assert m.value == 0.5
    assert high - 0.5 == pytest.approx(3.182446 * 0.408248 / 2, rel=1e-4)
    assert low == pytest.approx(1.0 - high)
    assert str(m) == "0.500 [-0.150, 1.150]"
    with pytest.raises(ValueError, match="at least 2"):
        Mean((0.5,))


def test_paired_change_uses_the_per_example_differences() -> None:
    from palaestra.eval.stats import paired_change

    before = [0.1, 0.5, 0.9, 0.3, 0.7]
    # each example up by 0.1 give or take 0.01: the means' own intervals overlap, the pairs do not
    after = [b + d for b, d in zip(before, (0.1, 0.11, 0.09, 0.1, 0.1), strict=True)]
    assert paired_change(after, before).startswith("+0.100 [+0.0")
    assert paired_change(after, before).endswith("significant") and "not" not in paired_change(after, before)
    assert paired_change(before, before[::-1]).endswith("not significant")
    with pytest.raises(ValueError, match="same examples"):
        paired_change(after, before[:3])
