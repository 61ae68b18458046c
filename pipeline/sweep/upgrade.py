"""A finished grid study's storage in the layout optuna-dashboard reads best, in place:

    python -m pipeline.sweep.upgrade ablations/table3.yaml [--results-dir ablations/results]

- the objective is named (`val/bleu`, not "Objective 0");
- every trial with a record has its validation curve (`trials/<point>/curve.json`) as its
  intermediate values: the dashboard's learning curves;
- a trial's parameters are the settings its grid point runs with (`model.heads`,
  `model.dropout`, ...: every setting any variant changes, the base value where it leaves one
  alone), each once; `variant` and `seed` become user attributes, since a variant only names
  its settings (parameter importance would count one factor twice) and a seed is not a
  hyperparameter.

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
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState
from sqlalchemy.pool import NullPool

from pipeline.cli import main
from pipeline.cli import parser as cli_parser
from pipeline.errors import ConfigError
from pipeline.sweep.claims import grid_point
from pipeline.sweep.params import _choice, _distribution, grid_values
from pipeline.sweep.records import CURVE_FILE
from pipeline.sweep.spec import RESULTS_ROOT, StudySpec, load_spec
from pipeline.sweep.storage import _experimental_ok

DATABASE = "study.db"  # in the study's results folder
BUSY = (TrialState.RUNNING, TrialState.WAITING)


def upgraded_trial(
    spec: StudySpec, trial: FrozenTrial, settings: dict[str, list[Any]], study_dir: Path
) -> FrozenTrial:
    """`trial` in the dashboard's layout (see the module docstring)."""
    point = grid_point(trial)
    variant = list(spec.variants).index(point["variant"])
    params, distributions = {}, {}
    for key, values in settings.items():
        distribution = _distribution(values)
        value = values[variant]
        if isinstance(distribution, optuna.distributions.CategoricalDistribution):
            value = _choice(value)
        params[key], distributions[key] = value, distribution
    intermediate = dict(trial.intermediate_values)
    record = trial.user_attrs.get("record")
    curve_path = study_dir / "trials" / record / CURVE_FILE if record else None
    if curve_path is not None and curve_path.is_file():
        import json

        for row in json.loads(curve_path.read_text(encoding="utf-8")):
            if spec.metric in row:
                intermediate.setdefault(int(row["step"]), float(row[spec.metric]))
    upgraded = optuna.trial.create_trial(
        state=trial.state,
        value=trial.value if trial.state == TrialState.COMPLETE else None,
        params=params,
        distributions=distributions,
        user_attrs={**trial.user_attrs, **point},
        system_attrs=trial.system_attrs,
        intermediate_values=dict(sorted(intermediate.items())),
    )
    upgraded.datetime_start = trial.datetime_start
    upgraded.datetime_complete = trial.datetime_complete
    return upgraded


def upgrade(spec: StudySpec, study_dir: Path) -> int:
    """Rewrite `study_dir/study.db`'s study `spec.study`; returns how many trials it holds."""
    if spec.kind != "grid":
        raise ConfigError(f"study '{spec.study}': only a grid study has variants to upgrade")
    database = study_dir / DATABASE
    if not database.is_file():
        raise ConfigError(f"{database}: no such study storage; run the sweep first")
    old = _load(spec, database)
    trials = sorted(old.get_trials(deepcopy=False), key=lambda t: t.number)
    busy = [t.number for t in trials if t.state in BUSY]
    if busy:
        raise ConfigError(
            f"{database}: study '{spec.study}' has trials running or waiting ({len(busy)}, "
            f"first {busy[0]}): upgrade it once its workers have finished"
        )
    settings = grid_values(spec)
    upgraded = [upgraded_trial(spec, t, settings, study_dir) for t in trials]
    user_attrs = old.user_attrs
    system_attrs = old._storage.get_study_system_attrs(old._study_id)

    staging = database.with_name(database.name + ".upgrading")
    shutil.copyfile(database, staging)
    try:
        storage = _storage(staging)
        optuna.delete_study(study_name=spec.study, storage=storage)
        study = optuna.create_study(
            study_name=spec.study, storage=storage, direction=spec.direction
        )
        for key, value in system_attrs.items():
            storage.set_study_system_attr(study._study_id, key, value)
        for key, value in user_attrs.items():
            study.set_user_attr(key, value)
        with _experimental_ok():
            study.set_metric_names([spec.metric])
        study.add_trials(upgraded)
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


def _storage(database: Path) -> RDBStorage:
    return RDBStorage(f"sqlite:///{database.resolve()}", engine_kwargs={"poolclass": NullPool})


def _load(spec: StudySpec, database: Path) -> optuna.Study:
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
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # not "A new study created"
    count = upgrade(spec, study_dir)
    print(f"{study_dir / DATABASE}: study '{spec.study}' upgraded ({count} trials)")


if __name__ == "__main__":
    main(lambda: cli(sys.argv[1:]))
