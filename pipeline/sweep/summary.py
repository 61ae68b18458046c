"""What a worker prints: a line per trial it ran, and the study's finished trials best first."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from pipeline.sweep.claims import FINISHED, count_trials
from pipeline.sweep.deadline import Deadline, TrialTimes, trial_variant
from pipeline.sweep.spec import RESULTS_ROOT, StudySpec
from pipeline.sweep.trial_params import point_name

TEST_ATTR = "test_bleu_lc"  # a trial's test BLEU (lc), the headline metric (DVC: test/bleu_lc)


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


def _value_text(trial: optuna.trial.FrozenTrial) -> str:
    return f"{trial.value:.2f}" if trial.value is not None else "-"


def _about(seconds: float) -> str:
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"about {hours} h {minutes:02d} min" if hours else f"about {minutes} min"


def _finished_of(study: optuna.Study, target: int | None) -> str:
    finished = count_trials(study, FINISHED)
    return f"{finished} of {target}" if target else str(finished)


def deadline_line(deadline: Deadline) -> str:
    """`deadline 2026-11-28 07:00 (in 9 h 30 min): ...`: a worker's first line, so a clock time
    read as tomorrow's, or a mistyped one, shows before any trial starts."""
    return (f"deadline {deadline.clock()} (in {_duration(deadline.left())}): starting only "
            "trials expected to finish by then")  # fmt: skip


def start_line(
    study: optuna.Study, spec: StudySpec, trial: optuna.trial.FrozenTrial, target: int | None
) -> str:
    """`trial 31 dropout_0.1-seed2: started (about 58 min); 30 of 55 finished`: which point the
    worker spends the next while on, before its training's own lines, and how long a trial of
    its variant has taken here (`TrialTimes`; left out where nothing says)."""
    variant = trial_variant(trial) if spec.kind == "grid" else None
    expected = TrialTimes.of_study(study, spec).seconds(variant)
    about = f" ({_about(expected)})" if expected else ""
    return (f"trial {trial.number} {point_name(spec, trial)}: started{about}; "
            f"{_finished_of(study, target)} finished")  # fmt: skip


def trial_line(
    study: optuna.Study,
    spec: StudySpec,
    trial: optuna.trial.FrozenTrial,
    target: int | None,
    seconds: float,
) -> str:
    """`trial 2 heads_2-seed1: val/bleu 35.21 (complete) in 14 min 03 s; 3 of 22 finished`:
    the trial's number (as the summary and the dashboard give it), then how many of the
    study's N trials have finished, this one and other workers' included."""
    state = trial.state.name.lower()
    return (f"trial {trial.number} {point_name(spec, trial)}: {spec.metric} {_value_text(trial)} "
            f"({state}) in {_duration(seconds)}; {_finished_of(study, target)} finished")  # fmt: skip


def study_summary(study: optuna.Study, spec: StudySpec) -> str:
    """The finished trials best first (objective, test BLEU (lc), state) and the best one."""
    trials = study.get_trials(deepcopy=False, states=FINISHED)
    if not trials:
        return f"study '{spec.study}': no finished trial yet"
    sign = -1 if spec.direction == "maximize" else 1
    trials = sorted(trials, key=lambda t: (t.value is None, sign * (t.value or 0.0), t.number))
    header = ["trial", "point", spec.metric, "test BLEU (lc)", "state"]
    rows = [header] + [
        [str(t.number), point_name(spec, t), _value_text(t),
         f"{t.user_attrs[TEST_ATTR]:.2f}" if t.user_attrs.get(TEST_ATTR) is not None else "-",
         t.state.name.lower()]
        for t in trials
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    if complete:
        best = study.best_trial
        lines.append(f"best: trial {best.number} ({point_name(spec, best)}), {spec.metric} "
                     f"{_value_text(best)}")  # fmt: skip
    return "\n".join(lines)


def where_to_look(spec_path: str, storage: str, results_dir: Path) -> str:
    """The commands that show a study: its dashboard and its report."""
    report = f"python -m pipeline.report {spec_path}"
    if Path(results_dir) != RESULTS_ROOT:
        report += f" --results-dir {results_dir}"
    return f"dashboard: optuna-dashboard {storage}\nreport: {report}"
