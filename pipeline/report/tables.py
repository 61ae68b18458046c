"""The report's Markdown tables: the base and the variants compared with it, those run under other
conditions, the findings on each language pair, a search study's ranking, and the cells they
share (the PPL column's mark where a row's perplexity is a mean of batch means)."""

from __future__ import annotations

import statistics
from typing import Any

import optuna
from optuna.trial import TrialState

from pipeline.report.records import conditions_text
from pipeline.report.rows import BASE_VARIANT, CANNOT_TELL, HOLDS, Comparison, VariantRow
from pipeline.sweep.spec import StudySpec, point_config


def _mean_std(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def _mean_interval(row: VariantRow) -> str:
    low, high = row.test_interval
    if low is None:
        return f"{row.test_mean:.2f} (1 seed)"
    return f"{row.test_mean:.2f} [{low:.2f}, {high:.2f}]"


def p_text(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def paper_cell(paper: dict[str, Any]) -> str:
    if not paper:
        return "-"
    ppl = f" (PPL {paper['ppl']:+.2f})" if paper.get("ppl") is not None else ""
    return f"{paper['bleu']:+.1f}{ppl}, {paper['rows']}"


INTERIM = "interim: no test yet"  # the verdict cell of a study whose planned seeds run on


def delta_cell(delta: float | None, interval: tuple[float | None, float | None]) -> str:
    if delta is None:
        return "-"
    low, high = interval
    return f"{delta:+.2f}" + ("" if low is None else f" [{low:+.2f}, {high:+.2f}]")


def verdict_cell(row: Comparison) -> str:
    if row.interim and row.delta is not None:
        return INTERIM
    if row.verdict == CANNOT_TELL and row.detectable is not None:
        return f"{CANNOT_TELL} (detects {row.detectable:.2f})"
    return row.verdict or "-"


def _base_and_compared(rows: list[VariantRow]) -> list[VariantRow]:
    """The rows of the main tables: the base and the variants run under its conditions."""
    return [r for r in rows if r.delta is None or r.comparable]


def grid_table(rows: list[VariantRow]) -> str:
    """The base and the variants compared with it (same run conditions): test2016 BLEU, the
    difference to the base with its interval, the tests and the verdict."""
    lines = [
        "| variant | changed | parameters | val BLEU (lc) | test2016 BLEU (lc), mean [95% CI] | "
        "Δ test vs base [95% CI] | p (seeds, Welch) | p (Holm) | verdict | "
        "p (seeds, exact permutation) | p (sentences, paired bootstrap) | seeds | "
        "paper, Table 3: Δ BLEU (PPL) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in _base_and_compared(rows):
        params = f"{r.parameters / 1e6:.2f} M" if r.parameters else "-"
        lines.append(
            f"| {r.variant} | {r.factor} | {params} | {_mean_std(r.val_bleu)} | "
            f"{_mean_interval(r)} | {delta_cell(r.delta, r.delta_interval)} | "
            f"{p_text(r.welch_p)} | {p_text(r.holm_p)} | {verdict_cell(r)} | "
            f"{p_text(r.permutation_p)} | {p_text(r.p_value)} | "
            f"{', '.join(map(str, r.seeds))} | {paper_cell(r.paper)} |"
        )
    return "\n".join(lines)


def ppl_table(rows: list[VariantRow]) -> str:
    """Val perplexity of the same rows: its mean and interval over seeds, the difference to the
    base with its interval, Welch's test and Holm's correction over the same comparisons."""
    lines = [
        "| variant | val PPL, mean [95% CI] | Δ val PPL vs base [95% CI] | p (seeds, Welch) | "
        "p (Holm) | paper, Table 3: Δ PPL |",
        "|---|---|---|---|---|---|",
    ]
    for r in _base_and_compared(rows):
        low, high = r.ppl_interval
        mean = statistics.fmean(r.val_ppl)
        cell = f"{mean:.2f}" + ("" if low is None else f" [{low:.2f}, {high:.2f}]")
        paper = r.paper.get("ppl")
        lines.append(
            f"| {r.variant} | {cell}{ppl_mark(r)} | "
            f"{delta_cell(r.ppl_delta, r.ppl_delta_interval)} | {p_text(r.ppl_welch_p)} | "
            f"{p_text(r.ppl_holm_p)} | {'-' if paper is None else f'{paper:+.2f}'} |"
        )
    return "\n".join(lines)


def other_conditions_table(rows: list[VariantRow]) -> str:
    """Variants run under other conditions than the base: shown, never judged against it."""
    apart = [r for r in rows if r.delta is not None and not r.comparable]
    if not apart:
        return ""
    base = next(r for r in rows if r.variant == BASE_VARIANT)
    lines = [
        "Not compared with the base (first row): these variants ran under other conditions, so "
        "their difference to the base mixes the change with the commit, machine or precision, "
        "and no verdict is drawn from it.",
        "",
        "| variant | changed | test2016 BLEU (lc), mean [95% CI] | Δ test vs base (not a "
        "comparison) | seeds | ran at |",
        "|---|---|---|---|---|---|",
    ]
    for r in [base, *apart]:
        delta = "-" if r is base else f"{r.delta:+.2f}"
        lines.append(
            f"| {r.variant} | {r.factor} | {_mean_interval(r)} | {delta} | "
            f"{', '.join(map(str, r.seeds))} | {conditions_text(r.conditions)} |"
        )
    return "\n".join(lines)


BATCH_MEAN_MARK = " †"


def ppl_mark(row: VariantRow) -> str:
    return "" if row.ppl_per_token else BATCH_MEAN_MARK


def all_per_token(rows: list[VariantRow]) -> bool:
    return all(r.ppl_per_token for r in rows)


def ppl_note(rows: list[VariantRow]) -> str:
    """What the PPL column measures, and where a row's was logged as a mean of batch means."""
    note = "val PPL is the last checkpoint's perplexity per target subword"
    if all_per_token(rows):
        return note + "."
    return (
        f"{note}, except where marked{BATCH_MEAN_MARK}: logged by an earlier version as the mean "
        "of the val batches' means (a torchmetrics weighting), so such rows compare with each other (same "
        "val batches), not with perplexities per token."
    )


def pair_label(spec: StudySpec) -> str:
    data = point_config(spec, {"seed": spec.seeds[0]}).data
    return f"{data.src_lang}→{data.tgt_lang}"


def transfer_table(pairs: list[tuple[str, list[VariantRow]]]) -> str:
    """Per variant, the difference and verdict on each language pair, and where it holds."""
    variants: list[str] = []
    papers: dict[str, dict[str, Any]] = {}
    cells: dict[tuple[str, str], VariantRow] = {}
    for label, rows in pairs:
        for r in rows:
            if r.delta is None:
                continue
            if r.variant not in variants:
                variants.append(r.variant)
            papers.setdefault(r.variant, r.paper)
            cells[(label, r.variant)] = r
    labels = [label for label, _ in pairs]
    lines = [
        "| variant | paper Δ BLEU | "
        + " | ".join(f"{label}: Δ, verdict" for label in labels)
        + " | holds on |",
        "|---|---|" + "---|" * len(labels) + "---|",
    ]
    for variant in variants:
        row_cells, holds = [], []
        for label in labels:
            r = cells.get((label, variant))
            if r is None:
                row_cells.append("-")
                continue
            word = r.verdict if r.comparable else f"{CANNOT_TELL} (not compared)"
            row_cells.append(f"{r.delta:+.2f}, {word}")
            holds += [label] if r.verdict == HOLDS and r.comparable else []
        paper = f"{papers[variant]['bleu']:+.1f}" if papers[variant] else "-"
        lines.append(
            f"| {variant} | {paper} | "
            + " | ".join(row_cells)
            + f" | {', '.join(holds) or 'none'} |"
        )
    return "\n".join(lines)


def search_table(trials: list[optuna.trial.FrozenTrial]) -> str:
    done = sorted(
        (t for t in trials if t.state == TrialState.COMPLETE), key=lambda t: t.value, reverse=True
    )
    keys = sorted({k for t in done for k in t.params})
    lines = [
        "| trial | " + " | ".join(keys) + " | objective | test BLEU (lc) |",
        "|---" * (len(keys) + 3) + "|",
    ]
    for t in done:
        values = " | ".join(str(t.params.get(k)) for k in keys)
        test = t.user_attrs.get("test_bleu_lc")
        lines.append(
            f"| {t.number} | {values} | {t.value:.2f} | {'-' if test is None else f'{test:.2f}'} |"
        )
    return "\n".join(lines)
