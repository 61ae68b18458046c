"""A finished grid study's storage in the layout optuna-dashboard reads best, in place:

    python -m pipeline.sweep.upgrade ablations/table3.yaml [--results-dir ablations/results]

- the objective is named (`val/bleu`, not "Objective 0");
- every trial with a record has its validation curve (`trials/<point>/curve.json`) as its
  intermediate values: the dashboard's learning curves;
- a grid trial has no parameters: the settings its variant changes from the base
  (`model.heads`, `model.dropout`, ...; none for the base itself), its `variant` and its `seed`
  are user attributes (the trials table shows and filters them). A grid holds most settings
  constant, a variant only names its settings and a seed is not a hyperparameter: the
  dashboard's parameter importance (PED-ANOVA over every parameter a finished trial has) and
  its slice and parallel-coordinate views would rank and draw such values as if they were
  findings, which only the report's tests over seeds can make;
- the study's note on the dashboard's page says where the study stands: its verdicts once
  every planned trial has finished (else that no verdict is drawn), that the dashboard's "Best
  Trial" is one seed's highest objective and no finding, which failed trials were attempts
  resumed later, and where the report is.

Trials keep their numbers, states, values, times and attributes, and the study its attributes.
The study is rebuilt in a copy of the SQLite file that then replaces it, so an interrupted
upgrade leaves the old file. A study with a trial running or waiting is refused (exit 2):
workers may be writing to it; upgrade it once they have finished. Running it again changes
nothing. The sweep, `--retry-failed` and the report read both layouts.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.cli import main
from pipeline.cli import parser as cli_parser
from pipeline.errors import ConfigError
from pipeline.sweep.spec import BASE_VARIANT, RESULTS_ROOT, STUDY_DB, StudySpec, load_spec

# Optuna, and torch through the study's records, load in the functions that use them: `--help`
# and a bad spec are answered without them.
if TYPE_CHECKING:
    import optuna
    from optuna.storages import RDBStorage
    from optuna.trial import FrozenTrial


def upgraded_trial(
    spec: StudySpec, trial: FrozenTrial, settings: dict[str, list[Any]], study_dir: Path
) -> FrozenTrial:
    """`trial` in the dashboard's layout (see the module docstring)."""
    import optuna
    from optuna.trial import TrialState

    from pipeline.sweep.claims import grid_point
    from pipeline.sweep.records import CURVE_FILE, read_curve

    point = grid_point(trial)
    variant = list(spec.variants).index(point["variant"])
    base = list(spec.variants).index(BASE_VARIANT) if BASE_VARIANT in spec.variants else None
    changed = {key: values[variant] for key, values in settings.items()
               if (values[variant] != values[base] if base is not None
                   else key in spec.variants[point["variant"]])}  # fmt: skip
    intermediate = dict(trial.intermediate_values)
    record = trial.user_attrs.get("record")
    curve_path = study_dir / "trials" / record / CURVE_FILE if record else None
    if curve_path is not None and curve_path.is_file():
        for row in read_curve(curve_path):
            if spec.metric in row:
                intermediate.setdefault(int(row["step"]), float(row[spec.metric]))
    upgraded = optuna.trial.create_trial(
        state=trial.state,
        value=trial.value if trial.state == TrialState.COMPLETE else None,
        params={},
        distributions={},
        user_attrs={**trial.user_attrs, **point, **changed},
        system_attrs=trial.system_attrs,
        intermediate_values=dict(sorted(intermediate.items())),
    )
    upgraded.datetime_start = trial.datetime_start
    upgraded.datetime_complete = trial.datetime_complete
    return upgraded


def upgrade(spec: StudySpec, study_dir: Path) -> int:
    """Rewrite `study_dir/study.db`'s study `spec.study`; returns how many trials it holds."""
    import optuna
    from optuna.trial import TrialState

    from pipeline.sweep.claims import study_id, study_storage
    from pipeline.sweep.storage import experimental_warnings_silenced
    from pipeline.sweep.trial_params import grid_values

    if spec.kind != "grid":
        raise ConfigError(f"study '{spec.study}': only a grid study has variants to upgrade")
    database = study_dir / STUDY_DB
    if not database.is_file():
        raise ConfigError(f"{database}: no such study storage; run the sweep first")
    old = _load(spec, database)
    trials = sorted(old.get_trials(deepcopy=False), key=lambda t: t.number)
    busy = [t.number for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    if busy:
        raise ConfigError(
            f"{database}: study '{spec.study}' has trials running or waiting ({len(busy)}, "
            f"first {busy[0]}): upgrade it once its workers have finished"
        )
    settings = grid_values(spec)
    upgraded = [upgraded_trial(spec, t, settings, study_dir) for t in trials]
    user_attrs = old.user_attrs
    system_attrs = study_storage(old).get_study_system_attrs(study_id(old))

    staging = database.with_name(database.name + ".upgrading")
    shutil.copyfile(database, staging)
    try:
        storage = _storage(staging)
        optuna.delete_study(study_name=spec.study, storage=storage)
        study = optuna.create_study(
            study_name=spec.study, storage=storage, direction=spec.direction
        )
        for key, value in system_attrs.items():
            storage.set_study_system_attr(study_id(study), key, value)
        for key, value in user_attrs.items():
            study.set_user_attr(key, value)
        with experimental_warnings_silenced():
            study.set_metric_names([spec.metric])
        study.add_trials(upgraded)
        from optuna_dashboard import save_note

        save_note(study, study_note(spec, study_dir, trials))
        numbers = [t.number for t in study.get_trials(deepcopy=False)]
        if numbers != [t.number for t in trials]:
            raise AssertionError(f"trial numbers changed: {numbers}")
        storage.engine.dispose()
        with sqlite3.connect(staging) as connection:  # drop the old study's pages
            connection.execute("VACUUM")
        connection.close()
        os.replace(staging, database)
    finally:
        staging.unlink(missing_ok=True)
    return len(upgraded)


def save_status_note(study: optuna.Study, spec: StudySpec, study_dir: Path) -> None:
    """A worker's word on the dashboard page after each finished trial: where the study stands
    (the verdicts are the report's and the upgrade's, not a worker's)."""
    from optuna.trial import TrialState
    from optuna_dashboard import save_note

    from pipeline.sweep.claims import count_trials

    # Counted by the database: reading the trials would cost each trial more as the study grows.
    finished = count_trials(study, (TrialState.COMPLETE,))
    save_note(study, status_note(spec, study_dir, finished, resumed=[], verdicts=False))


def study_note(spec: StudySpec, study_dir: Path, trials: list[FrozenTrial]) -> str:
    """`status_note` of a study whose trials are all at hand (the upgrade's): the failed
    attempts whose points a later trial finished are named."""
    from optuna.trial import TrialState

    from pipeline.sweep.claims import grid_point

    finished = [t for t in trials if t.state == TrialState.COMPLETE]
    done = {tuple(grid_point(t).values()) for t in finished}
    resumed = [t.number for t in trials
               if t.state == TrialState.FAIL and tuple(grid_point(t).values()) in done]  # fmt: skip
    return status_note(spec, study_dir, len(finished), resumed)


def status_note(
    spec: StudySpec, study_dir: Path, finished: int, resumed: list[int], verdicts: bool = True
) -> str:
    """The dashboard page's note (Markdown): where the study stands (`finished` trials), what
    its "Best Trial" and failed trials (`resumed`: attempts whose points later trials finished)
    are, and where its report is. `verdicts`: test them once every planned trial has finished
    (else the note says where they are)."""
    from pipeline.errors import PipelineError

    planned = len(spec.grid())
    report = study_dir / "report.md"
    lines = [f"**{spec.study}**: {finished} of {planned} planned trials finished."]
    if finished < planned:
        lines[0] += " Interim: no verdict is drawn before every planned trial has finished."
    elif not verdicts:
        lines.append("Every planned trial has finished: the verdicts are the report's.")
    else:
        try:
            listed = "\n".join(_verdicts(spec, study_dir))
            lines.append(f"Verdicts against the base (the report's, over seeds):\n\n{listed}")
        except PipelineError as err:  # the corpus the verdicts are tested on is not here
            lines.append(f"The verdicts are the report's ({err}).")
    lines.append(
        f'"Best Trial" is the highest {spec.metric} of a single seed, not a finding: a variant '
        "differs from the base only where the verdicts say so. The settings a trial's variant "
        "changes, its variant and its seed are its user attributes, not parameters, so the "
        "dashboard ranks no parameter's importance."
    )
    if resumed:
        lines.append(
            f"{len(resumed)} failed trials are attempts that stopped and whose points a later "
            "trial resumed and finished; they are no failed results."
        )
    lines.append(f"Report: `python -m pipeline.report {spec.study}` writes `{report}`.")
    return "\n\n".join(lines)


def _verdicts(spec: StudySpec, study_dir: Path) -> list[str]:
    from pipeline.report.progress import study_pin
    from pipeline.report.records import load_records, test_references
    from pipeline.report.rows import variant_rows

    rows = variant_rows(spec, load_records(study_dir), test_references(spec),
                        study_pin(spec, study_dir))  # fmt: skip
    return [
        f"- {row.variant}: {row.verdict}"
        + ("" if row.comparable else " (not compared: it ran under other run conditions)")
        for row in rows
        if row.verdict is not None
    ]


def _storage(database: Path) -> RDBStorage:
    from optuna.storages import RDBStorage
    from sqlalchemy.pool import NullPool

    return RDBStorage(f"sqlite:///{database.resolve()}", engine_kwargs={"poolclass": NullPool})


def _load(spec: StudySpec, database: Path) -> optuna.Study:
    import optuna

    try:
        return optuna.load_study(study_name=spec.study, storage=_storage(database))
    except KeyError:
        raise ConfigError(f"{database}: no study named '{spec.study}'") from None


def cli(argv: list[str] | None = None) -> None:
    parser = cli_parser("pipeline.sweep.upgrade", __doc__)
    parser.add_argument("spec", type=Path, help="the study's spec (ablations/<study>.yaml)")
    parser.add_argument(
        "--results-dir", type=Path, default=RESULTS_ROOT,
        help=f"where the study's folder is (default: {RESULTS_ROOT})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    study_dir = args.results_dir / spec.study
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created"
    count = upgrade(spec, study_dir)
    print(f"{study_dir / STUDY_DB}: study '{spec.study}' upgraded ({count} trials)")


if __name__ == "__main__":
    main(lambda: cli(sys.argv[1:]))
