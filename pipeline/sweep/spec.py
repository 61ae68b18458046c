"""A study spec (`ablations/<study>.yaml`): read, validated and composed into each trial's config.

Every problem is a ConfigError naming the file and key, raised before any compute; every variant
is composed at load time, so a bad override fails before a worker starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.errors import ConfigError, PipelineError
from pipeline.metric_names import GREEDY_VAL_BLEU
from pipeline.portable_paths import WORK_ROOT  # noqa: F401 (where the sweep modules find it)
from pipeline.sweep.spec_checks import check_folder_name, check_points
from pipeline.sweep.spec_files import read_spec, top_level_counts
from pipeline.sweep.spec_schema import (
    BASE_VARIANT,
    StudySpec,
    SweepSettings,
    validated,
)

RESULTS_ROOT = Path("ablations/results")
STUDY_DB = "study.db"  # a study's default storage, in its results folder


def load_spec(path: str | Path, allow_large_grid: bool = False) -> StudySpec:
    """Read and validate a study spec, naming the file and key of any problem. Every key is
    held to its type and domain before anything is composed, opened or written; a grid larger
    than `settings.max_grid_points` needs `allow_large_grid` (`check_grid_size`)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: study spec not found (see ablations/*.yaml)")
    if not allow_large_grid:
        _refuse_a_large_grid_unread(path)
    raw = read_spec(path)
    # Names become folders (<results-dir>/<study>/, <work-dir>/<study>-<key>/<variant>-seed<n>/):
    # checked before anything is composed, opened or written.
    if "study" in raw:
        check_folder_name(path, "study", raw["study"])
    if isinstance(raw.get("variants"), dict):
        for name in raw["variants"]:
            check_folder_name(path, f"variants.{name}", name)
        raw["variants"] = {str(name): value for name, value in raw["variants"].items()}
    for section in ("objective", "settings"):
        if section in raw and raw[section] is None:  # `settings:` with nothing under it
            raw[section] = {}
    spec = validated(raw, path)
    check_grid_size(spec, path, allow_large_grid)
    if not (config_lib.CONF_DIR / "experiment" / f"{spec.base_experiment}.yaml").is_file():
        raise ConfigError(
            f"{path}: key 'base_experiment': no experiment '{spec.base_experiment}' in "
            f"{config_lib.CONF_DIR / 'experiment'}"
        )
    # Compose every variant now, so a bad override fails before any compute; two variants that
    # compose to one config (`dropout_0.3` over a base whose dropout is 0.3) would only repeat
    # each other's trials.
    composed: dict[str, dict[str, Any]] = {}
    for name, overrides in (spec.variants or {BASE_VARIANT: {}}).items():  # a search: its base
        try:
            cfg = config_lib.to_dict(point_config(spec, {**overrides, "seed": spec.seeds[0]}))
        except PipelineError as err:
            raise ConfigError(f"{path}: variant '{name}': {err}") from None
        if spec.metric == GREEDY_VAL_BLEU and not cfg["train"]["val_bleu"]:
            raise ConfigError(  # every trial would train in full, then fail without a value
                f"{path}: key 'objective.metric': {spec.metric} is training's greedy validation "
                f"BLEU, which variant '{name}' does not decode (train.val_bleu is false there); "
                "set train.val_bleu: true in the budget, or optimise val/loss"
            )
        twin = next((other for other, seen in composed.items() if seen == cfg), None)
        if twin is not None:
            base = f"the base experiment '{spec.base_experiment}'"
            raise ConfigError(
                f"{path}: variant '{name}' ({overrides_text(overrides) or base}) equals "
                f"variant '{twin}' ({overrides_text(spec.variants[twin]) or base}) with the "
                "study's budget: it would repeat its trials; choose a value the other does not "
                "have"
            )
        composed[name] = cfg
    return spec


def planned_hours(spec: StudySpec) -> float | None:
    """Worker-hours of the whole grid by `trial_hours` (None unless every variant has one)."""
    if spec.kind != "grid" or set(spec.trial_hours) != set(spec.variants):
        return None
    return sum(spec.trial_hours.values()) * len(spec.seeds)


def check_grid_size(spec: StudySpec, path: str | Path, allow_large: bool) -> None:
    """Refuse a grid of more than `settings.max_grid_points` points unless `allow_large`
    (--allow-large-grid): the study's creator enqueues every point before any trial runs."""
    if spec.kind == "grid" and not allow_large:
        check_points(path, len(spec.variants), len(spec.seeds), spec.settings.max_grid_points)


def _refuse_a_large_grid_unread(path: Path) -> None:
    """`check_grid_size` on the counts of the spec's YAML events, before any list is built:
    a spec of 10**6 seeds is refused in the seconds it takes to scan, not the minutes to build
    and check every item. A spec that `extends` another, or does not parse, is left to the
    full reading."""
    top = top_level_counts(path)
    if top is None:
        return
    bound = top.get("settings.max_grid_points")
    bound = int(bound) if isinstance(bound, str) and bound.isdigit() and int(bound) >= 1 else None
    if top.get("kind") == "grid" and "extends" not in top:
        variants, seeds = top.get("variants"), top.get("seeds")
        if isinstance(variants, int) and isinstance(seeds, int):  # counts, not scalars
            check_points(path, variants, seeds, bound or SweepSettings().max_grid_points)


def overrides_text(overrides: dict[str, Any]) -> str:
    """`model.heads=2, seed=1`: a variant's or point's overrides as one line."""
    return ", ".join(f"{key}={override_value(value)}" for key, value in overrides.items())


def point_config(spec: StudySpec, params: dict[str, Any]) -> config_schema.Config:
    """A trial's config before its paths are set (what variants are compared by)."""
    return trial_config(spec, params, TrialPaths(Path("/nonexistent"), Path("/nonexistent")))


def _spec_override(key: str, value: Any) -> str:
    """A spec's setting as an override that sets the key whether or not conf/ writes it out
    (a key whose default is null, `model.head_dim`, is absent there); the schema still refuses
    a key it does not have. A key the spec prefixes itself (`+`, `~`) keeps its prefix."""
    key = key if key.startswith(("+", "~")) else f"++{key}"
    return f"{key}={override_value(value)}"


def override_value(value: Any) -> str:
    """A value as an override writes it: lists and mappings as flow YAML, None as null."""
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True).strip()
    if value is None:
        return "null"
    return f"{value}"


@dataclass(frozen=True)
class TrialPaths:
    """Where one point of a study runs (`work`, outside the repository) and where its finished
    record is kept (`record`, committed with the study)."""

    work: Path
    record: Path
    work_root: Path | None = None  # what records name `<work-root>` (pipeline.portable_paths)

    @property
    def study_results(self) -> Path:
        return self.record.parent.parent

    @property
    def wandb(self) -> Path:
        """The study's offline W&B runs: `<results root>/../wandb/<study>/`, beside the results
        root, not in the study's folder. `dvc exp apply` (git's stash of untracked files)
        deletes the ignored files inside an untracked folder, which a new study's folder is."""
        return self.study_results.parent.parent / "wandb" / self.study_results.name


def trial_config(
    spec: StudySpec, params: dict[str, Any], paths: TrialPaths
) -> config_schema.Config:
    """The full config of one trial: conf/ + base experiment + budget + the trial's values."""
    overrides = [f"experiment={spec.base_experiment}"]
    overrides += [_spec_override(k, v) for k, v in spec.budget.items()]
    overrides += [_spec_override(k, v) for k, v in params.items()]
    overrides += [
        f"logger.wandb.group={spec.study}",
        f"paths.train_dir={paths.work / 'train'}",
        f"paths.eval_dir={paths.work / 'eval'}",
        f"paths.metrics_dir={paths.work / 'metrics'}",
        f"paths.plots_dir={paths.work / 'plots'}",
        # Offline W&B runs of the whole study side by side: `wandb sync <dir>/wandb/*`.
        f"paths.wandb_dir={paths.wandb}",
    ]
    return config_lib.compose(overrides)
