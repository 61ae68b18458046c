"""The report itself: its Markdown (table, trial states, findings, charts) from the study's
committed files, and `report.md` (a search study's is its trials ranked by the objective)."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from pipeline.errors import PipelineError
from pipeline.evaluation import seed_stats
from pipeline.report.charts import CHARTS, charts
from pipeline.report.contrasts import extra_tables
from pipeline.report.paper import unlike_paper
from pipeline.report.progress import progress, study_pin
from pipeline.report.prose import (
    aa_check,
    differences_paragraph,
    findings,
    power_statement,
    summary,
    write_up_paragraph,
)
from pipeline.report.records import TrialRecord, load_records, test_references
from pipeline.report.rows import (
    SIGNIFICANCE,
    VariantRow,
    factor_text,
    family_size,
    variant_rows,
)
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
from pipeline.sweep.spec import STUDY_DB, StudySpec


def markdown(
    spec: StudySpec,
    study_dir: Path,
    image_prefix: str = "",
    with_states: bool = True,
    transfer: tuple[StudySpec, ...] = (),
    rows: list[VariantRow] | None = None,
) -> str:
    """The report's Markdown (table, states, findings, charts), from the committed files; with
    `transfer`, the same grid's studies on other language pairs beside this one. `rows`: the
    study's rows where the caller has made them already (their tests take a while)."""
    records = load_records(study_dir)
    pinned = study_pin(spec, study_dir)
    if rows is None:
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
        *(part for table in extra_tables(spec, rows) for part in (table, "")),
        *([apart, ""] if apart else []),
        "BLEU (lc) is sacreBLEU's lowercased BLEU of the averaged checkpoints' beam search; "
        f"{ppl_note(rows)} The test2016 interval is the 95% t-interval of the mean over seeds. "
        "Δ is the difference of seed means with the 95% interval that Welch's test inverts. "
        "The verdict comes only from Welch's t-test of the difference of seed means (the unit is "
        "the training run; each group its own variance), with Holm's correction across the "
        f"spec's {family_size(spec)} comparisons with the base"
        + (" and between the variants it contrasts" if spec.contrasts else "")
        + " (p (Holm); a comparison not made "
        "counts as p = 1): 'holds' is a difference significant at α = "
        f"{SIGNIFICANCE} in the paper's direction, 'contradicts' one against it, "
        "'differs' one where the paper has no row, 'cannot tell' no significant difference "
        "(or no test: a single seed on a side, or no spread on either), with the difference "
        f"Welch's test detects with {seed_stats.POWER:.0%} power at its Holm step at the two "
        "groups' seed spread beside it. "
        "p (seeds, exact permutation) tests the same difference over every relabelling of the "
        "runs, without assuming normal seed scores; it decides nothing. "
        "Only variants run at the base's commit, hardware class and precision are compared. "
        "p (sentences) is sacreBLEU's paired bootstrap (1000 resamples) on test2016, the seeds "
        "both ran pooled: it sees the test set's sampling, not the seeds', and decides nothing."
        + paper_column_note(spec),
        "",
        aa_check(rows),
        "",
        power_statement(spec, rows),
        "",
        *(findings(rows, spec) or ["- no variant has been compared with the base yet."]),
        "",
        summary(rows, spec),
        "",
        *[
            f"{text}\n"
            for text in (differences_paragraph(spec, rows), write_up_paragraph(spec, rows))
            if text
        ],
    ]
    if transfer:
        pairs = [(pair_label(spec), rows)]
        for other in transfer:
            other_dir = study_dir.parent / other.study
            other_rows = variant_rows(other, load_records(other_dir), test_references(other),
                                      study_pin(other, other_dir))  # fmt: skip
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


def paper_column_note(spec: StudySpec) -> str:
    """What the paper's column is, naming the variants whose row is not the same change."""
    unlike = [name for name in spec.paper if unlike_paper(spec, name)]
    if not spec.paper:
        return ""
    note = (
        " The paper's column is its own Table 3 difference (newstest2013, base model, 100k "
        "steps) for the row the spec pairs with each variant"
    )
    if not unlike:
        return note + ": the same change of setting from the same value."
    return (
        note + f"; for {', '.join(unlike)} it is not the same change (the paper's base differs "
        "from ours in that setting, or in the width a head's count divides), and each finding "
        "says how."
    )


def trial_states(spec: StudySpec, study_dir: Path) -> str:
    database = study_dir / STUDY_DB
    if not database.exists():
        return ""
    study = optuna.load_study(study_name=spec.study, storage=f"sqlite:///{database.resolve()}")
    counts = {s.name.lower(): 0 for s in TrialState}
    for trial in study.get_trials(deepcopy=False):
        counts[trial.state.name.lower()] += 1
    note = failed_attempts(study.get_trials(deepcopy=False), load_records(study_dir))
    return ", ".join(f"{n} {k}" for k, n in counts.items() if n) + f" in {STUDY_DB}{note}"


# Listed by name up to this many points; counted above it
MAX_NAMED_POINTS = 3


def _point(trial: optuna.trial.FrozenTrial) -> tuple[str, int]:
    """The grid point a trial ran: its params, or the point it was queued with (a trial that
    failed before it asked for its params has none)."""
    params = trial.params if "variant" in trial.params else trial.system_attrs["fixed_params"]
    return params["variant"], int(params["seed"])


def failed_attempts(trials: list[optuna.trial.FrozenTrial], records: list[TrialRecord]) -> str:
    """What the storage and the records show of the failed attempts: at which points, how many
    the worker marked preempted, and whether each point has since finished (a record), is
    running again, is queued again, or has not run again."""
    failed = [t for t in trials if t.state == TrialState.FAIL]
    if not failed:
        return ""
    per_point: dict[tuple[str, int], int] = {}
    for trial in failed:
        per_point[_point(trial)] = per_point.get(_point(trial), 0) + 1
    finished = {(r.variant, r.seed) for r in records}
    live = {state: {_point(t) for t in trials if t.state == state}
            for state in (TrialState.RUNNING, TrialState.WAITING)}  # fmt: skip
    groups: dict[str, list[str]] = {}
    for point, times in per_point.items():
        if point in finished:
            status = "ran again and finished"
        elif point in live[TrialState.RUNNING]:
            status = "is running again"
        elif point in live[TrialState.WAITING]:
            status = "is queued to run again"
        else:
            status = "has not run again"
        tries = "" if times == 1 else f" ({times} failed attempts)"
        groups.setdefault(status, []).append(f"{point[0]} seed {point[1]}{tries}")
    parts = []
    for status, points in groups.items():
        if len(points) > MAX_NAMED_POINTS:
            every = "all" if len(points) == len(per_point) else "the other"
            parts.append(f"{every} {len(points)} {status.replace('is ', 'are ')}")
        else:
            verb = (
                status
                if len(points) == 1
                else status.replace("is ", "are ").replace("has ", "have ")
            )
            parts.append(f"{' and '.join(points)} {verb}")
    preempted = sum(bool(t.user_attrs.get("preempted")) for t in failed)
    attempts = "1 failed attempt was" if len(failed) == 1 else f"{len(failed)} failed attempts were"
    points = "1 point" if len(per_point) == 1 else f"{len(per_point)} points"
    return (
        f"; its {attempts} at {points} ({preempted} marked preempted by their worker): "
        + "; ".join(parts)
    )


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
    text = markdown(spec, study_dir, transfer=transfer, rows=rows)
    report.write_text(f"# Ablation study `{spec.study}`\n\n{text}")
    if log_to_wandb:
        finished = sum(pinned is None or r.conditions == pinned for r in records)
        log_summary(spec, study_dir, rows, figures, report, finished)
    return report


def _write_search_report(spec: StudySpec, study_dir: Path) -> Path:
    storage = f"sqlite:///{(study_dir / STUDY_DB).resolve()}"
    trials = optuna.load_study(study_name=spec.study, storage=storage).get_trials()
    if not trials:
        raise PipelineError(f"study '{spec.study}' has no trials yet: run the sweep first")
    report = study_dir / "report.md"
    report.write_text(f"# Search `{spec.study}`\n\n{search_table(trials)}\n")
    return report
