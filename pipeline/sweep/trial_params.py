"""A trial's parameters: its grid point or the values drawn from the search space, as config
overrides and as the parameters the dashboard shows; the folders its point runs and is recorded in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna

from pipeline import config as config_lib
from pipeline.config_schema import SEED_LIMIT
from pipeline.errors import ConfigError
from pipeline.sweep.claims import grid_point, study_storage, trial_id
from pipeline.sweep.spec import StudySpec, TrialPaths, override_value, point_config


def suggest_params(spec: StudySpec, trial: optuna.Trial) -> dict[str, Any]:
    """The trial's config overrides: a grid point, or values drawn from the search space."""
    if spec.kind == "grid":
        variant = trial.suggest_categorical("variant", list(spec.variants))
        seed = trial.suggest_categorical("seed", list(spec.seeds))
        point = {**spec.variants[variant], "seed": seed}
        _record_grid_params(spec, trial)
        return point
    params: dict[str, Any] = {}
    for key, dist in spec.space.items():
        kind = dist["type"]
        if kind == "categorical":
            params[key] = trial.suggest_categorical(key, dist["choices"])
        elif kind == "float":
            params[key] = trial.suggest_float(
                key, dist["low"], dist["high"], log=dist.get("log", False)
            )
        elif kind == "int":
            params[key] = trial.suggest_int(
                key, dist["low"], dist["high"], log=dist.get("log", False)
            )
        else:
            raise ConfigError(f"study '{spec.study}': space.{key}.type '{kind}' is not supported")
    # within what a seed can be (config_schema.SEED_LIMIT), however many trials follow
    params.setdefault("seed", (spec.sampler_seed + trial.number) % SEED_LIMIT)
    return params


def grid_values(spec: StudySpec) -> dict[str, list[Any]]:
    """Every config key a grid's variants change, with the value it takes in each variant (in
    spec order; a variant that leaves the key alone has the base experiment's value)."""
    keys = list(dict.fromkeys(key for overrides in spec.variants.values() for key in overrides))
    if not keys:
        return {}
    base = config_lib.to_dict(point_config(spec, {}))
    return {
        key: [
            overrides.get(key, config_lib.subtree(base, key))
            for overrides in spec.variants.values()
        ]
        for key in keys
    }


def _distribution(values: list[Any]) -> optuna.distributions.BaseDistribution:
    """Numbers as a range (the dashboard plots them on an axis, and a study extended by a new
    value keeps its distribution compatible); anything else as the grid's choices."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) == len(values):
        if all(isinstance(v, int) for v in values):
            return optuna.distributions.IntDistribution(min(values), max(values))
        return optuna.distributions.FloatDistribution(float(min(values)), float(max(values)))
    return optuna.distributions.CategoricalDistribution(list(dict.fromkeys(map(_choice, values))))


def _choice(value: Any) -> Any:
    """A categorical choice: Optuna keeps None, bool, int, float and str."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return override_value(value)


def _record_grid_params(spec: StudySpec, trial: optuna.Trial) -> None:
    """Record the config keys this grid point sets (model.heads=2, ...) as the trial's params,
    beside `variant` and `seed`, so that the dashboard's parameter views (slice, parallel
    coordinates, importance) speak of settings rather than variant names. Written to the
    storage directly: a claimed trial's sampler must not draw them."""
    storage = study_storage(trial.study)
    recorded = storage.get_trial(trial_id(trial)).params
    variant = list(spec.variants).index(trial.params["variant"])
    for key, values in grid_values(spec).items():
        if key in recorded:  # a DDP rank > 0, or a retry enqueued with them
            continue
        distribution = _distribution(values)
        value = values[variant]
        if isinstance(distribution, optuna.distributions.CategoricalDistribution):
            value = _choice(value)
        storage.set_trial_param(
            trial_id(trial), key, distribution.to_internal_repr(value), distribution
        )


def point_name(spec: StudySpec, trial: optuna.Trial) -> str:
    """The folder name of a trial's point: `<variant>-seed<seed>` in a grid (the same for every
    attempt at the point), `trial-<number>` in a search."""
    if spec.kind == "grid":
        point = grid_point(trial)  # also in a study `pipeline.sweep.upgrade` rewrote
        return f"{point['variant']}-seed{point['seed']}"
    return f"trial-{trial.number:04d}"


def trial_paths(
    results_root: Path, study_dir: Path, spec: StudySpec, trial: optuna.Trial
) -> TrialPaths:
    """`study_dir`: the study's work folder (`pipeline.sweep.work_dirs.study_work_dir`)."""
    name = point_name(spec, trial)
    return TrialPaths(
        work=study_dir / name,
        record=results_root / spec.study / "trials" / name,
        work_root=study_dir.parent,
    )
