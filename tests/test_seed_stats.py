"""pipeline.evaluation.seed_stats: the interval, permutation test, Holm, A/A check and power,
each checked against an independent computation (closed forms, tables, brute force, a
hand-worked example, simulation)."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest

from pipeline.evaluation import seed_stats


@pytest.mark.parametrize(
    ("df", "expected"),
    [
        (1, math.tan(math.pi * 0.475)),  # Cauchy: the closed form
        (2, (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025)),  # df = 2: the closed form
        (4, 2.776445105),  # tables of Student's t
        (9, 2.262157163),
        (30, 2.042272456),
    ],
)
def test_t_quantile_matches_closed_forms_and_tables(df, expected):
    assert seed_stats.t_quantile(0.975, df) == pytest.approx(expected, rel=1e-8)
    assert seed_stats.t_quantile(0.025, df) == pytest.approx(-expected, rel=1e-8)
    assert seed_stats.t_cdf(expected, df) == pytest.approx(0.975, abs=1e-10)


def test_t_interval_is_mean_plus_minus_t_times_the_standard_error():
    values = [38.40, 37.10, 36.9, 38.0, 37.3]
    mean, low, high = seed_stats.t_interval(values)
    half = 2.776445105 * statistics.stdev(values) / math.sqrt(5)
    assert mean == pytest.approx(statistics.fmean(values))
    assert (low, high) == pytest.approx((mean - half, mean + half))
    assert seed_stats.t_interval([37.0]) == (37.0, None, None)


def brute_force_p(a: list[float], b: list[float]) -> float:
    """Every ordering of the pooled runs (n! of them), the first len(a) taken as group a."""
    pooled = [*a, *b]
    observed = abs(statistics.fmean(a) - statistics.fmean(b))
    hits = total = 0
    for order in itertools.permutations(pooled):
        d = abs(statistics.fmean(order[: len(a)]) - statistics.fmean(order[len(a) :]))
        hits += d >= observed - 1e-9
        total += 1
    return hits / total


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([38.40, 37.10], [36.2, 37.4]),
        ([38.4, 37.1, 37.9], [36.2, 37.4, 36.8]),
        ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0]),  # the most extreme split, unequal sizes
        ([1.0, 1.0, 2.0], [1.0, 2.0, 2.0]),  # ties
        ([30.0, 31.5, 29.0, 33.0], [28.0, 27.5, 30.5]),
    ],
)
def test_permutation_p_value_equals_a_brute_force_enumeration(a, b):
    assert seed_stats.permutation_test(a, b) == pytest.approx(brute_force_p(a, b))


def test_smallest_p_is_attained_by_the_most_extreme_split():
    assert seed_stats.permutation_test([5, 6, 7, 8, 9], [0, 1, 2, 3, 4]) == pytest.approx(
        seed_stats.smallest_p(5, 5)
    )
    assert seed_stats.smallest_p(5, 5) == pytest.approx(2 / 252)
    assert seed_stats.permutation_test([5, 6, 7], [0, 1]) == pytest.approx(
        seed_stats.smallest_p(3, 2)
    )
    # two runs against two can never reach 0.05
    assert seed_stats.smallest_p(2, 2) == pytest.approx(1 / 3)


def test_holm_matches_a_hand_worked_example():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> 0.06
    assert seed_stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert seed_stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert seed_stats.holm([]) == []


def test_aa_check_on_two_seeds_is_one_split_that_never_rejects():
    assert seed_stats.aa_splits([38.40, 37.10]) == [1.0]
    assert seed_stats.false_positive_rate([1.0]) == 0.0
    assert seed_stats.false_positive_rate([]) is None


def test_aa_splits_enumerate_each_unordered_split_once():
    assert len(seed_stats.aa_splits([1.0, 2.0, 3.0, 4.0, 5.0])) == math.comb(5, 2)
    assert len(seed_stats.aa_splits([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])) == math.comb(6, 3) // 2


def test_aa_false_positive_rate_is_at_most_alpha_on_same_distribution_seeds():
    """Ten runs of one config (seed-level scores drawn from one distribution), split 5 against
    5 in every way, over many simulated configs: the test calls them different at most alpha of
    the time (it is exact, so the rate is alpha up to simulation noise and the discreteness)."""
    rng = np.random.default_rng(7)
    p_values = [p for _ in range(40) for p in seed_stats.aa_splits(rng.normal(37.7, 0.9, 10))]
    assert len(p_values) == 40 * math.comb(10, 5) // 2
    rate = seed_stats.false_positive_rate(p_values)
    assert rate <= seed_stats.ALPHA + 3 * math.sqrt(seed_stats.ALPHA / len(p_values))
    # one independent split per simulated config, a sharper check of the same
    independent = [seed_stats.permutation_test(*np.split(rng.normal(0, 1, 10), 2))
                   for _ in range(3000)]  # fmt: skip
    rate = seed_stats.false_positive_rate(independent)
    assert rate <= seed_stats.ALPHA + 3 * math.sqrt(seed_stats.ALPHA * 0.95 / 3000)


def test_detectable_difference_has_the_power_it_claims():
    sd = 0.9
    delta = seed_stats.detectable_difference(sd, 5)
    # checked on fresh simulated studies, in SD units
    fresh = seed_stats.permutation_power(delta / sd, 5, seed=123, simulations=4000)
    assert fresh == pytest.approx(seed_stats.POWER, abs=0.03)
    below = seed_stats.permutation_power(delta / sd - 0.3, 5, seed=123, simulations=4000)
    assert below < seed_stats.POWER
    # more seeds detect less; too few seeds (or too strict an alpha) detect nothing
    assert seed_stats.detectable_difference(sd, 8) < delta
    assert seed_stats.detectable_difference(sd, 3) == math.inf
    assert seed_stats.detectable_difference(sd, 5, alpha=0.005) == math.inf
