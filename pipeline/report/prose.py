"""The report's generated sentences: one finding per variant, the summary grouped by verdict, the
A/A check on the base's seeds and the difference the study's seeds can detect."""

from __future__ import annotations

import statistics

from pipeline.evaluation import seed_stats
from pipeline.report.paper import WriteUp, setting, unlike_paper, write_ups
from pipeline.report.rows import (
    BASE_VARIANT,
    CANNOT_TELL,
    CONTRADICTS,
    DIFFERS,
    HOLDS,
    OTHER_CONDITIONS,
    SIGNIFICANCE,
    Comparison,
    VariantRow,
    direction_verdict,
    family_contrasts,
    family_size,
)
from pipeline.report.tables import p_text, ppl_mark
from pipeline.sweep.spec import StudySpec, point_config


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


def detectable_text(r: Comparison) -> str:
    """What a 'cannot tell' could have told: the difference detectable at its Holm step."""
    if r.detectable is None:
        return ""
    return (
        f"at these seeds' spread Welch's test detects {r.detectable:.2f} BLEU with "
        f"{seed_stats.POWER:.0%} power at its Holm step, α = {r.holm_alpha:.4f}"
    )


def _verdict_text(r: VariantRow) -> str:
    if r.verdict == CANNOT_TELL and r.no_test_reason:
        return f"{CANNOT_TELL} (no seed-level test: {r.no_test_reason})"
    no_difference = r.paper.get("no_difference")
    detectable = detectable_text(r)
    if r.verdict == CANNOT_TELL and no_difference:
        return (
            f'cannot tell (the paper finds "{no_difference}"; no difference detected here, '
            f"which is not evidence of none{'; ' + detectable if detectable else ''})"
        )
    if r.verdict == CANNOT_TELL and detectable:
        return f"{CANNOT_TELL} ({detectable})"
    if r.verdict == CONTRADICTS and no_difference:
        return f'contradicts (the paper finds "{no_difference}")'
    return r.verdict or CANNOT_TELL


def _unlike_text(spec: StudySpec | None, variant: str) -> str:
    note = unlike_paper(spec, variant) if spec is not None else None
    return f" (not the same change: {note})" if note else ""


def findings(rows: list[VariantRow], spec: StudySpec | None = None) -> list[str]:
    """One sentence per variant with a base: the seed-level test's verdict on the paper's
    finding (Holm-adjusted), the permutation test and the sentence bootstrap beside it, and the
    perplexity beside the paper's; a variant run under other conditions than the base is named
    as not compared. With the spec, where the paper's row is not the same change, how."""
    base = next((r for r in rows if r.variant == BASE_VARIANT), None)
    lines = []
    for r in rows:
        if r.delta is None or base is None:
            continue
        paper = (f" vs the paper's {r.paper['bleu']:+.1f}{_unlike_text(spec, r.variant)}"
                 if r.paper else "")  # fmt: skip
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


NOT_COMPARED = "not compared (other run conditions)"  # the summary's group of those not compared


def summary(rows: list[VariantRow], spec: StudySpec | None = None) -> str:
    """The findings in one sentence, grouped by verdict; with the spec, a verdict on the
    paper's row for a change that is not the paper's says so (the findings say how), and the
    spec's contrasts join the groups of their verdicts."""
    if any(r.interim for r in rows):
        return (
            "**In short**: the study is still running; its verdicts (Welch's test over seeds, "
            f"Holm at α = {SIGNIFICANCE}) come once every planned seed has finished."
        )
    groups: dict[str, list[str]] = {}
    for r in rows:
        if r.delta is None:
            continue
        key = r.verdict if r.comparable else NOT_COMPARED
        unlike = key in (HOLDS, CONTRADICTS) and spec is not None and unlike_paper(spec, r.variant)
        note = ", not the paper's change" if unlike else ""
        groups.setdefault(key, []).append(f"{r.variant} ({r.delta:+.2f}{note})")
    for c in family_contrasts(spec, rows) if spec is not None else []:
        if c.verdict is not None:
            key = NOT_COMPARED if c.no_test_reason == OTHER_CONDITIONS else c.verdict
            groups.setdefault(key, []).append(f"{c.label} ({c.delta:+.2f})")
    order = [HOLDS, CONTRADICTS, DIFFERS, CANNOT_TELL, NOT_COMPARED]
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
    comparisons = max(1, family_size(spec))
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


def _interval_text(low: float | None, high: float | None) -> str:
    return "" if low is None else f" [{low:+.2f}, {high:+.2f}]"


def differences_paragraph(spec: StudySpec, rows: list[VariantRow]) -> str:
    """The findings in prose once the study is complete: what differs from the base on test2016
    BLEU and in which direction, each against the paper's own row (naming what is not the same
    change), then what the seeds cannot tell, each with the difference they would detect."""
    if any(r.interim for r in rows) or not any(r.compared for r in rows):
        return ""
    differ, unclear, apart = [], [], []
    for r in rows:
        if r.delta is None:
            continue
        if not r.comparable:
            apart.append(f"{r.variant} ({r.delta:+.2f})")
            continue
        if r.verdict == CANNOT_TELL:
            beside = (f"detectable {r.detectable:.2f}" if r.detectable is not None
                      else "no seed-level test")  # fmt: skip
            unclear.append(f"{r.variant} ({r.delta:+.2f}; {beside})")
            continue
        way = "raises" if r.delta > 0 else "lowers"
        text = f"{r.variant} {way} it, {r.delta:+.2f}{_interval_text(*r.delta_interval)}"
        if r.paper:
            same = (r.paper["bleu"] > 0) == (r.delta > 0) and r.paper["bleu"] != 0
            text += (
                f" (the paper's row {r.paper['rows']}: {r.paper['bleu']:+.1f}, "
                f"{'the same direction' if same else 'not the same direction'}"
            )
            note = unlike_paper(spec, r.variant)
            text += f"; not the same change: {note})" if note else ")"
        else:
            text += " (the paper has no such row)"
        differ.append(text)
    opening = (
        f"**What differs from the base** (test2016 BLEU (lc), the difference of seed means and "
        f"its 95% interval; Welch's test over seeds, Holm over the spec's {family_size(spec)} "
        f"comparisons at α = {SIGNIFICANCE}): "
    )
    parts = ["; ".join(differ) if differ else "no variant differs detectably"]
    if unclear:
        parts.append(
            "Cannot tell for " + ", ".join(unclear) + f" (the difference Welch's test detects "
            f"with {seed_stats.POWER:.0%} power at each one's Holm step, at its seeds' spread)"
        )
    if apart:
        parts.append("Not compared (other run conditions): " + ", ".join(apart))
    return opening + ". ".join(parts) + "."


# how a write-up's perplexity word reads as the sign of the difference (higher is worse)
PPL_WORDS = {"worse": 1, "better": -1}


def _place(value: float, low: float | None, high: float | None) -> str:
    if low is None:
        return "beside our single estimate"
    return "above" if value > high else "below" if value < low else "inside"


def write_up_paragraph(spec: StudySpec, rows: list[VariantRow]) -> str:
    """Each write-up of literature.yaml whose change the complete study made (a variant and the
    base at its two values), against our runs: val and test2016 BLEU and val PPL, each the
    difference of seed means with its 95% interval, and whether our runs show the write-up's
    gain and its perplexity's direction."""
    base = next((r for r in rows if r.variant == BASE_VARIANT), None)
    if base is None or any(r.interim for r in rows):
        return ""
    ours = point_config(spec, {})
    paragraphs = []
    for w in write_ups():
        for r in rows:
            if not r.compared or list(spec.variants[r.variant]) != [w.key]:
                continue
            pair = (setting(ours, w.key), spec.variants[r.variant][w.key])
            if pair not in (w.change, w.change[::-1]):
                continue
            paragraphs.append(_write_up_text(w, r, base, pair == w.change))
    return "\n\n".join(paragraphs)


def _signed(sign: int, delta: float, interval: tuple[float | None, float | None]):
    low, high = interval
    if low is None:
        return sign * delta, None, None
    return sign * delta, min(sign * low, sign * high), max(sign * low, sign * high)


def _write_up_text(w: WriteUp, r: VariantRow, base: VariantRow, base_is_from: bool) -> str:
    """`base_is_from`: the base has the change's first value, the variant its second."""
    sign = 1 if base_is_from else -1  # the change's effect: to minus from
    to, frm = (r, base) if base_is_from else (base, r)
    val = statistics.fmean(to.val_bleu) - statistics.fmean(frm.val_bleu)
    val_low, val_high = seed_stats.welch_interval(to.val_bleu, frm.val_bleu)
    test = _signed(sign, r.delta, r.delta_interval)
    ppl = _signed(sign, r.ppl_delta, r.ppl_delta_interval)
    c0, c1 = w.change
    measured = (
        f"Here {w.key} {c1} against {c0} ({to.variant} against {frm.variant}) "
        f"gives val BLEU {val:+.2f}{_interval_text(val_low, val_high)}, test2016 "
        f"{test[0]:+.2f}{_interval_text(*test[1:])} and val PPL "
        f"{ppl[0]:+.2f}{_interval_text(*ppl[1:])}{ppl_mark(r)}"
    )
    places = {_place(w.val_bleu, val_low, val_high), _place(w.test_bleu, *test[1:])}
    gain = (
        "our runs do not show a gain of that size"
        if places == {"above"}
        else "our runs show more than that"
        if places == {"below"}
        else "our intervals do not rule that size out"
    )
    placed = (
        f"the write-up's {w.val_bleu:+.1f} lies {_place(w.val_bleu, val_low, val_high)} our val "
        f"interval and its {w.test_bleu:+.1f} {_place(w.test_bleu, *test[1:])} our test2016 "
        f"interval: {gain}"
    )
    direction = PPL_WORDS[w.ppl]
    if r.ppl_holm_p is not None and r.ppl_holm_p <= SIGNIFICANCE:
        higher = ppl[0] > 0
        agrees = (1 if higher else -1) == direction
        perplexity = (
            f"val PPL is {'higher' if higher else 'lower'} with {w.key} {c1} (Welch over seeds, "
            f"Holm p = {r.ppl_holm_p:.3f}): {'the' if agrees else 'not the'} write-up's "
            f"{w.ppl} perplexity"
        )
    else:
        held = "-" if r.ppl_holm_p is None else f"{r.ppl_holm_p:.3f}"
        perplexity = (
            f"whether val PPL is {w.ppl} with {w.key} {c1}, the seeds cannot tell (Holm p = {held})"
        )
    return (
        f"**Beside another write-up**: {w.source} finds {w.key} {c1} against {c0} "
        f"{w.val_bleu:+.1f} val and {w.test_bleu:+.1f} test BLEU, with {w.ppl} perplexity. "
        f"{measured}; {placed}; {perplexity}."
    )
