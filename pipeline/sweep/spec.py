"""A study spec (`ablations/<study>.yaml`): read, validated and composed into each trial's config.

Every problem is a ConfigError naming the file and key, raised before any compute; every variant
is composed at load time, so a bad override fails before a worker starts.
"""

from __future__ import annotations

import itertools
import re
import typing
from collections import Counter
from dataclasses import MISSING as MISSING_DEFAULT
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.config_schema import (
    DOMAIN,
    NAME_PATTERN,
    SEED_LIMIT,
    Domain,
    domain_problem,
    key,
)
from pipeline.errors import ConfigError, PipelineError
from pipeline.portable_paths import WORK_ROOT  # noqa: F401 (where the sweep modules find it)

RESULTS_ROOT = Path("ablations/results")


STUDY_FILE = ".study.json"  # in a study's work folder: the study it belongs to
STUDY_KEY_LENGTH = 12  # hex digits of the identity hash in a study's work folder name


def study_identity(storage_url: str, study_id: int) -> str:
    """The study as one string: its storage's URL (password removed, an SQLite file by its
    absolute path) and its id in that storage."""
    from sqlalchemy.engine import make_url

    from pipeline.redaction import hide_password

    url = storage_url
    parsed = make_url(storage_url)
    if parsed.drivername.startswith("sqlite") and parsed.database:
        url = f"{parsed.drivername}:///{Path(parsed.database).resolve()}"
    return f"{hide_password(url)}#{study_id}"


def study_work_dir(work_root: Path, study: str, storage_url: str, study_id: int) -> Path:
    """`<work_root>/<study>-<key>`: the study's trials' work folders, keyed by its identity, so
    that studies of one name in two storages (two clones of the repository, a study created
    anew) never resume or overwrite each other's trials."""
    import hashlib

    identity = study_identity(storage_url, study_id).encode("utf-8")
    return work_root / f"{study}-{hashlib.sha256(identity).hexdigest()[:STUDY_KEY_LENGTH]}"


def claim_study_work_dir(work_root: Path, study: str, storage_url: str, study_id: int) -> Path:
    """The study's work folder (`study_work_dir`), created with the file naming its study."""
    from pipeline.atomic import write_json_atomic
    from pipeline.redaction import hide_password

    folder = study_work_dir(work_root, study, storage_url, study_id)
    if not (folder / STUDY_FILE).exists():
        write_json_atomic(folder / STUDY_FILE, {"study": study, "storage":
                          hide_password(storage_url), "study_id": study_id})  # fmt: skip
    return folder


# A study or variant name: one folder name (<results-dir>/<study>/,
# <work-dir>/<study>/<variant>-seed<n>/), short enough for the file system's limit on one
NAME_MAX = 100
FOLDER_NAME = rf"[A-Za-z0-9][A-Za-z0-9_.-]{{0,{NAME_MAX - 1}}}"
CONFIG_KEY = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"  # model.heads, +train.x
OVERRIDE_KEY = rf"[+~]{{0,2}}{CONFIG_KEY}"
# What a trial's training returns to be optimized (TranslationModule's validation metrics)
OBJECTIVE_METRICS = ("val/bleu", "val/loss", "val/nll_loss", "val/ppl")
# pruner.type: Optuna's pruners by name (pipeline.sweep.pruning builds them)
PRUNERS = {
    "median": "MedianPruner",
    "hyperband": "HyperbandPruner",
    "successive_halving": "SuccessiveHalvingPruner",
    "threshold": "ThresholdPruner",
}
SPACE_TYPES = ("categorical", "float", "int")


@dataclass
class SweepSettings:
    """How workers cooperate; the same for every study unless a spec overrides it."""

    heartbeat_interval: int = key(10, ge=1)  # seconds between a running trial's heartbeats
    # a heartbeat older than this marks the trial's worker dead (> heartbeat_interval)
    grace_period: int = key(30, ge=2)
    # re-runs of a trial whose worker died (preemptions are not counted)
    max_retries: int = key(2, ge=0)
    # seconds a late worker waits for the creator's grid
    grid_ready_timeout: float = key(120.0, gt=0.0)
    # seconds between looks at a study still running elsewhere
    poll_interval: float = key(2.0, gt=0.0)
    # How long one trial takes on one worker, before any of a variant has finished (a worker's
    # --deadline starts only trials expected to finish in time; then the measured median).
    trial_minutes_estimate: float | None = key(None, gt=0.0)
    # The most grid points (variants x seeds) a study enqueues without --allow-large-grid:
    # every point is a row of the storage, written when the study is created
    max_grid_points: int = key(1000, ge=1)


@dataclass
class Objective:
    """What the study optimizes: a validation metric of the trial's training, and whither."""

    metric: str = key(choices=OBJECTIVE_METRICS)
    direction: str = key(choices=("maximize", "minimize"))


@dataclass
class StudySpec:
    study: str = key(pattern=FOLDER_NAME)
    kind: str = key(choices=("grid", "search"))
    base_experiment: str = key(pattern=NAME_PATTERN, note="a file of conf/experiment/")
    objective: Objective = key()
    # config overrides applied to every trial
    budget: dict[str, Any] = key(factory=dict, keys=Domain(pattern=OVERRIDE_KEY))
    seeds: list[int] = key(factory=lambda: [1], nonempty=True,
                           items=Domain(ge=0, lt=SEED_LIMIT, note="what a trial's seed can be"))  # fmt: skip
    variants: dict[str, dict[str, Any]] = key(
        factory=dict, keys=Domain(pattern=FOLDER_NAME), items=Domain(keys=Domain(
            pattern=OVERRIDE_KEY)))  # fmt: skip
    space: dict[str, dict[str, Any]] = key(factory=dict, keys=Domain(pattern=OVERRIDE_KEY))
    n_trials: int | None = key(None, ge=1)
    sampler_seed: int = key(0, ge=0, lt=SEED_LIMIT)
    pruner: dict[str, Any] | None = key(None)
    # The paper's own result for a variant, for the report: {variant: {bleu, ppl, rows}}
    paper: dict[str, dict[str, Any]] = key(factory=dict)
    settings: SweepSettings = field(default_factory=SweepSettings)

    @property
    def metric(self) -> str:
        return self.objective.metric

    @property
    def direction(self) -> str:
        return self.objective.direction

    def grid(self) -> list[dict[str, Any]]:
        """Every (variant, seed) point of the GridSampler space, variant-major as the spec reads."""
        return [
            {"variant": variant, "seed": seed}
            for variant, seed in itertools.product(self.variants, self.seeds)
        ]

    def grid_space(self) -> dict[str, list[Any]]:
        return {"variant": list(self.variants), "seed": list(self.seeds)}


# A `paper` entry: the paper's own result for a variant (pipeline.report prints and judges it).
PAPER_REQUIRED = {"bleu", "rows"}


PAPER_OPTIONAL = {"ppl", "no_difference"}


def load_spec(path: str | Path, allow_large_grid: bool = False) -> StudySpec:
    """Read and validate a study spec, naming the file and key of any problem. Every key is
    held to its type and domain before anything is composed, opened or written; a grid larger
    than `settings.max_grid_points` needs `allow_large_grid` (`check_grid_size`)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: study spec not found (see ablations/*.yaml)")
    raw = _read_spec(path)
    # Names become folders (<results-dir>/<study>/, <work-dir>/<study>/<variant>-seed<n>/):
    # checked before anything is composed, opened or written.
    if "study" in raw:
        _check_folder_name(path, "study", raw["study"])
    if isinstance(raw.get("variants"), dict):
        for name in raw["variants"]:
            _check_folder_name(path, f"variants.{name}", name)
        raw["variants"] = {str(name): value for name, value in raw["variants"].items()}
    spec = _from_mapping(StudySpec, raw, path, "")
    if spec.kind == "grid" and not spec.variants:
        raise ConfigError(f"{path}: a grid study needs 'variants'")
    if spec.kind == "search" and (not spec.space or not spec.n_trials):
        raise ConfigError(f"{path}: a search study needs 'space' and 'n_trials'")
    check_grid_size(spec, path, allow_large_grid)
    beats = spec.settings.heartbeat_interval
    if spec.settings.grace_period <= beats:
        raise ConfigError(
            f"{path}: key 'settings.grace_period': must exceed settings.heartbeat_interval = "
            f"{beats}, got {spec.settings.grace_period} (every running trial would look dead)"
        )
    repeated = sorted(seed for seed, count in Counter(spec.seeds).items() if count > 1)
    if repeated:
        raise ConfigError(f"{path}: key 'seeds': {repeated} listed twice (a point would run "
                          "twice)")  # fmt: skip
    if not (config_lib.CONF_DIR / "experiment" / f"{spec.base_experiment}.yaml").is_file():
        raise ConfigError(
            f"{path}: key 'base_experiment': no experiment '{spec.base_experiment}' in "
            f"{config_lib.CONF_DIR / 'experiment'}"
        )
    for name, dist in spec.space.items():
        _check_distribution(path, f"space.{name}", dist)
    _check_pruner(path, spec.pruner)
    for name, entry in spec.paper.items():
        if name not in spec.variants:
            raise ConfigError(f"{path}: paper.{name}: no such variant")
        if not PAPER_REQUIRED <= set(entry) or not set(entry) <= PAPER_REQUIRED | PAPER_OPTIONAL:
            raise ConfigError(
                f"{path}: paper.{name} needs {sorted(PAPER_REQUIRED)} and may give "
                f"{sorted(PAPER_OPTIONAL)} (no_difference: the paper's words where it finds "
                f"none), got {entry}"
            )
    # Trials share one prepared + tokenized copy of the data (see ensure_data).
    varied = [*(k for v in spec.variants.values() for k in v), *spec.space]
    if any(key.startswith("data.") for key in varied):
        raise ConfigError(
            f"{path}: variants and space may not change data.* keys (trials share one "
            "tokenized dataset); put data settings in the base experiment or the budget"
        )
    # Compose every variant now, so a bad override fails before any compute; two variants that
    # compose to one config (`dropout_0.3` over a base whose dropout is 0.3) would only repeat
    # each other's trials.
    composed: dict[str, dict[str, Any]] = {}
    for name, overrides in spec.variants.items():
        try:
            cfg = config_lib.to_dict(point_config(spec, {**overrides, "seed": spec.seeds[0]}))
        except PipelineError as err:
            raise ConfigError(f"{path}: variant '{name}': {err}") from None
        twin = next((other for other, seen in composed.items() if seen == cfg), None)
        if twin is not None:
            base = f"the base experiment '{spec.base_experiment}'"
            raise ConfigError(
                f"{path}: variant '{name}' ({_overrides_text(overrides) or base}) equals "
                f"variant '{twin}' ({_overrides_text(spec.variants[twin]) or base}) with the "
                "study's budget: it would repeat its trials; choose a value the other does not "
                "have"
            )
        composed[name] = cfg
    return spec


def check_grid_size(spec: StudySpec, path: str | Path, allow_large: bool) -> None:
    """Refuse a grid of more than `settings.max_grid_points` points unless `allow_large`
    (--allow-large-grid): the study's creator enqueues every point before any trial runs."""
    points = len(spec.variants) * len(spec.seeds)
    if spec.kind == "grid" and points > spec.settings.max_grid_points and not allow_large:
        raise ConfigError(
            f"{path}: key 'settings.max_grid_points': the grid holds {points} points "
            f"({len(spec.variants)} variants x {len(spec.seeds)} seeds), more than "
            f"{spec.settings.max_grid_points}; every point is written to the storage when the "
            "study is created. Pass --allow-large-grid to run it, or raise "
            "settings.max_grid_points"
        )


def _from_mapping(cls: type, raw: Any, path: Path, prefix: str) -> Any:
    """`cls` from the spec's mapping at `prefix`: unknown and missing keys refused, and every
    key held to its type and domain (a nested section, recursively)."""
    where = f"key '{prefix.rstrip('.')}': " if prefix else ""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {where}must be a mapping of keys, got {raw!r}")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(raw) - set(known), key=str)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {[prefix + str(k) for k in unknown]}; "
                          f"known: {sorted(prefix + k for k in known)}")  # fmt: skip
    hints = typing.get_type_hints(cls)
    values = {}
    for f in fields(cls):
        name = prefix + f.name
        if f.name not in raw:
            if f.default is MISSING_DEFAULT and f.default_factory is MISSING_DEFAULT:
                raise ConfigError(f"{path}: missing key '{name}'")
            continue
        value = raw[f.name]
        if is_dataclass(hints[f.name]):
            values[f.name] = _from_mapping(hints[f.name], value or {}, path, f"{name}.")
            continue
        problem = domain_problem(value, hints[f.name], f.metadata.get(DOMAIN, Domain()))
        if problem:
            raise ConfigError(f"{path}: key '{name}': {problem}")
        values[f.name] = value
    return cls(**values)


def _check_distribution(path: Path, name: str, dist: dict[str, Any]) -> None:
    """A search space entry: {type: categorical, choices: [...]} or {type: float|int, low,
    high, log}, as Optuna's suggest_* take them."""
    kind = dist.get("type")
    if kind not in SPACE_TYPES:
        raise ConfigError(f"{path}: key '{name}.type': must be one of {list(SPACE_TYPES)}, "
                          f"got {kind!r}")  # fmt: skip
    allowed = {"type", "choices"} if kind == "categorical" else {"type", "low", "high", "log"}
    unknown = sorted(set(dist) - allowed)
    if unknown:
        raise ConfigError(f"{path}: key '{name}': unknown key(s) {unknown} for type {kind}; "
                          f"known: {sorted(allowed)}")  # fmt: skip
    if kind == "categorical":
        choices = dist.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{path}: key '{name}.choices': must be a list of at least one "
                              f"value, got {choices!r}")  # fmt: skip
        return
    number = config_schema.Domain()
    hint = int if kind == "int" else float
    for bound in ("low", "high"):
        problem = domain_problem(dist.get(bound), hint, number)
        if problem:
            raise ConfigError(f"{path}: key '{name}.{bound}': {problem}")
    log = dist.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{path}: key '{name}.log': must be true or false, got {log!r}")
    if not dist["low"] < dist["high"] or (log and dist["low"] <= 0):
        raise ConfigError(
            f"{path}: key '{name}': needs low < high{' and low > 0 (log)' if log else ''}, "
            f"got low={dist['low']}, high={dist['high']}"
        )


def _check_pruner(path: Path, pruner: dict[str, Any] | None) -> None:
    """`pruner.type` one of PRUNERS, its other keys that pruner's options (built here once, so
    a bad option is refused now rather than in each worker)."""
    if not pruner:
        return
    import optuna

    kind = pruner.get("type", "median")
    if kind not in PRUNERS:
        raise ConfigError(f"{path}: key 'pruner.type': must be one of {sorted(PRUNERS)}, "
                          f"got {kind!r}")  # fmt: skip
    options = {k: v for k, v in pruner.items() if k != "type"}
    try:
        getattr(optuna.pruners, PRUNERS[kind])(**options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{path}: key 'pruner': {kind} pruner refuses {options}: {err}") from None


def _check_folder_name(path: Path, key: str, name: Any) -> None:
    """Refuse a study or variant name that is not one folder name: empty, `.` or `..`, holding
    a path separator (an absolute path included), a newline or other character a file name
    should not have, or longer than NAME_MAX, which would put the study's files outside
    --results-dir and --work-dir or fail once storage was written."""
    if isinstance(name, int) and not isinstance(name, bool):
        name = str(name)  # `variants: {1: ...}` in YAML, a folder "1" like a name "1"
    if not isinstance(name, str) or not re.fullmatch(FOLDER_NAME, name):
        raise ConfigError(
            f"{path}: key '{key}': {name!r} is not a folder name (it names the study's or the "
            f"variant's folder); use up to {NAME_MAX} letters, digits, '_', '-' and '.', "
            "starting with a letter or digit"
        )


def _read_mapping(path: Path, named_by: str) -> dict[str, Any]:
    """The YAML mapping in `path`; anything else is a ConfigError that says so without
    echoing the file's content (`named_by`: the spec and key that named the file, or "")."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"{named_by}{path} is not a readable YAML file{line}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{named_by}{path} is not a study spec (a YAML mapping of keys)")
    return raw


def _parent_spec_path(path: Path, parent_name: Any) -> Path:
    """The spec that `path` extends: a relative path to a file in `path`'s folder or below
    (a spec that could name any file would read, and report on, files that are no specs)."""
    parent_path = path.parent / str(parent_name)
    folder = path.parent.resolve()
    if (
        not isinstance(parent_name, str)
        or Path(parent_name).is_absolute()
        or not parent_path.resolve().is_relative_to(folder)
    ):
        raise ConfigError(
            f"{path}: key 'extends': {parent_name!r} is not a spec in {path.parent} or below; "
            "name another study spec by its path relative to this one (e.g. table3.yaml)"
        )
    if not parent_path.is_file():
        raise ConfigError(f"{path}: extends: {parent_path} not found")
    return parent_path


def _read_spec(path: Path, extended_by: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The spec's keys, over those of the spec it `extends` (a path beside it or below), if
    any. There, `variants` may be a list: those of the parent's variants (and their `paper`
    entries) to run again, e.g. a re-run of some rows under another measure, in a study of its
    own."""
    raw = _read_mapping(path, f"{extended_by[-1]}: key 'extends': " if extended_by else "")
    parent_name = raw.pop("extends", None)
    if parent_name is None:
        if isinstance(raw.get("variants"), list):
            raise ConfigError(f"{path}: key 'variants': a list of names is for a spec that "
                              "'extends' another; give a mapping {name: overrides}")  # fmt: skip
        return raw
    parent_path = _parent_spec_path(path, parent_name)
    chain = (*extended_by, path)
    if parent_path.resolve() in {p.resolve() for p in chain}:
        raise ConfigError(f"{path}: key 'extends': {parent_path} extends this spec in turn")
    parent = _read_spec(parent_path, chain)
    if raw.get("study", parent.get("study")) == parent.get("study"):
        raise ConfigError(
            f"{path}: key 'study' must name a study of its own, not {parent_path}'s "
            f"'{parent.get('study')}' (the two would share one storage)"
        )
    selected = raw.get("variants")
    if isinstance(selected, list):
        parent_variants = parent.get("variants") or {}
        unknown = [name for name in selected if name not in parent_variants]
        if unknown:
            raise ConfigError(
                f"{path}: variants {unknown} are not variants of {parent_path} "
                f"({sorted(parent_variants)})"
            )
        raw["variants"] = {name: parent_variants[name] for name in selected}
        paper = parent.get("paper") or {}
        raw.setdefault("paper", {name: paper[name] for name in selected if name in paper})
    return {**parent, **raw}


def _overrides_text(overrides: dict[str, Any]) -> str:
    return ", ".join(_as_override(k, v) for k, v in overrides.items())


def point_config(spec: StudySpec, params: dict[str, Any]) -> config_schema.Config:
    """A trial's config before its paths are set (what variants are compared by)."""
    return trial_config(spec, params, TrialPaths(Path("/nonexistent"), Path("/nonexistent")))


def _as_override(key: str, value: Any) -> str:
    if isinstance(value, (list, dict)):
        value = yaml.safe_dump(value, default_flow_style=True).strip()
    elif value is None:
        value = "null"
    return f"{key}={value}"


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
    overrides += [_as_override(k, v) for k, v in spec.budget.items()]
    overrides += [_as_override(k, v) for k, v in params.items()]
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
