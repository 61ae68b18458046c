"""The report's generated sentences: one finding per variant, the summary grouped by verdict, the
A/A check on the base's seeds and the difference the study's seeds can detect."""

from __future__ import annotations

import statistics

from pipeline.evaluation import seed_stats
from pipeline.report.rows import (
    BASE_VARIANT,
    CANNOT_TELL,
    CONTRADICTS,
    DIFFERS,
    HOLDS,
    SIGNIFICANCE,
    VariantRow,
    direction_verdict,
)
from pipeline.report.tables import p_text, ppl_mark
from pipeline.sweep.spec import StudySpec


def _ppl_finding(r: VariantRow) -> str:
    """The val perplexity against the base's, beside the paper's, judged like BLEU: Welch's test
    over seeds, Holm-adjusted across the spec's comparisons on this measure."""
    if r.ppl_delta is None:
        return ""
    paper = r.paper.get("ppl")
    beside = "" if paper is None else f" vs the paper's {paper:+.2f}"
    measured = f"; val PPL {r.ppl_delta:+.2f}{ppl_mark(r)}{beside}"
    if r.ppl_welch_p is None:
        return f"{measured}: {CANNOT_TELL} (no seed-level test)"
    word = direction_verdict(r.ppl_delta, r.ppl_holm_p, paper)
    return f"{measured}: {word} (Welch p = {r.ppl_welch_p:.3f}, Holm p = {p_text(r.ppl_holm_p)})"


def _verdict_text(r: VariantRow) -> str:
    if r.verdict == CANNOT_TELL and r.no_test_reason:
        return f"{CANNOT_TELL} (no seed-level test: {r.no_test_reason})"
    no_difference = r.paper.get("no_difference")
    if r.verdict == CANNOT_TELL and no_difference:
        return (
            f'cannot tell (the paper finds "{no_difference}"; no difference detected here, '
            "which is not evidence of none)"
        )
    if r.verdict == CONTRADICTS and no_difference:
        return f'contradicts (the paper finds "{no_difference}")'
    return r.verdict or CANNOT_TELL


def findings(rows: list[VariantRow]) -> list[str]:
    """One sentence per variant with a base: the seed-level test's verdict on the paper's
    finding (Holm-adjusted), the permutation test and the sentence bootstrap beside it, and the
    perplexity beside the paper's; a variant run under other conditions than the base is named
    as not compared."""
    base = next((r for r in rows if r.variant == BASE_VARIANT), None)
    lines = []
    for r in rows:
        if r.delta is None or base is None:
            continue
        paper = f" vs the paper's {r.paper['bleu']:+.1f}" if r.paper else ""
        if r.interim and r.comparable:
            low, high = r.delta_interval
            interval = "" if low is None else f" [{low:+.2f}, {high:+.2f}]"
            lines.append(
                f"- {r.variant}: interim estimate {r.delta:+.2f}{interval} BLEU ({len(r.seeds)} vs "
                f"{len(base.seeds)} seeds){paper}: no test until every planned seed has finished."
            )
            continue
        if not r.comparable:
            lines.append(
                f"- {r.variant}: {r.delta:+.2f} BLEU{paper}: {CANNOT_TELL}, not compared: it ran "
                "under other run conditions than the base (the table of variants not compared "
                "shows where each ran)."
            )
            continue
        welch = (
            "no Welch test"
            if r.welch_p is None
            else f"Welch p = {r.welch_p:.3f}, Holm p = {r.holm_p:.3f}"
        )
        measured = (
            f"{r.delta:+.2f} BLEU ({len(r.seeds)} vs {len(base.seeds)} seeds; {welch}; exact "
            f"permutation p = {r.permutation_p:.3f}; sentence bootstrap p = {p_text(r.p_value)})"
        )
        no_row = "" if r.paper else "; the paper has no such row"
        lines.append(
            f"- {r.variant}: {measured}{paper}: {_verdict_text(r)}{no_row}{_ppl_finding(r)}."
        )
    return lines


def summary(rows: list[VariantRow]) -> str:
    """The findings in one sentence, grouped by verdict."""
    if any(r.interim for r in rows):
        return (
            "**In short**: the study is still running; its verdicts (Welch's test over seeds, "
            f"Holm at α = {SIGNIFICANCE}) come once every planned seed has finished."
        )
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r.delta is None:
            continue
        key = r.verdict if r.comparable else "not compared (other run conditions)"
        groups.setdefault(key, []).append(f"{r.variant} ({r.delta:+.2f})")
    order = [HOLDS, CONTRADICTS, DIFFERS, CANNOT_TELL, "not compared (other run conditions)"]
    parts = [f"{key}: {', '.join(groups[key])}" for key in order if key in groups]
    return (
        f"**In short** (test2016, Welch's test over seeds, Holm at α = {SIGNIFICANCE}): "
        + ("; ".join(parts) or "nothing compared yet")
        + "."
    )


def aa_check(rows: list[VariantRow]) -> str:
    """The A/A check on the base's own seeds: Welch's test applied to every split of them, each
    split judged at α alone (Holm's most lenient step: a Holm-corrected call is never more
    often 'different')."""
    base = next((r for r in rows if r.variant == BASE_VARIANT), None)
    if base is None or len(base.test_bleu) < 2:
        return "A/A check: needs two or more seeds of the base."
    results = seed_stats.aa_splits(base.test_bleu)
    tested = [r.p for r in results if r.p is not None]
    ways = "the one way" if len(results) == 1 else f"all {len(results)} ways"
    opening = (
        f"A/A check: the base's {len(base.test_bleu)} seeds (one config) split into two groups "
        f"in {ways}"
    )
    if not tested:
        return (
            f"{opening}: Welch's test makes no call ({results[0].reason}); the check needs "
            "four or more seeds of the base (two a side)."
        )
    rejected = sum(p <= SIGNIFICANCE for p in tested)
    reasons = sorted({r.reason for r in results if r.p is None})
    untested = (
        f" (the other {len(results) - len(tested)} give no p: {'; '.join(reasons)})"
        if reasons
        else ""
    )
    return (
        f"{opening}: Welch's test calls them different in {rejected} of the {len(tested)} "
        f"tested{untested} (false-positive rate {rejected / len(tested):.2f} at α = "
        f"{SIGNIFICANCE} before Holm's correction; smallest p {min(tested):.3f})."
    )


def power_statement(spec: StudySpec, rows: list[VariantRow]) -> str:
    """Are the study's seeds enough? The smallest difference Welch's test detects with
    seed_stats.POWER at the base's seed spread, per comparison and at Holm's strictest step;
    and the floor under the exact permutation column's p."""
    base = next((r for r in rows if r.variant == BASE_VARIANT), None)
    if base is None or len(base.test_bleu) < 2:
        return "Power: needs two or more seeds of the base (its seed-level spread)."
    sd = statistics.stdev(base.test_bleu)
    if sd == 0:  # identical scores: no spread to size a difference against
        return (
            f"Power: the base's {len(base.seeds)} seeds score the same test2016 BLEU "
            f"({base.test_bleu[0]:.2f}), so their seed-level spread gives no detectable difference."
        )
    comparisons = max(1, len(spec.variants) - 1)
    strictest = SIGNIFICANCE / comparisons
    counts = sorted({len(base.seeds), len(spec.seeds)})
    parts = []
    for n in counts:
        cells = []
        for alpha in (SIGNIFICANCE, strictest):
            d = seed_stats.detectable_difference(sd, n, alpha=alpha)
            cells.append(f"{d:.2f} BLEU ({d / sd:.2f} SD) at α = {alpha:.4f}")
        parts.append(f"with {n} seeds a side, " + " and ".join(cells))
    floors = ", ".join(f"{seed_stats.smallest_p(n, n):.4f} at {n}" for n in counts)
    return (
        f"Are {len(spec.seeds)} seeds enough? The base's seed-level SD on test2016 is "
        f"{sd:.2f} BLEU (from {len(base.seeds)} seeds). With {seed_stats.POWER:.0%} power, "
        "Welch's test detects, "
        + "; ".join(parts)
        + f". α = {strictest:.4f} is Holm's strictest step over the spec's {comparisons} "
        "comparisons, which a real difference must pass when the others are null. The exact "
        "permutation column (the same difference, no normal seed scores assumed) cannot fall "
        f"below p = {floors} seeds a side: it is shown, never the verdict."
    )
