"""The report as one W&B summary run in the study's group: the table and the charts."""

from __future__ import annotations

import statistics
from pathlib import Path

from pipeline.report.contrasts import heads_width_grid
from pipeline.report.records import conditions_text
from pipeline.report.rows import VariantRow, family_contrasts
from pipeline.report.tables import verdict_cell
from pipeline.sweep.spec import StudySpec, TrialPaths, trial_config


def log_summary(
    spec: StudySpec,
    study_dir: Path,
    rows: list[VariantRow],
    figures: dict[str, Path],
    report: Path | None = None,
    finished: int | None = None,
) -> None:
    """The study's report run: the table and charts logged (and, where the spec has them, its
    contrasts and the heads x width grid), its summary the trials finished of those planned,
    whether the verdicts are final and the verdict of each comparison in the Holm family, and
    `report` (report.md) with the charts as an artifact of type 'report'."""
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
                           r.holm_p, verdict_cell(r), r.permutation_p, r.p_value,
                           conditions_text(r.conditions))  # fmt: skip
        logged = {"ablation_table": table}
        contrasts = family_contrasts(spec, rows)
        if contrasts:
            logged["contrast_table"] = wandb.Table(
                columns=["contrast", "delta", "delta_low", "delta_high", "p_welch", "p_holm",
                         "verdict", "p_permutation", "ppl_delta", "p_holm_ppl"],
                data=[[c.label, c.delta, *c.delta_interval, c.welch_p, c.holm_p,
                       verdict_cell(c), c.permutation_p, c.ppl_delta, c.ppl_holm_p]
                      for c in contrasts],
            )  # fmt: skip
        _, _, cells = heads_width_grid(spec, rows)
        if cells:
            logged["heads_width_table"] = wandb.Table(
                columns=["heads", "d_k", "variant", "seeds", "test_bleu_lc"],
                data=[[h, d_k, r.variant, len(r.test_bleu), r.test_mean]
                      for (h, d_k), r in sorted(cells.items())],
            )  # fmt: skip
        run.log({**logged, **{n: wandb.Image(str(p)) for n, p in figures.items()}})
        verdicts: dict[str, str] = {}
        for r in [*rows, *contrasts]:  # a pinned study's own row first, one run elsewhere after
            if r.delta is not None:
                verdicts.setdefault(r.label, verdict_cell(r))
        run.summary.update({
            "trials_planned": len(spec.grid()),
            "trials_finished": finished,
            "final": not any(r.interim for r in rows),
            "verdicts": verdicts,
        })  # fmt: skip
        if report is not None:
            artifact = wandb.Artifact(f"{spec.study}-report", type="report")
            for path in (report, *figures.values()):
                artifact.add_file(str(path))
            run.log_artifact(artifact)
    finally:
        run.finish()
