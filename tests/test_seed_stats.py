"""pipeline.evaluation.seed_stats: the interval, Welch's test, the permutation test, Holm, the
A/A check and power, each checked against an independent computation (t tables, scipy's own
tests, brute-force enumeration, a hand-worked example, the noncentral t and simulation)."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from scipy import optimize, stats

from pipeline import report
from pipeline.evaluation import seed_stats
from pipeline.sweep.spec import RESULTS_ROOT
from tests.conftest import REPO_ROOT

ALPHA = seed_stats.ALPHA


def test_t_interval_is_mean_plus_minus_the_tabled_t_times_the_standard_error():
    values = [38.40, 37.10, 36.9, 38.0, 37.3]
    mean, low, high = seed_stats.t_interval(values)
    half = 2.776445105 * statistics.stdev(values) / math.sqrt(5)  # t(0.975, 4 df), from tables
    assert mean == pytest.approx(statistics.fmean(values))
    assert (low, high) == pytest.approx((mean - half, mean + half))
    # scipy's one-sample t-test reaches the same interval by its own path
    assert (low, high) == pytest.approx(tuple(stats.ttest_1samp(values, 0).confidence_interval()))
    assert seed_stats.t_interval([37.0]) == (37.0, None, None)


# scipy warns of a group without spread; the comparison is exactly what is tested
SCIPY_NO_SPREAD = pytest.mark.filterwarnings("ignore:Precision loss:RuntimeWarning")


WELCH_CASES = [
    ([38.40, 37.10], [36.2, 37.4]),
    ([38.4, 37.1, 37.9, 38.2, 37.6], [36.2, 37.4, 36.8, 37.0, 36.1]),
    ([1.0, 2.0, 3.0, 4.0], [5.0, 9.0, 7.0]),  # unequal sizes
    ([30.0, 31.5, 29.0, 33.0, 35.5, 28.0], [28.0, 28.1, 28.3]),  # unequal spreads
    ([37.0, 37.0, 37.0], [36.0, 36.5, 37.5]),  # no spread on one side only: still a test
]


@SCIPY_NO_SPREAD
@pytest.mark.parametrize(("a", "b"), WELCH_CASES)
def test_welch_test_equals_scipys_unequal_variance_t_test(a, b):
    result = seed_stats.welch_test(a, b)
    reference = stats.ttest_ind(a, b, equal_var=False)
    assert result.t == pytest.approx(reference.statistic, rel=1e-10)
    assert result.df == pytest.approx(reference.df, rel=1e-10)
    assert result.p == pytest.approx(reference.pvalue, rel=1e-9)
    assert result.difference == pytest.approx(statistics.fmean(a) - statistics.fmean(b))
    assert result.reason is None


def test_welch_test_by_hand_reaches_the_tabled_critical_value():
    """Equal sizes and spreads: Welch's t is Student's, with 2n - 2 df. Two groups of five with
    variance 2.5 each have standard error 1, so a shift of t(0.975, 8 df) = 2.306004135 (from
    tables) gives t = 2.306004135, df = 8 and p = 0.05."""
    shift = 2.306004135
    base = [0.0, 1.0, 2.0, 3.0, 4.0]
    result = seed_stats.welch_test([x + shift for x in base], base)
    assert (result.t, result.df) == pytest.approx((shift, 8.0))
    assert result.p == pytest.approx(0.05, abs=1e-9)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ([37.0], [36.0, 36.5]),  # one seed of the variant
        ([37.0, 38.0], [36.0]),  # one seed of the base
        ([37.0], [36.0]),
    ],
)
def test_a_single_seed_on_a_side_gives_no_p_and_says_why(a, b):
    result = seed_stats.welch_test(a, b)
    assert result.p is None and result.t is None and result.reason == seed_stats.SINGLE_RUN
    assert result.difference == pytest.approx(statistics.fmean(a) - statistics.fmean(b))


@SCIPY_NO_SPREAD
def test_no_spread_on_either_side_gives_no_p_where_scipy_calls_it_significant():
    # two constants 1 BLEU apart: scipy's t is infinite and its p 0, a false "difference"
    different = ([37.1] * 5, [36.1] * 5)
    assert stats.ttest_ind(*different, equal_var=False).pvalue == 0.0
    for a, b in (different, ([37.1] * 3, [37.1] * 4)):
        result = seed_stats.welch_test(a, b)
        assert result.p is None and result.reason == seed_stats.NO_SPREAD
    # a spread of rounding noise alone (sums of 0.1 in another order) is no spread either
    assert seed_stats.welch_test([0.1 + 0.2, 0.3, 0.2 + 0.1], [0.6 - 0.3, 0.3]).p is None
    with pytest.raises(ValueError, match="at least one run"):
        seed_stats.welch_test([], [1.0])


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


PERMUTATION_CASES = [
    ([38.40, 37.10], [36.2, 37.4]),
    ([38.4, 37.1, 37.9], [36.2, 37.4, 36.8]),
    ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0]),  # the most extreme split, unequal sizes
    ([1.0, 1.0, 2.0], [1.0, 2.0, 2.0]),  # ties
    ([30.0, 31.5, 29.0, 33.0], [28.0, 27.5, 30.5]),
]


@pytest.mark.parametrize(("a", "b"), PERMUTATION_CASES)
def test_permutation_p_value_equals_a_brute_force_enumeration(a, b):
    assert seed_stats.permutation_test(a, b) == pytest.approx(brute_force_p(a, b))


def absolute_difference_of_means(x, y, axis):
    return np.abs(np.mean(x, axis=axis) - np.mean(y, axis=axis))


def scipy_exact_p(a, b, statistic, alternative):
    return stats.permutation_test(
        (a, b), statistic, permutation_type="independent", vectorized=True, n_resamples=np.inf,
        alternative=alternative,
    ).pvalue  # fmt: skip


FIVE_A_SIDE = ([38.4, 37.1, 37.9, 38.2, 37.6], [36.2, 37.4, 36.8, 37.0, 36.1])


@pytest.mark.parametrize(("a", "b"), [*PERMUTATION_CASES, FIVE_A_SIDE])
def test_permutation_p_value_equals_scipys_exact_permutation_test(a, b):
    """Two-sided as the share of relabellings with |difference| at least the observed one:
    scipy's exact test of |difference| against larger values."""
    reference = scipy_exact_p(a, b, absolute_difference_of_means, "greater")
    assert seed_stats.permutation_test(a, b) == pytest.approx(reference)


def test_with_equal_groups_the_p_is_also_scipys_doubled_smaller_tail():
    """scipy's own 'two-sided' doubles the smaller tail of the signed difference; with equal
    group sizes the null distribution is symmetric and the two definitions agree."""
    a, b = FIVE_A_SIDE
    signed = scipy_exact_p(a, b, lambda x, y, axis: np.mean(x, axis) - np.mean(y, axis),
                           "two-sided")  # fmt: skip
    assert seed_stats.permutation_test(a, b) == pytest.approx(signed)


def test_the_permutation_tests_smallest_p_is_above_holms_first_step_at_five_seeds():
    """Why it is not the verdict: 5 against 5 can never go below 2/252 = 0.0079, above
    0.05 / 10 (Holm's first step over Table 3's ten comparisons); Welch's p can."""
    extreme = ([5, 6, 7, 8, 9], [0, 1, 2, 3, 4])
    assert seed_stats.permutation_test(*extreme) == pytest.approx(seed_stats.smallest_p(5, 5))
    assert seed_stats.smallest_p(5, 5) == pytest.approx(2 / 252)
    assert seed_stats.smallest_p(5, 5) > ALPHA / 10
    assert seed_stats.welch_test(*extreme).p < ALPHA / 10
    assert seed_stats.permutation_test([5, 6, 7], [0, 1]) == pytest.approx(
        seed_stats.smallest_p(3, 2)
    )
    assert seed_stats.smallest_p(2, 2) == pytest.approx(1 / 3)


def test_holm_matches_a_hand_worked_example():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> 0.06
    assert seed_stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert seed_stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert seed_stats.holm([]) == []


def test_a_comparison_without_a_test_stays_in_holms_family():
    # as p = 1: the other two are multiplied by 3 and 2, not 2 and 1
    assert seed_stats.holm([0.01, None, 0.02]) == [pytest.approx(0.03), None, pytest.approx(0.04)]
    assert seed_stats.holm([None]) == [None]


def test_holm_step_alphas_are_the_levels_each_comparison_faces():
    # ranks by p: 0.005 first (alpha / 4), then 0.01 (/ 3), 0.03 (/ 2), 0.04 (/ 1)
    levels = seed_stats.holm_step_alphas([0.01, 0.04, 0.03, 0.005])
    assert levels == pytest.approx([0.05 / 3, 0.05, 0.05 / 2, 0.05 / 4])
    # a comparison without a test ranks last, as p = 1 in `holm`
    assert seed_stats.holm_step_alphas([None, 0.2]) == pytest.approx([0.05, 0.025])


@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_adjusted_p_is_at_most_alpha_exactly_where_its_step_down_passes(p_values):
    """Holm's adjusted p at most alpha is the step-down procedure: each p of the passing
    prefix (in p order) at or below its step's level."""
    # a p on a level's boundary rounds either way in floating point
    assume(all(abs(p * k - ALPHA) > 1e-12 for p in p_values for k in range(1, len(p_values) + 1)))
    levels = seed_stats.holm_step_alphas(p_values)
    adjusted = seed_stats.holm(p_values)
    passed, stopped = set(), False
    for index in sorted(range(len(p_values)), key=lambda i: p_values[i]):
        stopped = stopped or p_values[index] > levels[index]
        if not stopped:
            passed.add(index)
    assert {i for i, p in enumerate(adjusted) if p <= ALPHA} == passed


def test_aa_check_on_two_seeds_is_one_split_without_a_test():
    (split,) = seed_stats.aa_splits([38.40, 37.10])
    assert split.p is None and split.reason == seed_stats.SINGLE_RUN
    assert seed_stats.false_positive_rate([None]) is None
    assert seed_stats.false_positive_rate([0.01, None, 0.5]) == 0.5
    assert seed_stats.false_positive_rate([]) is None


def test_aa_splits_enumerate_each_unordered_split_once():
    assert len(seed_stats.aa_splits([1.0, 2.0, 3.0, 4.0, 5.0])) == math.comb(5, 2)
    assert len(seed_stats.aa_splits([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])) == math.comb(6, 3) // 2
    scores = [37.2, 38.0, 36.9, 37.5, 38.3]
    first = seed_stats.aa_splits(scores)[0]  # seeds 0 and 1 against 2, 3 and 4
    assert first.p == pytest.approx(stats.ttest_ind(scores[:2], scores[2:], equal_var=False).pvalue)


def test_aa_false_positive_rate_is_at_most_alpha_on_same_distribution_seeds():
    """Five runs of one config (seed-level scores from one distribution), split 2 against 3 in
    all 10 ways, over many simulated configs; and one 5-against-5 split (the study's design) of
    ten runs per config: Welch's test calls them different at most alpha of the time, up to
    simulation error (three standard errors, counting configs, not the correlated splits)."""
    rng = np.random.default_rng(7)
    configs = 1000
    per_config = [
        seed_stats.false_positive_rate([s.p for s in seed_stats.aa_splits(rng.normal(37.7, 0.9, 5))])
        for _ in range(configs)
    ]  # fmt: skip
    rate = statistics.fmean(per_config)
    assert rate <= ALPHA + 3 * statistics.stdev(per_config) / math.sqrt(configs)
    runs = 4000
    independent = [seed_stats.welch_test(*np.split(rng.normal(37.7, 0.9, 10), 2)).p
                   for _ in range(runs)]  # fmt: skip
    rate = seed_stats.false_positive_rate(independent)
    error = math.sqrt(ALPHA * (1 - ALPHA) / runs)
    assert ALPHA - 4 * error <= rate <= ALPHA + 3 * error  # near alpha: the test has its size


def test_welch_and_holm_keep_the_family_wise_error_over_a_null_study():
    """A study of ten variants that change nothing (every run from the base's distribution),
    five seeds each: Welch's test with Holm's correction calls any of them different in at most
    alpha of the studies, up to simulation error."""
    rng = np.random.default_rng(11)
    studies, comparisons, n = 1500, 10, 5
    any_called = 0
    for _ in range(studies):
        base = rng.normal(37.7, 0.9, n)
        p = [seed_stats.welch_test(rng.normal(37.7, 0.9, n), base).p for _ in range(comparisons)]
        any_called += min(seed_stats.holm(p)) <= ALPHA
    assert any_called / studies <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / studies)


def student_power(d: float, n: int, alpha: float) -> float:
    """Student's equal-variance t-test of n against n, the means d SDs apart: the noncentral
    t's mass beyond the two critical values (Welch's power is at most this at equal spreads)."""
    df, shift = 2 * n - 2, d * math.sqrt(n / 2)
    critical = stats.t.ppf(1 - alpha / 2, df)
    return stats.nct.sf(critical, df, shift) + stats.nct.sf(critical, df, -shift)


@pytest.mark.parametrize("alpha", [ALPHA, ALPHA / 10])
def test_detectable_difference_has_the_power_it_claims(alpha):
    """Five seeds a side, per comparison and at Holm's strictest step over ten comparisons:
    checked against the noncentral t (Student's test, which Welch's cannot beat at equal
    spreads) and against scipy's Welch test on fresh simulated studies."""
    sd = 0.9
    delta = seed_stats.detectable_difference(sd, 5, alpha=alpha)
    student = optimize.brentq(lambda d: student_power(d, 5, alpha) - seed_stats.POWER, 0.1, 20)
    assert student * sd <= delta <= 1.15 * student * sd
    rng = np.random.default_rng(123)
    noise = rng.standard_normal((20_000, 10))
    for d, expected in ((delta / sd, seed_stats.POWER), (delta / sd - 0.3, None)):
        shifted = noise + np.r_[np.full(5, d), np.zeros(5)]
        p = stats.ttest_ind(shifted[:, :5], shifted[:, 5:], equal_var=False, axis=1).pvalue
        power = float(np.mean(p <= alpha))
        if expected:
            assert power == pytest.approx(expected, abs=0.015)
        else:
            assert power < seed_stats.POWER - 0.05
        assert seed_stats.welch_power(d, 5, alpha=alpha, seed=5) == pytest.approx(power, abs=0.015)


def test_more_seeds_detect_less_and_a_single_seed_detects_nothing():
    sd = 0.9
    five = seed_stats.detectable_difference(sd, 5)
    assert seed_stats.detectable_difference(sd, 8) < five < seed_stats.detectable_difference(sd, 3)
    assert seed_stats.detectable_difference(sd, 5, alpha=ALPHA / 10) > five
    with pytest.raises(ValueError, match="two or more runs a side"):
        seed_stats.detectable_difference(sd, 1)


@pytest.mark.slow
def test_the_simulated_rates_the_docs_quote_come_out_the_same_with_another_seed():
    """docs/study-reports.md quotes the A/A, one-comparison and ten-comparison false-positive rates
    to the digits that two independent simulations of `NULL_SIMULATIONS` each agree on."""
    page = (REPO_ROOT / "docs" / "study-reports.md").read_text(encoding="utf-8")
    runs = [seed_stats.null_rates(seed=seed) for seed in (0, 1)]
    # the sentence of each rate, and the decimals it gives
    quoted = {"aa_2_vs_3": ("the rate is {} for five seeds split 2 against 3", 3),
              "five_vs_five": ("{} for 5 against 5", 3),
              "study_of_ten": ("makes any false call in {} of studies", 2)}  # fmt: skip
    for name, (sentence, decimals) in quoted.items():
        values = {f"{getattr(run, name):.{decimals}f}" for run in runs}
        assert len(values) == 1, (name, values)
        assert sentence.format(values.pop()) in " ".join(page.split()), name
    for run in runs:
        assert run.study_of_ten <= ALPHA and run.five_vs_five <= ALPHA
    # and the detectable differences it quotes for five seeds a side, per comparison and at
    # Holm's strictest step over ten
    detect = [{f"{seed_stats.detectable_difference(1.0, 5, alpha=a, seed=seed):.1f}"
               for seed in (0, 1)} for a in (ALPHA, ALPHA / 10)]  # fmt: skip
    assert all(len(values) == 1 for values in detect), detect
    (per_comparison,), (strictest,) = detect
    assert (
        f"detects {per_comparison} seed-level SDs per comparison, and {strictest} SDs at "
        "Holm's strictest step over ten comparisons"
    ) in " ".join(page.split())


def test_the_docs_detectable_differences_in_bleu_come_from_the_studys_own_base_seeds():
    """docs/study-reports.md turns the detectable differences into BLEU with `table3_seeds`' base
    spread: the sample SD of its five base seeds' test2016 BLEU (lc), from their records."""
    study = report.load_records(REPO_ROOT / RESULTS_ROOT / "table3_seeds")
    scores = [r.score(report.TEST_SPLIT, "bleu_lc") for r in study if r.variant == "base"]
    assert len(scores) == 5
    sd = statistics.stdev(scores)
    per_comparison, strictest = (seed_stats.detectable_difference(sd, len(scores), alpha=a)
                                 for a in (ALPHA, ALPHA / 10))  # fmt: skip
    assert (
        f"`table3_seeds`' base spread (SD {sd:.2f} BLEU over its five seeds) "
        f"{per_comparison:.1f} and {strictest:.1f} BLEU"
    ) in " ".join((REPO_ROOT / "docs" / "study-reports.md").read_text(encoding="utf-8").split())
