"""The report itself: its Markdown (table, trial states, findings, charts) from the study's
committed files, and `report.md` (a search study's is its trials ranked by the objective)."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from pipeline.errors import PipelineError
from pipeline.report.charts import CHARTS, charts
from pipeline.report.progress import progress, study_pin
from pipeline.report.prose import aa_check, findings, power_statement, summary
from pipeline.report.records import load_records, test_references
from pipeline.report.rows import SIGNIFICANCE, factor_text, family_size, variant_rows
from pipeline.report.tables import (
    grid_table,
    other_conditions_table,
    pair_label,
    ppl_note,
    ppl_table,
    search_table,
    transfer_table,
)
from pipeline.report.wandb_summary import log_summary
from pipeline.sweep.spec import StudySpec


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
    pinned = study_pin(spec, study_dir)
    rows = variant_rows(spec, records, test_references(spec), pinned)
    states = trial_states(spec, study_dir) if with_states else ""
    apart = other_conditions_table(rows)
    lines = [
        f"Study `{spec.study}`: {len(records)} of {len(spec.grid())} trials finished"
        + (f" ({states})" if states else "")
        + f"; budget {factor_text(spec.budget)}.",
        "",
        *([progress(spec, records, pinned), ""] if pinned is not None else []),
        grid_table(rows),
        "",
        ppl_table(rows),
        "",
        *([apart, ""] if apart else []),
        "BLEU (lc) is sacreBLEU's lowercased BLEU of the averaged checkpoints' beam search; "
        f"{ppl_note(rows)} The test2016 interval is the 95% t-interval of the mean over seeds. "
        "Δ is the difference of seed means with the 95% interval that Welch's test inverts. "
        "The verdict comes only from Welch's t-test of the difference of seed means (the unit is "
        "the training run; each group its own variance), with Holm's correction across the "
        f"spec's {family_size(spec)} comparisons with the base (p (Holm); a comparison not made "
        "counts as p = 1): 'holds' is a difference significant at α = "
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
    failed = counts.get("fail", 0)
    note = "; a failed attempt was stopped or killed, and its point ran again" if failed else ""
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) + f" in study.db{note}"


def write_report(
    spec: StudySpec,
    study_dir: Path,
    log_to_wandb: bool = True,
    transfer: tuple[StudySpec, ...] = (),
) -> Path:
    if spec.kind == "search":
        return _write_search_report(spec, study_dir)
    records = load_records(study_dir)
    pinned = study_pin(spec, study_dir)
    if not records and pinned is None:
        raise PipelineError(
            f"{study_dir}: no finished trials of study '{spec.study}' yet: run the sweep first"
        )
    report = study_dir / "report.md"
    if not records:  # a pinned study that has just started: its progress alone
        report.write_text(f"# Ablation study `{spec.study}`\n\n" + markdown(spec, study_dir))
        return report
    rows = variant_rows(spec, records, test_references(spec), pinned)
    figures = charts(spec, rows, records, study_dir)
    report.write_text(
        f"# Ablation study `{spec.study}`\n\n" + markdown(spec, study_dir, transfer=transfer)
    )
    if log_to_wandb:
        log_summary(spec, study_dir, rows, figures)
    return report


def _write_search_report(spec: StudySpec, study_dir: Path) -> Path:
    storage = f"sqlite:///{(study_dir / 'study.db').resolve()}"
    trials = optuna.load_study(study_name=spec.study, storage=storage).get_trials()
    if not trials:
        raise PipelineError(f"study '{spec.study}' has no trials yet: run the sweep first")
    report = study_dir / "report.md"
    report.write_text(f"# Search `{spec.study}`\n\n{search_table(trials)}\n")
    return report
