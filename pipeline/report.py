"""Ablation report: `python -m pipeline.report <study> [--update-docs]`.

Made from the study's committed files alone (`ablations/results/<study>/`: the finished trials'
records `trials/<variant>-seed<seed>/`, the references, and `study.db` for the trial states), so
that anyone with a clone re-makes it exactly:
- `report.md`: a Table-3 shaped table, one row per variant that ran under the base's run
  conditions (commit, hardware class, precision): what changed, parameters, val perplexity, val
  BLEU (lc) as mean +- std over seeds, test2016 BLEU (lc) as the seed mean and its 95%
  t-interval, the difference to the base, Welch's t-test of that difference over seed-level
  BLEU (the unit is the training run) and its Holm-adjusted p across the study's comparisons,
  the verdict against the paper's direction (from that test only), the exact permutation test
  of the same difference (distribution-free) and sacreBLEU's paired bootstrap over test
  sentences as secondary columns, and the paper's own Table 3
  difference (the spec's `paper` entries); variants run under other conditions in a block of
  their own, never judged against the base; the A/A check on the base's seeds, the difference
  the study can detect at the base's seed spread, one finding per row and a summary, all
  written from the records; with `--transfer`, whether each finding holds on each language pair;
- charts (PNG): BLEU per variant (every seed a point, the t-interval over seeds), perplexity
  against BLEU for the label-smoothing rows, learning curves of val BLEU per variant;
- `--update-docs`: docs/ablation-results.md's block between `<!-- ablation:<study>:begin -->`
  and `<!-- ablation:<study>:end -->` gets the same table and findings, and README's block
  `ablation:<study>:summary`, where README has one, the table's main columns (a test checks
  that the committed pages equal this command's output);
- one W&B summary run in the study's group with the same table and charts (`--no-wandb` skips).
A search study's report is its trials ranked by the objective.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from pipeline import docs_blocks
from pipeline.cli import main
from pipeline.errors import PipelineError
from pipeline.evaluation import plots, scoring, seed_stats
from pipeline.sweep.records import RUN_FILE
from pipeline.sweep.spec import (
    RESULTS_ROOT,
    StudySpec,
    TrialPaths,
    load_spec,
    point_config,
    trial_config,
)
from pipeline.training.module import LOSS_AVERAGE

BASE_VARIANT = "base"
TEST_SPLIT = "test_2016_flickr"
VAL_SPLIT = "val"
P_METRIC = "bleu_lc"
SIGNIFICANCE = seed_stats.ALPHA
# Verdicts against the paper, from the seed-level test alone
HOLDS, CONTRADICTS, CANNOT_TELL, DIFFERS = "holds", "contradicts", "cannot tell", "differs"
CHARTS = {
    "bleu_per_variant": "bleu_per_variant.png",
    "ppl_vs_bleu": "ppl_vs_bleu.png",
    "learning_curves": "learning_curves.png",
}


@dataclass
class TrialRecord:
    """One finished trial, as `pipeline.sweep` records it."""

    folder: Path
    variant: str
    seed: int
    train: dict
    eval: dict
    curve: list[dict]
    run: dict

    def hypotheses(self, split: str) -> list[str]:
        return _read_lines(self.folder / f"{split}.hyp")

    def score(self, split: str, key: str = P_METRIC) -> float:
        return self.eval[split][key]

    @property
    def conditions(self) -> RunConditions:
        """What the trial ran on; every attempt's hardware class, so that a trial resumed on
        another machine matches neither."""
        classes = {hardware_class(a["hardware"]) for a in self.run.get("attempts", [])
                   if a.get("hardware")}  # fmt: skip
        classes.add(hardware_class(self.run.get("hardware") or "unknown hardware"))
        return RunConditions(
            commit=self.run.get("commit") or "unknown commit",
            hardware=" + ".join(sorted(classes)),
            precision=self.run.get("precision") or "unknown precision",
        )


@dataclass(frozen=True)
class RunConditions:
    """A study's trials compare only under one commit, hardware class and precision: the same
    config and seed moves by more than many of Table 3's effects between them."""

    commit: str
    hardware: str
    precision: str

    def __str__(self) -> str:
        return f"commit {self.commit}, {self.hardware}, {self.precision}"


def hardware_class(hardware: str) -> str:
    """The processor and its bf16 kernels, without the core or device count
    ('AMD EPYC, 2 cores, avx512_bf16' -> 'AMD EPYC, avx512_bf16'; 'NVIDIA H200 x 1' ->
    'NVIDIA H200')."""
    parts = [p for p in hardware.split(", ") if not re.fullmatch(r"\d+ cores?", p)]
    return re.sub(r" x \d+$", "", ", ".join(parts))


@dataclass
class VariantRow:
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
    delta: float | None = None
    # sacreBLEU's paired bootstrap over test sentences, seeds pooled (secondary)
    p_value: float | None = None
    # Welch's test over seed-level test BLEU (the verdict's), its Holm-adjusted p, and why
    # there is none where it cannot be made
    welch_p: float | None = None
    holm_p: float | None = None
    no_test_reason: str | None = None
    # the exact permutation test of the same difference (distribution-free, secondary)
    permutation_p: float | None = None
    verdict: str | None = None
    ppl_delta: float | None = None
    # every seed's val PPL on one side of every base seed's
    ppl_seeds_apart: bool = False

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
    def test_half_width(self) -> float | None:
        return statistics.fmean(self.test_half_widths) if self.test_half_widths else None


def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def load_records(study_dir: Path) -> list[TrialRecord]:
    """Every finished trial's record under `study_dir/trials/` (those with a run.json)."""
    records = []
    for folder in sorted((study_dir / "trials").glob("*")):
        if not (folder / RUN_FILE).exists():
            continue
        run = json.loads((folder / RUN_FILE).read_text())
        records.append(
            TrialRecord(
                folder=folder,
                variant=run["params"]["variant"],
                seed=int(run["params"]["seed"]),
                train=json.loads((folder / "train.json").read_text()),
                eval=json.loads((folder / "eval.json").read_text()),
                curve=json.loads((folder / "curve.json").read_text()),
                run=run,
            )
        )
    return records


def test_references(spec: StudySpec) -> list[str]:
    """The study's test2016 references, read from the corpus and normalised as `prepare`
    does (the corpus is never copied into the repository)."""
    from pipeline.data.corpus import clean_split, read_corpus

    data = point_config(spec, {"seed": spec.seeds[0]}).data
    return clean_split(read_corpus(data)[TEST_SPLIT], data)[0].tgt


def _factor(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items()) or "(base recipe)"


def variant_rows(
    spec: StudySpec, records: list[TrialRecord], references: list[str]
) -> list[VariantRow]:
    """One row per variant with finished trials, in the spec's order. A variant run under the
    base's conditions is compared with it by Welch's test over seeds (Holm-adjusted across all
    such comparisons; its verdict comes from that alone) and, secondarily, by the exact
    permutation test over seeds and a paired bootstrap over test sentences, the seeds both ran
    pooled. One run under other conditions (or the base itself under several) is not
    compared."""
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
                factor=_factor(overrides),
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
    base = {r.seed: r for r in by_variant.get(BASE_VARIANT, [])}
    base_row = next((r for r in rows if r.variant == BASE_VARIANT), None)
    for row in rows:
        if base_row is None or row is base_row:
            continue
        row.comparable = base_row.conditions is not None and row.conditions == base_row.conditions
        row.delta = row.test_mean - base_row.test_mean
        row.ppl_delta = statistics.fmean(row.val_ppl) - statistics.fmean(base_row.val_ppl)
        row.ppl_seeds_apart = min(row.val_ppl) > max(base_row.val_ppl) or max(row.val_ppl) < min(
            base_row.val_ppl
        )
        if row.comparable:
            welch = seed_stats.welch_test(row.test_bleu, base_row.test_bleu)
            row.welch_p, row.no_test_reason = welch.p, welch.reason
            row.permutation_p = seed_stats.permutation_test(row.test_bleu, base_row.test_bleu)
            row.p_value = pooled_p_value(base, by_variant[row.variant], references)
    compared = [r for r in rows if r.compared]
    for row, adjusted in zip(compared, seed_stats.holm([r.welch_p for r in compared])):
        row.holm_p = adjusted
        row.verdict = verdict(row.delta, adjusted, row.paper)
    for row in rows:
        if row.delta is not None and not row.comparable:
            row.verdict = CANNOT_TELL
    return rows


def verdict(delta: float, holm_p: float | None, paper: dict[str, Any]) -> str:
    """The paper's finding against ours, at the study-wise level: 'holds' only where the
    seed-level difference is significant after Holm and in the paper's direction;
    'contradicts' where significant against it (or where the paper finds no difference);
    'cannot tell' where not significant or not testable (no Holm p: a single seed on a side, or
    no spread on either; no test of equivalence is made, so the absence of a difference is
    never a finding); 'differs' where the paper has no such row."""
    significant = holm_p is not None and holm_p <= SIGNIFICANCE
    if not significant:
        return CANNOT_TELL
    if not paper:
        return DIFFERS
    if paper.get("no_difference") or paper["bleu"] == 0:
        return CONTRADICTS
    return HOLDS if (paper["bleu"] > 0) == (delta > 0) else CONTRADICTS


def pooled_p_value(
    base: dict[int, TrialRecord], variant: list[TrialRecord], references: list[str]
) -> float | None:
    """sacreBLEU's paired bootstrap (1000 resamples, lowercased BLEU) of the variant against
    the base on test2016, the seeds both ran pooled: seed k's hypotheses of each system side by
    side over the test set repeated once per seed."""
    pairs = [(base[r.seed], r) for r in variant if r.seed in base]
    if not pairs:
        return None
    translations = [(b.hypotheses(TEST_SPLIT), r.hypotheses(TEST_SPLIT)) for b, r in pairs]
    return scoring.pooled_paired_bootstrap(translations, references, P_METRIC)


def _mean_std(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{mean:.2f}"


def _mean_interval(row: VariantRow) -> str:
    low, high = row.test_interval
    if low is None:
        return f"{row.test_mean:.2f} (1 seed)"
    return f"{row.test_mean:.2f} [{low:.2f}, {high:.2f}]"


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _paper_cell(paper: dict[str, Any]) -> str:
    if not paper:
        return "-"
    ppl = f" (PPL {paper['ppl']:+.2f})" if paper.get("ppl") is not None else ""
    return f"{paper['bleu']:+.1f}{ppl}, {paper['rows']}"


def grid_table(rows: list[VariantRow]) -> str:
    """The base and the variants compared with it (same run conditions)."""
    lines = [
        "| variant | changed | parameters | val PPL | val BLEU (lc) | "
        "test2016 BLEU (lc), mean [95% CI] | Δ test vs base | p (seeds, Welch) | "
        "p (Holm) | verdict | p (seeds, exact permutation) | p (sentences, paired bootstrap) | "
        "seeds | paper, Table 3: Δ BLEU (PPL) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.delta is not None and not r.comparable:
            continue
        params = f"{r.parameters / 1e6:.2f} M" if r.parameters else "-"
        delta = "-" if r.delta is None else f"{r.delta:+.2f}"
        lines.append(
            f"| {r.variant} | {r.factor} | {params} | {_mean_std(r.val_ppl)}{_ppl_mark(r)} | "
            f"{_mean_std(r.val_bleu)} | {_mean_interval(r)} | {delta} | {_p(r.welch_p)} | "
            f"{_p(r.holm_p)} | {r.verdict or '-'} | {_p(r.permutation_p)} | {_p(r.p_value)} | "
            f"{', '.join(map(str, r.seeds))} | {_paper_cell(r.paper)} |"
        )
    return "\n".join(lines)


def _conditions_text(conditions: RunConditions | None) -> str:
    return str(conditions) if conditions else "mixed run conditions (its seeds differ)"


def other_conditions_table(rows: list[VariantRow]) -> str:
    """Variants run under other conditions than the base: shown, never judged against it."""
    apart = [r for r in rows if r.delta is not None and not r.comparable]
    if not apart:
        return ""
    base = next(r for r in rows if r.variant == BASE_VARIANT)
    lines = [
        f"Not compared with the base, which ran at {_conditions_text(base.conditions)}: these "
        "variants ran under other conditions, so their difference to the base mixes the change "
        "with the commit, machine or precision, and no verdict is drawn from it.",
        "",
        "| variant | changed | test2016 BLEU (lc), mean [95% CI] | Δ test vs base (not a "
        "comparison) | seeds | ran at |",
        "|---|---|---|---|---|---|",
    ]
    for r in apart:
        lines.append(
            f"| {r.variant} | {r.factor} | {_mean_interval(r)} | {r.delta:+.2f} | "
            f"{', '.join(map(str, r.seeds))} | {_conditions_text(r.conditions)} |"
        )
    return "\n".join(lines)


BATCH_MEAN_MARK = " †"


def _ppl_mark(row: VariantRow) -> str:
    return "" if row.ppl_per_token else BATCH_MEAN_MARK


def _all_per_token(rows: list[VariantRow]) -> bool:
    return all(r.ppl_per_token for r in rows)


def ppl_note(rows: list[VariantRow]) -> str:
    """What the PPL column measures, and where a row's was logged as a mean of batch means."""
    note = "val PPL is the last checkpoint's perplexity per target subword"
    if _all_per_token(rows):
        return note + "."
    return (
        f"{note}, except where marked{BATCH_MEAN_MARK}: logged by an earlier version as the mean "
        "of the val batches' means (a torchmetrics weighting), so such rows compare with each other (same "
        "val batches), not with perplexities per token."
    )


def _ppl_finding(r: VariantRow) -> str:
    """The val perplexity against the base's, beside the paper's; no test: 'apart' when every
    seed of the variant is on one side of every seed of the base."""
    if r.ppl_delta is None or r.paper.get("ppl") is None:
        return ""
    paper = r.paper["ppl"]
    if not r.ppl_seeds_apart:
        verdict = "seeds overlap"
    elif paper == 0:
        verdict = "seeds apart, where the paper's is unchanged"
    elif (paper > 0) != (r.ppl_delta > 0):
        verdict = "seeds apart, against the paper's direction"
    else:
        verdict = "seeds apart, in the paper's direction"
    return f"; val PPL {r.ppl_delta:+.2f}{_ppl_mark(r)} vs the paper's {paper:+.2f}: {verdict}"


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
        if not r.comparable:
            lines.append(
                f"- {r.variant}: {r.delta:+.2f} BLEU{paper}: {CANNOT_TELL}, not compared: the "
                f"variant ran at {_conditions_text(r.conditions)}, the base at "
                f"{_conditions_text(base.conditions)}."
            )
            continue
        welch = (
            "no Welch test"
            if r.welch_p is None
            else f"Welch p = {r.welch_p:.3f}, Holm p = {r.holm_p:.3f}"
        )
        measured = (
            f"{r.delta:+.2f} BLEU ({len(r.seeds)} vs {len(base.seeds)} seeds; {welch}; exact "
            f"permutation p = {r.permutation_p:.3f}; sentence bootstrap p = {_p(r.p_value)})"
        )
        no_row = "" if r.paper else "; the paper has no such row"
        lines.append(
            f"- {r.variant}: {measured}{paper}: {_verdict_text(r)}{no_row}{_ppl_finding(r)}."
        )
    return lines


def summary(rows: list[VariantRow]) -> str:
    """The findings in one sentence, grouped by verdict."""
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


# --------------------------------------------------------------------------- charts


def _half_width(row: VariantRow) -> float | None:
    low, high = row.test_interval
    return None if low is None else (high - low) / 2


def charts(
    spec: StudySpec, rows: list[VariantRow], records: list[TrialRecord], out: Path
) -> dict[str, Path]:
    made: dict[str, Path] = {}
    if not rows:
        return made
    base = next((r.test_mean for r in rows if r.variant == BASE_VARIANT), None)
    made["bleu_per_variant"] = plots.save_png(
        plots.seed_points_figure(
            [r.variant for r in rows],
            [r.test_bleu for r in rows],
            [_half_width(r) for r in rows],
            ylabel="test2016 BLEU (lc): seeds, mean, 95% t-interval",
            title=f"{spec.study}: one factor at a time",
            baseline=base,
        ),
        out / CHARTS["bleu_per_variant"],
    )
    smoothing = {
        r.variant: list(zip(r.val_ppl, r.val_bleu))
        for r in rows
        if r.variant == BASE_VARIANT or "train.label_smoothing" in spec.variants[r.variant]
    }
    if len(smoothing) > 1:
        made["ppl_vs_bleu"] = plots.save_png(
            plots.labelled_scatter_figure(
                smoothing,
                xlabel="val perplexity, last checkpoint"
                + (
                    ", per target subword"
                    if _all_per_token(rows)
                    else f" ({BATCH_MEAN_MARK.strip()}: mean of val batch means)"
                ),
                ylabel="val BLEU (lc), averaged checkpoints, beam",
                title="label smoothing: val perplexity against BLEU (paper 5.4)",
            ),
            out / CHARTS["ppl_vs_bleu"],
        )
    curves = {}
    for row in rows:
        runs = [r.curve for r in records if r.variant == row.variant]
        steps = sorted(set.intersection(*({p["step"] for p in c if "val/bleu" in p} for c in runs)))
        if steps:
            by_step = [{p["step"]: p["val/bleu"] for p in c if "val/bleu" in p} for c in runs]
            curves[row.variant] = (steps, [statistics.fmean(c[s] for c in by_step) for s in steps])
    if curves:
        made["learning_curves"] = plots.save_png(
            plots.curves_figure(
                curves, xlabel="update", ylabel="val BLEU (greedy, mean over seeds)",
                title=f"{spec.study}: validation BLEU during training",
            ),
            out / CHARTS["learning_curves"],
        )  # fmt: skip
    return made


# --------------------------------------------------------------------------- the report


def markdown(
    spec: StudySpec,
    study_dir: Path,
    image_prefix: str = "",
    with_states: bool = True,
    transfer: tuple[StudySpec, ...] = (),
) -> str:
    """The report's Markdown (table, states, findings, charts), from the committed files; with
    `transfer`, the same grid's studies on other language pairs beside this one."""
    records = load_records(study_dir)
    rows = variant_rows(spec, records, test_references(spec))
    states = trial_states(spec, study_dir) if with_states else ""
    apart = other_conditions_table(rows)
    lines = [
        f"Study `{spec.study}`: {len(records)} of {len(spec.grid())} trials finished"
        + (f" ({states})" if states else "")
        + f"; budget {_factor(spec.budget)}.",
        "",
        grid_table(rows),
        "",
        *([apart, ""] if apart else []),
        "BLEU (lc) is sacreBLEU's lowercased BLEU of the averaged checkpoints' beam search; "
        f"{ppl_note(rows)} The test2016 interval is the 95% t-interval of the mean over seeds. "
        "The verdict comes only from Welch's t-test of the difference of seed means (the unit is "
        "the training run; each group its own variance), with Holm's correction across the "
        "comparisons shown (p (Holm)): 'holds' is a difference significant at α = "
        f"{SIGNIFICANCE} in the paper's direction, 'contradicts' one against it, "
        "'differs' one where the paper has no row, 'cannot tell' no significant difference "
        "(or no test: a single seed on a side, or no spread on either). "
        "p (seeds, exact permutation) tests the same difference over every relabelling of the "
        "runs, without assuming normal seed scores; it decides nothing. "
        "Only variants run at the base's commit, hardware class and precision are compared. "
        "p (sentences) is sacreBLEU's paired bootstrap (1000 resamples) on test2016, the seeds "
        "both ran pooled: it sees the test set's sampling, not the seeds', and decides nothing. "
        "The paper's column is its own Table 3 difference for the same change (newstest2013, "
        "base model, 100k steps).",
        "",
        aa_check(rows),
        "",
        power_statement(spec, rows),
        "",
        *(findings(rows) or ["- no variant has been compared with the base yet."]),
        "",
        summary(rows),
        "",
    ]
    if transfer:
        pairs = [(pair_label(spec), rows)]
        for other in transfer:
            other_dir = study_dir.parent / other.study
            other_rows = variant_rows(other, load_records(other_dir), test_references(other))
            pairs.append((pair_label(other), other_rows))
        lines += [
            "Does it transfer? The same grid on each language pair (studies "
            + ", ".join(f"`{s.study}`" for s in (spec, *transfer))
            + "), verdicts as above:",
            "",
            transfer_table(pairs),
            "",
        ]
    lines += [
        f"![{name}]({image_prefix}{CHARTS[name]})"
        for name in CHARTS
        if (study_dir / CHARTS[name]).exists()
    ]
    return "\n".join(lines) + "\n"


def trial_states(spec: StudySpec, study_dir: Path) -> str:
    database = study_dir / "study.db"
    if not database.exists():
        return ""
    study = optuna.load_study(study_name=spec.study, storage=f"sqlite:///{database.resolve()}")
    counts = {s.name.lower(): 0 for s in TrialState}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) + " in study.db"


def write_report(
    spec: StudySpec,
    study_dir: Path,
    log_to_wandb: bool = True,
    transfer: tuple[StudySpec, ...] = (),
) -> Path:
    if spec.kind == "search":
        return _write_search_report(spec, study_dir)
    records = load_records(study_dir)
    if not records:
        raise PipelineError(
            f"{study_dir}: no finished trials of study '{spec.study}' yet: run the sweep first"
        )
    rows = variant_rows(spec, records, test_references(spec))
    figures = charts(spec, rows, records, study_dir)
    report = study_dir / "report.md"
    report.write_text(
        f"# Ablation study `{spec.study}`\n\n" + markdown(spec, study_dir, transfer=transfer)
    )
    if log_to_wandb:
        _log_summary(spec, study_dir, rows, figures)
    return report


def _write_search_report(spec: StudySpec, study_dir: Path) -> Path:
    storage = f"sqlite:///{(study_dir / 'study.db').resolve()}"
    trials = optuna.load_study(study_name=spec.study, storage=storage).get_trials()
    if not trials:
        raise PipelineError(f"study '{spec.study}' has no trials yet: run the sweep first")
    report = study_dir / "report.md"
    report.write_text(f"# Search `{spec.study}`\n\n{search_table(trials)}\n")
    return report


PAGE = docs_blocks.DOCS / "ablation-results.md"
# README's summary of a study: these columns of the page's table
SUMMARY_COLUMNS = ["variant", "changed", "test2016 BLEU (lc), mean [95% CI]", "Δ test vs base",
                   "p (Holm)", "verdict", "paper, Table 3: Δ BLEU (PPL)"]  # fmt: skip


def block_name(study: str) -> str:
    return f"ablation:{study}"


def docs_block(
    spec: StudySpec,
    study_dir: Path,
    page: Path,
    transfer: tuple[StudySpec, ...] = (),
) -> str:
    """The generated text between the page's markers for this study (charts linked from it)."""
    # Without the storage's trial states, which change while workers run.
    prefix = docs_blocks.link_prefix(study_dir, page)
    return markdown(spec, study_dir, image_prefix=prefix, with_states=False, transfer=transfer)


def summary_block(spec: StudySpec, study_dir: Path, page: Path) -> str:
    """README's short view of the study: the main columns of the page's table."""
    return docs_blocks.columns(docs_block(spec, study_dir, page), SUMMARY_COLUMNS)


def update_docs(
    spec: StudySpec,
    study_dir: Path,
    root: Path,
    transfer: tuple[StudySpec, ...] = (),
) -> None:
    """The study's block in `root`/docs/ablation-results.md, and its summary in `root`/README.md
    where README has a block for it."""
    page = root / PAGE
    docs_blocks.fill(page, block_name(spec.study), docs_block(spec, study_dir, page, transfer))
    readme, summary = root / docs_blocks.README, f"{block_name(spec.study)}:summary"
    if docs_blocks.markers(summary)[0] in readme.read_text(encoding="utf-8"):
        docs_blocks.fill(readme, summary, summary_block(spec, study_dir, page))


def _log_summary(
    spec: StudySpec, study_dir: Path, rows: list[VariantRow], figures: dict[str, Path]
) -> None:
    import wandb

    from pipeline.tracking import start_wandb_run

    paths = TrialPaths(work=study_dir / "summary", record=study_dir / "trials" / "summary")
    cfg = trial_config(spec, {}, paths)
    run = start_wandb_run(cfg, job_type="report", name=f"{spec.study}-report", group=spec.study)
    try:
        columns = ["variant", "changed", "val_ppl", "val_bleu_lc", "test_bleu_lc", "delta",
                   "p_welch", "p_holm", "verdict", "p_permutation", "p_sentences",
                   "run_conditions"]  # fmt: skip
        table = wandb.Table(columns=columns)
        for r in rows:
            table.add_data(r.variant, r.factor, statistics.fmean(r.val_ppl),
                           statistics.fmean(r.val_bleu), r.test_mean, r.delta, r.welch_p,
                           r.holm_p, r.verdict, r.permutation_p, r.p_value,
                           _conditions_text(r.conditions))  # fmt: skip
        run.log({"ablation_table": table, **{n: wandb.Image(str(p)) for n, p in figures.items()}})
    finally:
        run.finish()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "study", help="study name (its spec is ablations/<study>.yaml) or a spec path"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_ROOT)
    docs_blocks.add_update_argument(parser, f"{PAGE} (and README.md's summary)")
    parser.add_argument("--no-wandb", action="store_true", help="do not log the W&B summary run")
    parser.add_argument(
        "--transfer",
        action="append",
        default=[],
        metavar="STUDY",
        help="a study of the same grid on another language pair (name or spec path; repeatable):"
        " the report shows whether each finding holds on each pair",
    )
    return parser.parse_args(argv)


def _spec(study: str) -> StudySpec:
    """A study's spec from its name (ablations/<study>.yaml) or a spec path."""
    path = Path(study)
    if path.suffix not in (".yaml", ".yml"):
        path = Path("ablations") / f"{study}.yaml"
    return load_spec(path)


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    spec = _spec(args.study)
    transfer = tuple(_spec(name) for name in args.transfer)
    study_dir = args.results_dir / spec.study
    for other in transfer:
        if not load_records(args.results_dir / other.study):
            raise PipelineError(
                f"--transfer {other.study}: no finished trials in "
                f"{args.results_dir / other.study}: run its sweep first"
            )
    report = write_report(spec, study_dir, log_to_wandb=not args.no_wandb, transfer=transfer)
    if args.update_docs:
        update_docs(spec, study_dir, args.update_docs, transfer=transfer)
    print(report.read_text(encoding="utf-8"))


def console() -> None:
    """The `transformer-report` command (pyproject.toml)."""
    main(cli)


if __name__ == "__main__":
    console()
