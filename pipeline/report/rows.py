"""Per-variant statistics: one row per variant over its seeds, compared with the base by Welch's
test over seed-level BLEU (Holm-adjusted, the verdict's only source), the exact permutation test
and sacreBLEU's paired bootstrap over test sentences, and the verdict against the paper; the
spec's contrasts between variants, tested the same way in the one Holm family."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from pipeline.evaluation import scoring, seed_stats
from pipeline.report.records import (
    P_METRIC,
    TEST_SPLIT,
    VAL_SPLIT,
    RunConditions,
    TrialRecord,
)
from pipeline.sweep.records import LOSS_AVERAGE
from pipeline.sweep.spec import BASE_VARIANT, StudySpec

SIGNIFICANCE = seed_stats.ALPHA
# Verdicts against the paper, from the seed-level test alone
HOLDS, CONTRADICTS, CANNOT_TELL, DIFFERS = "holds", "contradicts", "cannot tell", "differs"
OTHER_CONDITIONS = "the two ran under different conditions"  # why a contrast is not made


@dataclass(kw_only=True)
class Comparison:
    """One planned comparison of the study's Holm family: the difference of two seed means on
    test2016 BLEU (lc) and val PPL, its Welch interval and test, the Holm-adjusted p (BLEU and
    val PPL each a family of its own), the level its Holm step faced and the verdict."""

    delta: float | None = None
    delta_interval: tuple[float | None, float | None] = (None, None)
    # Welch's test over seed-level test BLEU (the verdict's), its Holm-adjusted p, and why
    # there is none where it cannot be made
    welch_p: float | None = None
    holm_p: float | None = None
    no_test_reason: str | None = None
    ppl_delta: float | None = None
    ppl_welch_p: float | None = None
    ppl_holm_p: float | None = None
    # the level the comparison's Holm step faced
    holm_alpha: float | None = None
    verdict: str | None = None
    # the exact permutation test of the same difference (distribution-free, secondary)
    permutation_p: float | None = None
    # an estimate from a study whose planned seeds have not all finished: no test, no verdict
    interim: bool = False
    # Where the test cannot tell: the difference Welch's test detects with seed_stats.POWER
    # at the level its Holm step faced, at the two groups' seed spread (RMS of the SDs)
    detectable: float | None = None


@dataclass
class VariantRow(Comparison):
    """A variant over its seeds, compared with the base."""

    variant: str
    factor: str
    parameters: int | None
    val_ppl: list[float]
    val_bleu: list[float]
    test_bleu: list[float]
    test_half_widths: list[float]
    seeds: list[int]
    # False where a trial logged its val loss as the mean of the val batches' means (records
    # made before TokenMean carry no `loss_average`)
    ppl_per_token: bool = True
    paper: dict[str, Any] = field(default_factory=dict)
    # None where the variant's own trials ran under several conditions
    conditions: RunConditions | None = None
    # False where the variant and the base ran under different conditions: not compared
    comparable: bool = True
    # sacreBLEU's paired bootstrap over test sentences, seeds pooled (secondary)
    p_value: float | None = None
    ppl_delta_interval: tuple[float | None, float | None] = (None, None)

    @property
    def label(self) -> str:
        return self.variant

    @property
    def test_mean(self) -> float:
        return statistics.fmean(self.test_bleu)

    @property
    def test_interval(self) -> tuple[float | None, float | None]:
        return seed_stats.t_interval(self.test_bleu)[1:]

    @property
    def compared(self) -> bool:
        return self.delta is not None and self.comparable

    @property
    def ppl_interval(self) -> tuple[float | None, float | None]:
        return seed_stats.t_interval(self.val_ppl)[1:]

    @property
    def test_half_width(self) -> float | None:
        return statistics.fmean(self.test_half_widths) if self.test_half_widths else None


def factor_text(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "(base recipe)"


def variant_rows(
    spec: StudySpec,
    records: list[TrialRecord],
    references: list[str],
    pinned: RunConditions | None = None,
) -> list[VariantRow]:
    """One row per variant with finished trials, in the spec's order. A variant run under the
    base's conditions is compared with it by Welch's test over seeds (Holm-adjusted across the
    spec's comparisons with the base, whether or not each could be made; its verdict comes from
    that alone) and, secondarily, by the exact permutation test over seeds and a paired
    bootstrap over test sentences, the seeds both ran pooled. One run under other conditions
    (or the base itself under several) is not compared.

    `pinned`: the conditions a pinned study runs at. Its rows are then its pinned trials; the
    trials run elsewhere (`--allow-mixed`) come after them as rows never compared. Until every
    planned point has a pinned trial, the rows are interim estimates: no test, no verdict."""
    main, elsewhere = records, []
    if pinned is not None:
        main = [r for r in records if r.conditions == pinned]
        elsewhere = [r for r in records if r.conditions != pinned]
    rows = _rows(spec, main)
    base_row = next((r for r in rows if r.variant == BASE_VARIANT), None)
    interim = pinned is not None and len(main) < len(spec.grid())
    base = {r.seed: r for r in main if r.variant == BASE_VARIANT}
    tested: dict[str, VariantRow] = {}  # the rows a paired bootstrap tests
    for row in rows:
        row.interim = interim
        if base_row is None or row is base_row:
            continue
        row.comparable = base_row.conditions is not None and row.conditions == base_row.conditions
        _compare(row, base_row)
        if row.comparable and not interim:
            welch = seed_stats.welch_test(row.test_bleu, base_row.test_bleu)
            row.welch_p, row.no_test_reason = welch.p, welch.reason
            row.ppl_welch_p = seed_stats.welch_test(row.val_ppl, base_row.val_ppl).p
            row.permutation_p = seed_stats.permutation_test(row.test_bleu, base_row.test_bleu)
            tested[row.variant] = row
    sentence_p = pooled_p_values(
        base, {name: [r for r in main if r.variant == name] for name in tested}, references
    )
    for name, row in tested.items():
        row.p_value = sentence_p[name]
    # One family: every comparison the spec plans with the base, in the spec's order, then its
    # contrasts; one not made (not run, other conditions, no spread) stays in it as p = 1.
    holm_family(spec, rows)
    for row in rows:
        if row.compared and not interim:
            row.verdict = verdict(row.delta, row.holm_p, row.paper)
            if row.verdict == CANNOT_TELL and row.welch_p is not None:
                row.detectable = _detectable(row.test_bleu, base_row.test_bleu, row.holm_alpha)
        elif row.delta is not None and not row.comparable:
            row.verdict = CANNOT_TELL
    for row in _rows(spec, elsewhere):
        row.comparable = False
        if base_row is not None:
            _compare(row, base_row)
            row.verdict = CANNOT_TELL
        rows.append(row)
    return rows


def _detectable(scores: list[float], other: list[float], holm_alpha: float) -> float:
    """The difference Welch's test of these seed counts detects with seed_stats.POWER at the
    level the comparison's Holm step faced, at the two groups' seed spread."""
    spread = math.sqrt((statistics.variance(scores) + statistics.variance(other)) / 2)
    n = min(len(scores), len(other))
    return seed_stats.detectable_difference(spread, n, alpha=holm_alpha)


def family_size(spec: StudySpec) -> int:
    """The comparisons Holm's correction counts: every variant of the spec against the base,
    and the spec's contrasts."""
    return sum(name != BASE_VARIANT for name in spec.variants) + len(spec.contrasts)


def _rows(spec: StudySpec, records: list[TrialRecord]) -> list[VariantRow]:
    by_variant: dict[str, list[TrialRecord]] = {}
    for record in records:
        by_variant.setdefault(record.variant, []).append(record)
    rows = []
    for variant, overrides in spec.variants.items():
        group = sorted(by_variant.get(variant, []), key=lambda r: r.seed)
        if not group:
            continue
        conditions = {r.conditions for r in group}
        rows.append(
            VariantRow(
                variant=variant,
                factor=factor_text(overrides),
                parameters=group[0].train.get("num_parameters"),
                val_ppl=[r.train["last"]["val/ppl"] for r in group],
                val_bleu=[r.score(VAL_SPLIT) for r in group],
                test_bleu=[r.score(TEST_SPLIT) for r in group],
                test_half_widths=[
                    r.eval[TEST_SPLIT]["bleu_lc_ci"]
                    for r in group
                    if "bleu_lc_ci" in r.eval[TEST_SPLIT]
                ],
                seeds=[r.seed for r in group],
                ppl_per_token=all(r.run.get("loss_average") == LOSS_AVERAGE for r in group),
                paper=spec.paper.get(variant, {}),
                conditions=conditions.pop() if len(conditions) == 1 else None,
            )
        )
    return rows


def _compare(row: VariantRow, base_row: VariantRow) -> None:
    """The differences to the base and their intervals (estimates, whatever the conditions)."""
    row.delta = row.test_mean - base_row.test_mean
    row.ppl_delta = statistics.fmean(row.val_ppl) - statistics.fmean(base_row.val_ppl)
    if row.comparable:
        row.delta_interval = seed_stats.welch_interval(row.test_bleu, base_row.test_bleu)
        row.ppl_delta_interval = seed_stats.welch_interval(row.val_ppl, base_row.val_ppl)


def verdict(delta: float, holm_p: float | None, paper: dict[str, Any]) -> str:
    """The paper's BLEU finding against ours, at the study-wise level (`direction_verdict` of
    the BLEU difference against the paper's)."""
    if not paper:
        return direction_verdict(delta, holm_p, None)
    return direction_verdict(delta, holm_p, paper["bleu"], bool(paper.get("no_difference")))


def direction_verdict(
    delta: float, holm_p: float | None, paper_delta: float | None, paper_no_difference: bool = False
) -> str:
    """A difference against the paper's on the same measure: 'holds' only where the seed-level
    difference is significant after Holm and in the paper's direction; 'contradicts' where
    significant against it (or where the paper finds no difference); 'cannot tell' where not
    significant or not testable (no Holm p: a single seed on a side, or no spread on either; no
    test of equivalence is made, so the absence of a difference is never a finding); 'differs'
    where the paper has no such row."""
    significant = holm_p is not None and holm_p <= SIGNIFICANCE
    if not significant:
        return CANNOT_TELL
    if paper_delta is None:
        return DIFFERS
    if paper_no_difference or paper_delta == 0:
        return CONTRADICTS
    return HOLDS if (paper_delta > 0) == (delta > 0) else CONTRADICTS


def pooled_p_value(
    base: dict[int, TrialRecord], variant: list[TrialRecord], references: list[str]
) -> float | None:
    """sacreBLEU's paired bootstrap (1000 resamples, lowercased BLEU) of the variant against
    the base on test2016, the seeds both ran pooled: seed k's hypotheses of each system side by
    side over the test set repeated once per seed."""
    return pooled_p_values(base, {"variant": variant}, references)["variant"]


def pooled_p_values(
    base: dict[int, TrialRecord], variants: dict[str, list[TrialRecord]], references: list[str]
) -> dict[str, float | None]:
    """`pooled_p_value` of each variant; the variants that share the same seeds with the base
    are tested in one sacreBLEU test (the base's statistics computed once, each variant's p
    the same as alone)."""
    by_seeds: dict[tuple[int, ...], dict[str, dict[int, TrialRecord]]] = {}
    for name, records in variants.items():
        shared = {r.seed: r for r in records if r.seed in base}
        by_seeds.setdefault(tuple(sorted(shared)), {})[name] = shared
    p_values: dict[str, float | None] = {}
    for seeds, group in by_seeds.items():
        if not seeds:
            p_values.update(dict.fromkeys(group))
            continue
        baseline = [base[seed].hypotheses(TEST_SPLIT) for seed in seeds]
        systems = [[trials[seed].hypotheses(TEST_SPLIT) for seed in seeds]
                   for trials in group.values()]  # fmt: skip
        found = scoring.pooled_paired_bootstraps(baseline, systems, references, P_METRIC)
        p_values.update(zip(group, found))
    return p_values


@dataclass
class ContrastRow(Comparison):
    """Variant `variant` against variant `other`, a contrast the spec asks for: a verdict says
    only whether the two differ."""

    variant: str
    other: str
    # the two variants' rows where both ran (their seeds, for the findings)
    row: VariantRow | None = field(default=None, repr=False)
    other_row: VariantRow | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.variant} vs {self.other}"


def contrast_rows(spec: StudySpec, rows: list[VariantRow]) -> list[ContrastRow]:
    """The spec's contrasts, tested where both variants ran under one set of conditions (and
    every planned seed has finished: no test on interim estimates)."""
    by_variant: dict[str, VariantRow] = {}
    for row in rows:  # a pinned study's own rows first, those run elsewhere after them
        by_variant.setdefault(row.variant, row)
    contrasts = []
    for name, other_name in spec.contrasts:
        row, other = by_variant.get(name), by_variant.get(other_name)
        contrast = ContrastRow(name, other_name, row, other)
        if row is not None and other is not None:
            contrast.delta = row.test_mean - other.test_mean
            contrast.ppl_delta = statistics.fmean(row.val_ppl) - statistics.fmean(other.val_ppl)
            same = row.conditions is not None and row.conditions == other.conditions
            # interim: the interval is an estimate, the test waits for every planned seed
            contrast.interim = same and (row.interim or other.interim)
            if same:
                contrast.delta_interval = seed_stats.welch_interval(row.test_bleu, other.test_bleu)
            if same and not contrast.interim:
                welch = seed_stats.welch_test(row.test_bleu, other.test_bleu)
                contrast.welch_p, contrast.no_test_reason = welch.p, welch.reason
                contrast.ppl_welch_p = seed_stats.welch_test(row.val_ppl, other.val_ppl).p
                contrast.permutation_p = seed_stats.permutation_test(row.test_bleu, other.test_bleu)
            elif not same:
                contrast.no_test_reason = OTHER_CONDITIONS
        contrasts.append(contrast)
    return contrasts


def holm_family(spec: StudySpec, rows: list[VariantRow]) -> list[VariantRow | ContrastRow | None]:
    """Every comparison the spec plans, adjusted together by Holm's correction (BLEU and val PPL
    each a family of its own): each variant with the base in the spec's order (None where not
    made), then the spec's contrasts. Sets each member's Holm p and the level its Holm step
    faced; a contrast's verdict says only whether it differs, and where it cannot tell, what
    difference it could have detected."""
    by_variant = {r.variant: r for r in rows if r.compared}
    family: list[VariantRow | ContrastRow | None] = [
        by_variant.get(name) for name in spec.variants if name != BASE_VARIANT
    ]
    contrasts = contrast_rows(spec, rows)
    family += contrasts
    for measure, adjusted_name in (("welch_p", "holm_p"), ("ppl_welch_p", "ppl_holm_p")):
        adjusted = seed_stats.holm([getattr(r, measure) if r else None for r in family])
        for member, value in zip(family, adjusted):
            if member is not None:
                setattr(member, adjusted_name, value)
    levels = seed_stats.holm_step_alphas([m.welch_p if m else None for m in family])
    for member, level in zip(family, levels):
        if member is not None and member.welch_p is not None:
            member.holm_alpha = level
    for c in contrasts:
        if c.delta is not None and not c.interim:
            tested = c.welch_p is not None
            c.verdict = direction_verdict(c.delta, c.holm_p, None) if tested else CANNOT_TELL
            if tested and c.verdict == CANNOT_TELL:
                c.detectable = _detectable(c.row.test_bleu, c.other_row.test_bleu, c.holm_alpha)
    return family


def family_contrasts(spec: StudySpec, rows: list[VariantRow]) -> list[ContrastRow]:
    """The spec's contrasts as members of the one Holm family (adjusted, with their verdicts)."""
    return [member for member in holm_family(spec, rows) if isinstance(member, ContrastRow)]
