"""The report as one W&B summary run in the study's group: the table and the charts."""

from __future__ import annotations

import statistics
from pathlib import Path

from pipeline.report.records import conditions_text
from pipeline.report.rows import VariantRow
from pipeline.sweep.spec import StudySpec, TrialPaths, trial_config


def log_summary(
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
                           conditions_text(r.conditions))  # fmt: skip
        run.log({"ablation_table": table, **{n: wandb.Image(str(p)) for n, p in figures.items()}})
    finally:
        run.finish()
