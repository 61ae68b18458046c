"""The report's charts (PNG): BLEU per variant (every seed a point, the t-interval over seeds),
perplexity against BLEU for the label-smoothing rows, learning curves of val BLEU per variant,
and where variants set the heads' width apart from their count, the heads x width grid."""

from __future__ import annotations

import statistics
from pathlib import Path

from pipeline.evaluation import plots
from pipeline.metric_names import GREEDY_VAL_BLEU
from pipeline.report.contrasts import heads_width_grid
from pipeline.report.records import TrialRecord
from pipeline.report.rows import BASE_VARIANT, VariantRow
from pipeline.report.tables import BATCH_MEAN_MARK, all_per_token, verdict_cell
from pipeline.sweep.spec import StudySpec

CHARTS = {
    "bleu_per_variant": "bleu_per_variant.png",
    "ppl_vs_bleu": "ppl_vs_bleu.png",
    "learning_curves": "learning_curves.png",
    "heads_width": "heads_width.png",
}


def _half_width(row: VariantRow) -> float | None:
    low, high = row.test_interval
    return None if low is None else (high - low) / 2


def _verdict_note(row: VariantRow) -> str:
    """What the chart writes under a variant: its verdict (the table's cell), short."""
    if row.variant == BASE_VARIANT:
        return "(base)"
    if row.delta is not None and not row.comparable:
        return "not compared"
    return "interim" if row.interim else verdict_cell(row)


def study_state(spec: StudySpec, rows: list[VariantRow]) -> str:
    """', interim, k of n' in a chart's title while the study's planned trials run on."""
    if not any(r.interim for r in rows):
        return ""
    done = sum(len(r.seeds) for r in rows if r.delta is None or r.comparable)
    return f", interim, {done} of {len(spec.grid())}"


def charts(
    spec: StudySpec, rows: list[VariantRow], records: list[TrialRecord], out: Path
) -> dict[str, Path]:
    made: dict[str, Path] = {}
    if not rows:
        return made
    state = study_state(spec, rows)
    base = next((r.test_mean for r in rows if r.variant == BASE_VARIANT), None)
    made["bleu_per_variant"] = plots.save_png(
        plots.seed_points_figure(
            [r.variant for r in rows],
            [r.test_bleu for r in rows],
            [_half_width(r) for r in rows],
            ylabel="test2016 BLEU (lc): seeds, mean and 95% t-interval",
            title=f"{spec.study}: one factor at a time{state}",
            baseline=base,
            notes=[_verdict_note(r) for r in rows],
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
                    if all_per_token(rows)
                    else f" ({BATCH_MEAN_MARK.strip()}: mean of val batch means)"
                ),
                ylabel="val BLEU (lc), averaged checkpoints, beam",
                title=f"label smoothing: val perplexity against BLEU (paper 5.4){state}",
            ),
            out / CHARTS["ppl_vs_bleu"],
        )
    curves = {}
    for row in rows:
        runs = [r.curve for r in records if r.variant == row.variant]
        steps = sorted(
            set.intersection(*({p["step"] for p in c if GREEDY_VAL_BLEU in p} for c in runs))
        )
        if steps:
            by_step = [
                {p["step"]: p[GREEDY_VAL_BLEU] for p in c if GREEDY_VAL_BLEU in p} for c in runs
            ]
            curves[row.variant] = (steps, [statistics.fmean(c[s] for c in by_step) for s in steps])
    if curves:
        made["learning_curves"] = plots.save_png(
            plots.curves_figure(
                curves, xlabel="update", ylabel="val BLEU (greedy, mean over seeds)",
                title=f"{spec.study}: validation BLEU during training{state}",
            ),
            out / CHARTS["learning_curves"],
        )  # fmt: skip
    heads, widths, grid = heads_width_grid(spec, rows)
    if grid:
        made["heads_width"] = plots.save_png(
            plots.grid_heatmap_figure(
                {shape: (r.test_mean, _cell_text(r)) for shape, r in grid.items()},
                row_labels=heads,
                column_labels=widths,
                xlabel="d_k = d_v, the width of a head", ylabel="heads h",
                colorbar_label="test2016 BLEU (lc), mean over seeds",
                title=f"{spec.study}: heads against their width{state}",
            ),
            out / CHARTS["heads_width"],
        )  # fmt: skip
    return made


def _cell_text(row: VariantRow) -> str:
    """A grid cell: the mean with its 95% t-interval's half-width, the variant and its seeds."""
    half = _half_width(row)
    spread = "" if half is None else f" ± {half:.2f}"
    seeds = len(row.test_bleu)
    return f"{row.test_mean:.2f}{spread}\n{row.variant}, {seeds} seed{'s' if seeds > 1 else ''}"
