"""Corpus-level translation metrics with sacrebleu (Post 2018), signatures included.

BLEU is sacrebleu's default: 13a tokenisation, cased, one reference; that is the number to
report. `bleu_lc` (the CLI's `-lc`) is there only to compare with papers that lowercase.
`bleu_tok_lc` (given the target language) is how the Multi30k literature scores: BLEU on
text lowercased, punctuation-normalised and Moses-tokenized with hyphens split and rejoined,
as the dataset's own `task1-tokenize.sh` makes its tokenized test targets (`.lc.norm.tok`,
`.dehyph`); its test2016 German references count the 12103 tokens of Wu et al. (2021)'s
`reflen` (a test checks it).
Every score carries its sacrebleu signature, so a number is never separated from how it
was computed. `paired_bootstrap` gives p-values between two systems on the same test set
(Koehn 2004, as sacrebleu's `--paired-bs`); `score(bootstrap_samples=N)` adds the 95%
bootstrap half-width of one system's lowercased BLEU (the CLI's `-lc --confidence`).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric
from sacrebleu.significance import PairedTest

from pipeline.data.moses import moses_tokenize
from pipeline.errors import DataError

# The metrics `score` reports, by key; the same keys name them in eval.json and W&B.
METRICS: dict[str, type[Metric] | tuple[type[Metric], dict]] = {
    "bleu": BLEU,
    "bleu_lc": (BLEU, {"lowercase": True}),
    "chrf": CHRF,
    "ter": TER,
}
LITERATURE_METRIC = "bleu_tok_lc"
MOSES_HYPHEN = re.compile(r"\s*@-@\s*")  # `tokenizer.perl -a` splits "t-shirt" into "t @-@ shirt"
# sacrebleu's `--paired-bs-n` default and its default SACREBLEU_SEED.
DEFAULT_BOOTSTRAP_SAMPLES = 1000
DEFAULT_BOOTSTRAP_SEED = 12345
# A report makes the same pooled tests once per block it writes (its page, README's summary,
# its record): the last few are kept (each holds its texts, megabytes), so each is made once.
POOLED_P_CACHE_SIZE = 8


def make_metric(key: str) -> Metric:
    """A fresh sacrebleu metric object for one of the keys of `METRICS`."""
    if key not in METRICS:
        raise KeyError(f"unknown metric '{key}'; choose from {sorted(METRICS)}")
    spec = METRICS[key]
    cls, kwargs = spec if isinstance(spec, tuple) else (spec, {})
    return cls(**kwargs)


def sentence_bleu_statistics(
    bleu: BLEU, hypotheses: Sequence[str], references: Sequence[str]
) -> list[list[int]]:
    """sacreBLEU's sufficient statistics of each hypothesis against its one reference (its
    lengths and n-gram matches and totals), which summed over sentences, batches or processes
    give the corpus's (`bleu_from_statistics`). sacreBLEU has no public name for them: this
    and `bleu_from_statistics` are where its private API is reached
    (`tests/test_scoring.py` checks them against its public `corpus_score`)."""
    return bleu._extract_corpus_statistics(list(hypotheses), [list(references)])


def bleu_from_statistics(bleu: BLEU, statistics: Sequence[int]) -> float:
    """Corpus BLEU of summed `sentence_bleu_statistics`, as `bleu.corpus_score` computes it."""
    return bleu._compute_score_from_stats([int(x) for x in statistics]).score


def check_aligned(hypotheses: Sequence[str], references: Sequence[str], what: str = "") -> None:
    """One hypothesis per reference, or a DataError that says which input is short."""
    if len(hypotheses) != len(references):
        where = f" for {what}" if what else ""
        raise DataError(
            f"{len(hypotheses)} hypotheses but {len(references)} references{where}: "
            "hypothesis and reference files must have one line per source sentence"
        )
    if not references:
        raise DataError(f"no references{' for ' + what if what else ''}: nothing to score")


def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    lang: str | None = None,
    bootstrap_samples: int = 0,
) -> dict:
    """Corpus BLEU (13a, cased), lowercased BLEU, chrF and TER of detokenized hypotheses, and
    with `lang` (the target language) the literature's tokenized lowercased BLEU; with
    `bootstrap_samples` > 1, the 95% half-width of lowercased BLEU over that many resamples of
    the sentences (`bleu_lc_ci`: how far the test set's sampling alone moves the score).

    Returns `{"bleu": float, "bleu_lc": float, "chrf": float, "ter": float,
    ["bleu_tok_lc": float,] ["bleu_lc_ci": float,] "signatures": {"bleu":
    "nrefs:1|case:mixed|eff:no|tok:13a|...", ...}}`; scores are sacrebleu's unrounded values
    (the CLI prints them rounded).
    """
    check_aligned(hypotheses, references)
    hypotheses, references = list(hypotheses), [list(references)]
    result: dict = {"signatures": {}}
    for key in METRICS:
        metric = make_metric(key)
        result[key] = float(metric.corpus_score(hypotheses, references).score)
        result["signatures"][key] = str(metric.get_signature())
    if bootstrap_samples > 1:
        metric = make_metric("bleu_lc")
        with _sacrebleu_seed(DEFAULT_BOOTSTRAP_SEED):
            bootstrapped = metric.corpus_score(hypotheses, references, bootstrap_samples)
        # sacrebleu keeps the half-width in `_ci` (the CLI's "± x" of `--confidence`)
        result["bleu_lc_ci"] = float(bootstrapped._ci)
        result["signatures"]["bleu_lc_ci"] = str(metric.get_signature())  # with bs:N|seed:S
    if lang is not None:
        import sacremoses  # where it is used (`pipeline.data.moses`)

        # On lowercased, tokenized text ("pre:lc" in the signature); `force` silences
        # sacrebleu's "forgot to detokenize?" warning, which is this metric's whole point.
        metric = BLEU(tokenize="none", force=True)
        tokenized = [moses_tokenized(references[0], lang)]
        result[LITERATURE_METRIC] = float(
            metric.corpus_score(moses_tokenized(hypotheses, lang), tokenized).score
        )
        result["signatures"][LITERATURE_METRIC] = (
            f"{metric.get_signature()}|pre:lc+moses-norm+moses-tok-a-dehyph:{lang}"
            f"|sacremoses:{sacremoses.__version__}"
        )
    return result


def moses_tokenized(texts: Sequence[str], lang: str) -> list[str]:
    """Multi30k's tokenized text: lowercase, `normalize-punctuation.perl`, `tokenizer.perl -a
    -no-escape` (sacremoses' ports), hyphens rejoined ("t @-@ shirt" -> "t-shirt")."""
    tokenized = moses_tokenize(
        texts, lang, escape=False, aggressive_dash_splits=True, perl_parity=False
    )
    return [MOSES_HYPHEN.sub("-", line) for line in tokenized]


@dataclass(frozen=True)
class PairedResult:
    """One metric of a paired bootstrap test: scores, 95% half-widths, p-value of the difference."""

    metric: str
    baseline: float
    baseline_mean: float
    baseline_ci: float
    system: float
    system_mean: float
    system_ci: float
    p_value: float
    signature: str


@contextmanager
def _sacrebleu_seed(seed: int) -> Iterator[None]:
    """sacrebleu's PairedTest takes its seed only from SACREBLEU_SEED (read at construction)."""
    previous = os.environ.get("SACREBLEU_SEED")
    os.environ["SACREBLEU_SEED"] = str(seed)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["SACREBLEU_SEED"]
        else:
            os.environ["SACREBLEU_SEED"] = previous


def paired_bootstrap(
    baseline: Sequence[str],
    system: Sequence[str],
    references: Sequence[str],
    *,
    metrics: Sequence[str] = ("bleu", "chrf", "ter"),
    n_samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> dict[str, PairedResult]:
    """Paired bootstrap resampling between two systems' hypotheses on the same references.

    The same `n_samples` resamples of sentence indices score both systems; the p-value is
    the probability of a difference at least as large as the observed one under the null
    hypothesis (sacrebleu `--paired-bs`, equal to the CLI with SACREBLEU_SEED=`seed`).
    """
    return paired_bootstraps(
        baseline, [system], references, metrics=metrics, n_samples=n_samples, seed=seed
    )[0]


def paired_bootstraps(
    baseline: Sequence[str],
    systems: Sequence[Sequence[str]],
    references: Sequence[str],
    *,
    metrics: Sequence[str] = ("bleu", "chrf", "ter"),
    n_samples: int = DEFAULT_BOOTSTRAP_SAMPLES,
    seed: int = DEFAULT_BOOTSTRAP_SEED,
) -> list[dict[str, PairedResult]]:
    """`paired_bootstrap` of each of `systems` against one baseline, in one sacreBLEU test:
    the baseline's and the references' statistics are computed once, and each system's result
    is the one a test of it alone gives (every system is resampled with the same seeded
    indices), as the CLI's `--paired-bs` of several systems."""
    if seed <= 0:  # sacrebleu treats a seed of 0 as "no seed"
        raise ValueError(f"seed must be a positive integer, got {seed}")
    if n_samples <= 0:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    if "bleu" in metrics and "bleu_lc" in metrics:  # both are named "BLEU" inside PairedTest
        raise ValueError("test 'bleu' or 'bleu_lc', not both in one call")
    check_aligned(baseline, references, "the baseline")
    for system in systems:
        check_aligned(system, references, "the system")
    with _sacrebleu_seed(seed):
        test = PairedTest(
            [("baseline", list(baseline)),
             *((f"system {i}", list(system)) for i, system in enumerate(systems))],
            {key: make_metric(key) for key in metrics},
            references=[list(references)],
            test_type="bs",
            n_samples=n_samples,
        )  # fmt: skip
        signatures, results = test()
    # PairedTest keys its results by display name ("BLEU", "chrF2", "TER") in `metrics` order,
    # each a list of the baseline's result and then each system's.
    names = [name for name in results if name != "System"]
    out: list[dict[str, PairedResult]] = [{} for _ in systems]
    for key, name in zip(metrics, names):
        base, *others = results[name]
        for i, other in enumerate(others):
            out[i][key] = PairedResult(
                metric=key,
                baseline=float(base.score),
                baseline_mean=float(base.mean),
                baseline_ci=float(base.ci),
                system=float(other.score),
                system_mean=float(other.mean),
                system_ci=float(other.ci),
                p_value=_p_value(base, other),
                signature=str(signatures[name]),
            )
    return out


def _p_value(base, other) -> float:
    """sacreBLEU's p, except where the two systems score the same on every resample (both
    0.00 BLEU, say): there sacreBLEU counts no resample beyond the observed difference of zero
    and answers its smallest p, 1/(n+1), "significant"; the test has seen no difference: 1."""
    if base.score == other.score and base.ci == 0 and other.ci == 0:
        return 1.0
    return float(other.p_value)


def length_ratio(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Hypothesis length over reference length, in the tokens of lowercased BLEU: what its
    brevity penalty sees, so that a BLEU difference can be told apart into length and n-grams."""
    check_aligned(hypotheses, references)
    bleu = make_metric("bleu_lc").corpus_score(list(hypotheses), [list(references)])
    return bleu.sys_len / bleu.ref_len


def pooled_paired_bootstrap(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
    references: Sequence[str],
    metric: str = "bleu_lc",
) -> float:
    """p of `paired_bootstrap` over several seeds at once: each (baseline, system) pair of one
    seed's translations side by side, over the references repeated once per pair."""
    baseline, system = [base for base, _ in pairs], [other for _, other in pairs]
    return pooled_paired_bootstraps(baseline, [system], references, metric)[0]


def pooled_paired_bootstraps(
    baseline: Sequence[Sequence[str]],
    systems: Sequence[Sequence[Sequence[str]]],
    references: Sequence[str],
    metric: str = "bleu_lc",
) -> list[float]:
    """`pooled_paired_bootstrap` of each of `systems` against one baseline in one test
    (`paired_bootstraps`): `baseline` holds one list of translations per seed, each system one
    per seed in the same order."""
    pooled = tuple(line for seed in baseline for line in seed)
    return list(_pooled_ps(
        pooled,
        tuple(tuple(line for seed in system for line in seed) for system in systems),
        tuple(references) * len(baseline),
        metric,
    ))  # fmt: skip


@functools.lru_cache(maxsize=POOLED_P_CACHE_SIZE)
def _pooled_ps(
    baseline: tuple[str, ...],
    systems: tuple[tuple[str, ...], ...],
    references: tuple[str, ...],
    metric: str,
) -> tuple[float, ...]:
    """One test per content: 1000 resamples of thousands of sentences take seconds, and the
    p of the same texts is the same (the resamples' seed is fixed)."""
    results = paired_bootstraps(baseline, systems, references, metrics=(metric,))
    return tuple(result[metric].p_value for result in results)
