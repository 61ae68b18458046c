"""Statistics whose unit is the training run (one seed), not the test sentence.

A paired bootstrap over test sentences sees only how the test set was sampled: two seeds of one
config can differ "significantly" on it. Whether a change to the recipe moves BLEU is a question
about training runs, so here the sample is the seed-level score of each run:
- `t_interval`: a variant's mean over its seeds and the 95% t-interval of that mean;
- `welch_test`: Welch's two-sided t-test of the difference of two groups' seed means (no equal
  spread assumed; its p is continuous, so a large effect can pass Holm's strictest step with
  few seeds): the verdict test;
- `permutation_test`: the exact two-sided permutation test of the same difference (every
  relabelling of the runs enumerated), distribution-free, shown beside it: with n runs a side
  its p can never fall below `smallest_p(n, n)` (2/252 at five), which can lie above Holm's
  strictest step, so it cannot be the verdict of a many-comparison study;
- `welch_interval`: the t-interval of the difference of seed means that Welch's test inverts;
- `holm`: Holm's step-down adjustment across a study's comparisons, and `holm_step_alphas`
  the level each comparison faces at its step;
- `aa_splits`: the A/A check, Welch's test applied to every split of one config's seeds in two;
- `null_rates`: the false-positive rates of the A/A check, one comparison and a Holm study of
  ten, by simulation;
- `detectable_difference`: the smallest difference a study of n seeds a side detects with a
  given power by Welch's test, at the spread of the base's seeds.
Student's t distribution (quantiles, tail areas) is scipy's.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

ALPHA = 0.05  # the study-wise error rate Holm's correction keeps
CONFIDENCE = 0.95  # of each variant's interval over seeds
POWER = 0.8  # of the detectable difference
# Simulated studies per power estimate (Welch's power has no closed form: its degrees of freedom
# are themselves random); the detectable difference is found to within DETECTABLE_TOLERANCE (in
# units of the seed-level SD) by bisection.
POWER_SIMULATIONS = 20_000
DETECTABLE_TOLERANCE = 0.01
POWER_SEED = 0
# Relabellings enumerated exactly up to this many; a Monte Carlo sample of that size above it.
MAX_EXACT_RELABELLINGS = 20_000
# Score sets tested at once by the permutation test (bounds its memory).
CHUNK = 256
# Two statistics (or a spread and zero) that differ by less than this, relative to the scores,
# are ties: floating-point sums of the same numbers in another order must count as equal.
TIE_TOLERANCE = 1e-9

# Why Welch's test gives no p (the comparison then cannot tell)
SINGLE_RUN = "a single seed on one side: its spread over seeds is unknown"
NO_SPREAD = "no spread over seeds on either side: the t statistic is undefined"


def t_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float | None, float | None]:
    """(mean, low, high): the mean over seeds and its two-sided t-interval (Student, n - 1
    degrees of freedom); no interval from a single seed."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, None, None
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return mean, mean - float(half), mean + float(half)


@dataclass(frozen=True)
class WelchResult:
    """Welch's test of mean(a) - mean(b): t, its Welch-Satterthwaite degrees of freedom and the
    two-sided p; where no test is possible, p is None and `reason` says why."""

    difference: float
    t: float | None = None
    df: float | None = None
    p: float | None = None
    reason: str | None = None


def welch_test(a: Sequence[float], b: Sequence[float]) -> WelchResult:
    """Welch's two-sided t-test of the difference of seed means (each group its own variance):
    t = (mean_a - mean_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b), and
    df = (s_a^2/n_a + s_b^2/n_b)^2 / ((s_a^2/n_a)^2 / (n_a - 1) + (s_b^2/n_b)^2 / (n_b - 1)).
    No p from a single run on a side, nor where neither side varies (t would be 0/0 or
    infinite: a 'significant' difference of two constants says nothing about seeds)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 1 or len(y) < 1:
        raise ValueError("welch_test needs at least one run in each group")
    difference = float(x.mean() - y.mean())
    if len(x) < 2 or len(y) < 2:
        return WelchResult(difference, reason=SINGLE_RUN)
    scale = max(1.0, float(np.abs(np.concatenate([x, y])).max()))
    var_a, var_b = (float(v.var(ddof=1)) for v in (x, y))
    if max(var_a, var_b) <= (TIE_TOLERANCE * scale) ** 2:
        return WelchResult(difference, reason=NO_SPREAD)
    se_a, se_b = var_a / len(x), var_b / len(y)
    t = difference / math.sqrt(se_a + se_b)
    df = (se_a + se_b) ** 2 / (se_a**2 / (len(x) - 1) + se_b**2 / (len(y) - 1))
    return WelchResult(difference, t, df, float(2 * stats.t.sf(abs(t), df)))


def welch_interval(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float | None, float | None]:
    """The two-sided t-interval of mean(a) - mean(b) at Welch's degrees of freedom (the
    interval that Welch's test inverts); (None, None) where the test gives no p."""
    result = welch_test(a, b)
    if result.p is None:
        return None, None
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    standard_error = math.sqrt(x.var(ddof=1) / len(x) + y.var(ddof=1) / len(y))
    half = float(stats.t.ppf(0.5 + confidence / 2, result.df)) * standard_error
    return result.difference - half, result.difference + half


def _welch_p_values(scores: np.ndarray, n_a: int) -> np.ndarray:
    """Two-sided Welch p-values of (S, n) score sets whose first n_a columns are group a (every
    set with spread on at least one side)."""
    a, b = scores[:, :n_a], scores[:, n_a:]
    se_a, se_b = a.var(axis=1, ddof=1) / n_a, b.var(axis=1, ddof=1) / b.shape[1]
    t = (a.mean(axis=1) - b.mean(axis=1)) / np.sqrt(se_a + se_b)
    df = (se_a + se_b) ** 2 / (se_a**2 / (n_a - 1) + se_b**2 / (b.shape[1] - 1))
    return 2 * stats.t.sf(np.abs(t), df)


def _relabellings(n_a: int, n_b: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """(R, n_a + n_b) weights: row r gives each run +1/n_a if relabelled into group a, else
    -1/n_b, so that `scores @ weights.T` is each relabelling's difference of means. Every
    relabelling when there are at most MAX_EXACT_RELABELLINGS, else a uniform sample of them
    (the observed labelling first, so that p is never 0)."""
    n = n_a + n_b
    count = math.comb(n, n_a)
    if count <= MAX_EXACT_RELABELLINGS:
        members = np.zeros((count, n), dtype=bool)
        for row, group_a in enumerate(itertools.combinations(range(n), n_a)):
            members[row, list(group_a)] = True
    else:
        rng = rng or np.random.default_rng(POWER_SEED)
        order = np.argsort(rng.random((MAX_EXACT_RELABELLINGS, n)), axis=1)
        members = np.zeros((MAX_EXACT_RELABELLINGS, n), dtype=bool)
        np.put_along_axis(members, order[:, :n_a], True, axis=1)
        members[0] = np.arange(n) < n_a
    return np.where(members, 1.0 / n_a, -1.0 / n_b)


def _permutation_p_values(scores: np.ndarray, weights: np.ndarray, n_a: int) -> np.ndarray:
    """Two-sided permutation p-values of (S, n) score sets whose first n_a columns are group a."""
    p_values = []
    for chunk in np.array_split(scores, max(1, math.ceil(len(scores) / CHUNK))):
        observed = chunk[:, :n_a].mean(axis=1) - chunk[:, n_a:].mean(axis=1)
        permuted = np.abs(chunk @ weights.T)
        scale = np.maximum(np.abs(chunk).max(axis=1), 1.0)
        at_least = permuted >= (np.abs(observed) - TIE_TOLERANCE * scale)[:, None]
        p_values.append(at_least.mean(axis=1))
    return np.concatenate(p_values)


def permutation_test(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value of mean(a) - mean(b) under the null that the runs' labels are
    exchangeable: the share of all relabellings of the n_a + n_b runs into groups of n_a and n_b
    whose |difference of means| is at least the observed one."""
    if len(a) < 1 or len(b) < 1:
        raise ValueError("permutation_test needs at least one run in each group")
    scores = np.asarray([*a, *b], dtype=float)[None, :]
    return float(_permutation_p_values(scores, _relabellings(len(a), len(b)), len(a))[0])


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p-value `permutation_test` can give for groups of n_a and n_b
    runs (all runs distinct): the two most extreme relabellings alone, or one when the groups
    differ in size."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (the family-wise error is at most alpha for the
    comparisons whose adjusted p is at most alpha): the k-th smallest of m is multiplied by
    m - k + 1, then made non-decreasing in that order, capped at 1. A comparison without a p
    (no test was possible) stays in the family as p = 1, so that the family is the study's
    comparisons whatever the data, and keeps None."""
    m = len(p_values)
    filled = [1.0 if p is None else p for p in p_values]
    adjusted: list[float | None] = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: filled[i])):
        running = max(running, min(1.0, (m - rank) * filled[index]))
        adjusted[index] = None if p_values[index] is None else running
    return adjusted


def holm_step_alphas(p_values: Sequence[float | None], alpha: float = ALPHA) -> list[float]:
    """The level each comparison's own p faces in Holm's step-down procedure: the k-th
    smallest of m (k from 0) is tested at alpha / (m - k), a comparison without a p ranking
    last (as `holm` counts it, p = 1). A comparison that 'cannot tell' could only have been
    called at its step's level, so this is the level its detectable difference is sized at."""
    m = len(p_values)
    filled = [1.0 if p is None else p for p in p_values]
    levels = [alpha] * m
    for rank, index in enumerate(sorted(range(m), key=lambda i: filled[i])):
        levels[index] = alpha / (m - rank)
    return levels


def aa_splits(scores: Sequence[float]) -> list[WelchResult]:
    """The A/A check: `welch_test` of every split of one config's runs into two groups of
    n // 2 and n - n // 2 (each unordered split once). Runs of one config differ only by chance,
    so the share of these p-values at or below alpha is the test's false-positive rate on this
    config (a split of one run a side gives no p)."""
    n = len(scores)
    if n < 2:
        return []
    half = n // 2
    splits = list(itertools.combinations(range(n), half))
    if 2 * half == n:  # {A, B} and {B, A} are one split
        splits = [s for s in splits if 0 in s]
    results = []
    for group in splits:
        rest = [i for i in range(n) if i not in group]
        results.append(welch_test([scores[i] for i in group], [scores[i] for i in rest]))
    return results


def false_positive_rate(p_values: Sequence[float | None], alpha: float = ALPHA) -> float | None:
    """The share of tests (those that gave a p) at or below alpha; None where none did."""
    tested = [p for p in p_values if p is not None]
    return sum(p <= alpha for p in tested) / len(tested) if tested else None


NULL_SIMULATIONS = 1_000_000  # per rate: a rerun with another seed gives the digits quoted
NULL_CHUNK = 50_000  # simulated configs at once (bounds memory)


@dataclass(frozen=True)
class NullRates:
    """How often Welch's test calls runs of one config different, by simulation (seed-level
    scores from one normal distribution): the A/A check's 2-against-3 splits of five runs
    (all 10 splits of each config counted), one 5-against-5 comparison, and a study of ten
    such comparisons with one base under Holm (any call at all: the family-wise error)."""

    aa_2_vs_3: float
    five_vs_five: float
    study_of_ten: float


def null_rates(
    simulations: int = NULL_SIMULATIONS, seed: int = POWER_SEED, alpha: float = ALPHA
) -> NullRates:
    rng = np.random.default_rng(seed)
    splits = [list(a) + [i for i in range(5) if i not in a]
              for a in itertools.combinations(range(5), 2)]  # fmt: skip
    calls = np.zeros(3)
    for start in range(0, simulations, NULL_CHUNK):
        size = min(NULL_CHUNK, simulations - start)
        five = rng.standard_normal((size, 5))
        calls[0] += sum((_welch_p_values(five[:, order], 2) <= alpha).sum() for order in splits)
        calls[1] += (_welch_p_values(rng.standard_normal((size, 10)), 5) <= alpha).sum()
        base = np.repeat(rng.standard_normal((size, 1, 5)), 10, axis=1)
        study = np.concatenate([rng.standard_normal((size, 10, 5)), base], axis=2)
        p = _welch_p_values(study.reshape(-1, 10), 5).reshape(size, 10)
        # Holm calls something different exactly when its first step does: min p * m <= alpha
        calls[2] += (p.min(axis=1) * p.shape[1] <= alpha).sum()
    aa, pair, family = calls / [simulations * len(splits), simulations, simulations]
    return NullRates(float(aa), float(pair), float(family))


def welch_power(
    difference: float,
    n: int,
    alpha: float = ALPHA,
    simulations: int = POWER_SIMULATIONS,
    seed: int = POWER_SEED,
) -> float:
    """The share of simulated studies (n runs a side, seed-level scores normal with SD 1, the
    means `difference` SDs apart) in which `welch_test` gives p <= alpha."""
    noise = np.random.default_rng(seed).standard_normal((simulations, 2 * n))
    return _power(noise, difference, n, alpha)


def _power(noise: np.ndarray, difference: float, n: int, alpha: float) -> float:
    shifted = noise.copy()
    shifted[:, :n] += difference
    return float((_welch_p_values(shifted, n) <= alpha).mean())


def detectable_difference(
    sd: float,
    n: int,
    alpha: float = ALPHA,
    power: float = POWER,
    simulations: int = POWER_SIMULATIONS,
    seed: int = POWER_SEED,
) -> float:
    """The smallest difference of means (in the units of `sd`, the seed-level standard
    deviation) that Welch's test of n runs against n detects at `alpha` with `power`. The same
    simulated noise is used for every difference tried, so power grows with the difference and
    bisection finds it."""
    if n < 2:
        raise ValueError(f"Welch's test needs two or more runs a side, got {n}")
    noise = np.random.default_rng(seed).standard_normal((simulations, 2 * n))
    low, high = 0.0, 1.0
    while _power(noise, high, n, alpha) < power:
        low, high = high, 2 * high
    while high - low > DETECTABLE_TOLERANCE:
        middle = (low + high) / 2
        low, high = (low, middle) if _power(noise, middle, n, alpha) >= power else (middle, high)
    return high * sd
