"""Statistics whose unit is the training run (one seed), not the test sentence.

A paired bootstrap over test sentences sees only how the test set was sampled: two seeds of one
config can differ "significantly" on it. Whether a change to the recipe moves BLEU is a question
about training runs, so here the sample is the seed-level score of each run:
- `t_interval`: a variant's mean over its seeds and the 95% t-interval of that mean;
- `permutation_test`: the exact two-sided permutation test of the difference of two groups'
  seed means (every relabelling of the runs enumerated; distribution-free, exact at any n);
- `holm`: Holm's step-down adjustment across a study's comparisons;
- `aa_splits`: the A/A check, the test applied to every split of one config's seeds in two;
- `detectable_difference`: the smallest difference a study of n seeds a side detects with a
  given power, for the permutation test itself, at the spread of the base's seeds.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

ALPHA = 0.05  # the study-wise error rate Holm's correction keeps
CONFIDENCE = 0.95  # of each variant's interval over seeds
POWER = 0.8  # of the detectable difference
# Simulated studies per power estimate; the detectable difference is found to within
# DETECTABLE_TOLERANCE (in units of the seed-level SD) by bisection.
POWER_SIMULATIONS = 2000
DETECTABLE_TOLERANCE = 0.01
POWER_SEED = 0
# Relabellings enumerated exactly up to this many; a Monte Carlo sample of that size above it.
MAX_EXACT_RELABELLINGS = 20_000
# Simulated studies tested at once (bounds the memory of a power estimate).
CHUNK = 256
# Two statistics that differ by less than this (relative) are ties: floating-point sums of the
# same numbers in another order must count as the observed difference itself.
TIE_TOLERANCE = 1e-9


def t_interval(
    values: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float | None, float | None]:
    """(mean, low, high): the mean over seeds and its two-sided t-interval (Student, n - 1
    degrees of freedom); no interval from a single seed."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, None, None
    half = t_quantile(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return mean, mean - float(half), mean + float(half)


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (Lentz's
    method), on the side of x where it converges fast."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    front = math.exp(log_front + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d, fraction = 1.0, 0.0, 1.0
    for i in range(_BETA_TERMS):
        m = i // 2
        if i == 0:
            term = 1.0
        elif i % 2 == 0:
            term = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        else:
            term = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d = 1.0 + term * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + term / c
        c = c if abs(c) > tiny else tiny
        fraction *= c * d
        if abs(1.0 - c * d) < _BETA_PRECISION:
            break
    return front * (fraction - 1.0)


_BETA_TERMS = 400
_BETA_PRECISION = 1e-15


def t_cdf(t: float, df: int) -> float:
    """Student's t distribution function with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: int) -> float:
    """The q-quantile of Student's t with `df` degrees of freedom (bisection on `t_cdf`)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q}")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < q:
        low, high = high, 2 * high
    while high - low > _BETA_PRECISION * max(1.0, high):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < q else (low, middle)
    return (low + high) / 2


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


def _p_values(scores: np.ndarray, weights: np.ndarray, n_a: int) -> np.ndarray:
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
    return float(_p_values(scores, _relabellings(len(a), len(b)), len(a))[0])


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p-value `permutation_test` can give for groups of n_a and n_b
    runs (all runs distinct): the two most extreme relabellings alone, or one when the groups
    differ in size."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (the family-wise error is at most alpha for the
    comparisons whose adjusted p is at most alpha): the k-th smallest of m is multiplied by
    m - k + 1, then made non-decreasing in that order, capped at 1."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def aa_splits(scores: Sequence[float]) -> list[float]:
    """The A/A check: `permutation_test` of every split of one config's runs into two groups
    of n // 2 and n - n // 2 (each unordered split once). Runs of one config differ only by
    chance, so the share of these p-values at or below alpha is the test's false-positive
    rate on this config."""
    n = len(scores)
    if n < 2:
        return []
    half = n // 2
    splits = list(itertools.combinations(range(n), half))
    if 2 * half == n:  # {A, B} and {B, A} are one split
        splits = [s for s in splits if 0 in s]
    p_values = []
    for group in splits:
        rest = [i for i in range(n) if i not in group]
        p_values.append(permutation_test([scores[i] for i in group], [scores[i] for i in rest]))
    return p_values


def false_positive_rate(p_values: Sequence[float], alpha: float = ALPHA) -> float | None:
    return sum(p <= alpha for p in p_values) / len(p_values) if p_values else None


def permutation_power(
    difference: float,
    n: int,
    alpha: float = ALPHA,
    simulations: int = POWER_SIMULATIONS,
    seed: int = POWER_SEED,
) -> float:
    """The share of simulated studies (n runs a side, seed-level scores normal with SD 1, the
    means `difference` SDs apart) in which `permutation_test` gives p <= alpha."""
    noise = np.random.default_rng(seed).standard_normal((simulations, 2 * n))
    return _power(noise, difference, n, _relabellings(n, n), alpha)


def _power(noise: np.ndarray, difference: float, n: int, weights: np.ndarray, alpha: float):
    shifted = noise.copy()
    shifted[:, :n] += difference
    return float((_p_values(shifted, weights, n) <= alpha).mean())


def detectable_difference(
    sd: float,
    n: int,
    alpha: float = ALPHA,
    power: float = POWER,
    simulations: int = POWER_SIMULATIONS,
    seed: int = POWER_SEED,
) -> float:
    """The smallest difference of means (in the units of `sd`, the seed-level standard
    deviation) that a permutation test of n runs against n detects at `alpha` with `power`;
    infinite where no difference can be detected (its smallest p is above alpha). The same
    simulated noise is used for every difference tried, so power grows with the difference
    and bisection finds it."""
    if smallest_p(n, n) > alpha:
        return math.inf
    noise = np.random.default_rng(seed).standard_normal((simulations, 2 * n))
    weights = _relabellings(n, n)
    low, high = 0.0, 1.0
    while _power(noise, high, n, weights, alpha) < power:
        low, high = high, 2 * high
    while high - low > DETECTABLE_TOLERANCE:
        middle = (low + high) / 2
        low, high = (
            (low, middle) if _power(noise, middle, n, weights, alpha) >= power else (middle, high)
        )
    return high * sd
