"""A study spec (`ablations/<study>.yaml`): read, validated and composed into each trial's config.

Every problem is a ConfigError naming the file and key, raised before any compute; every variant
is composed at load time, so a bad override fails before a worker starts.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.errors import ConfigError, PipelineError

RESULTS_ROOT = Path("ablations/results")


# Checkpoints and other bulky trial outputs live outside the repository (never in git).
WORK_ROOT = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transformer-ablations"
)
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


@dataclass
class SweepSettings:
    """How workers cooperate; the same for every study unless a spec overrides it."""

    heartbeat_interval: int = 10  # seconds between a running trial's heartbeats
    grace_period: int = 30  # a heartbeat older than this marks the trial's worker dead
    max_retries: int = 2  # re-runs of a trial whose worker died (preemptions are not counted)
    grid_ready_timeout: float = 120.0  # seconds a late worker waits for the creator's grid
    poll_interval: float = 2.0  # seconds between looks at a study still running elsewhere
    # How long one trial takes on one worker, before any of a variant has finished (a worker's
    # --deadline starts only trials expected to finish in time; then the measured median).
    trial_minutes_estimate: float | None = None


@dataclass
class StudySpec:
    study: str
    kind: str  # grid | search
    base_experiment: str
    objective: dict[str, str]
    budget: dict[str, Any] = field(default_factory=dict)
    seeds: list[int] = field(default_factory=lambda: [1])
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    space: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_trials: int | None = None
    sampler_seed: int = 0
    pruner: dict[str, Any] | None = None
    # The paper's own result for a variant, for the report: {variant: {bleu, ppl, rows}}
    paper: dict[str, dict[str, Any]] = field(default_factory=dict)
    settings: SweepSettings = field(default_factory=SweepSettings)

    @property
    def metric(self) -> str:
        return self.objective["metric"]

    @property
    def direction(self) -> str:
        return self.objective["direction"]

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


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a study spec, naming the file and key of any problem."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: study spec not found (see ablations/*.yaml)")
    raw = _read_spec(path)
    known = set(StudySpec.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    for key in ("study", "kind", "base_experiment", "objective"):
        if key not in raw:
            raise ConfigError(f"{path}: missing key '{key}'")
    # Names become folders (<results-dir>/<study>/, <work-dir>/<study>/<variant>-seed<n>/):
    # checked before anything is composed, opened or written.
    _check_folder_name(path, "study", raw["study"])
    if isinstance(raw.get("variants"), dict):
        for name in raw["variants"]:
            _check_folder_name(path, f"variants.{name}", name)
    settings = SweepSettings(**(raw.pop("settings", None) or {}))
    spec = StudySpec(**raw, settings=settings)
    if spec.kind not in ("grid", "search"):
        raise ConfigError(f"{path}: key 'kind' must be 'grid' or 'search', got '{spec.kind}'")
    if spec.direction not in ("maximize", "minimize"):
        raise ConfigError(f"{path}: key 'objective.direction' must be maximize or minimize")
    if spec.kind == "grid" and not spec.variants:
        raise ConfigError(f"{path}: a grid study needs 'variants'")
    for name, entry in spec.paper.items():
        if name not in spec.variants:
            raise ConfigError(f"{path}: paper.{name}: no such variant")
        if (
            not isinstance(entry, dict)
            or not PAPER_REQUIRED <= set(entry)
            or not set(entry) <= PAPER_REQUIRED | PAPER_OPTIONAL
        ):
            raise ConfigError(
                f"{path}: paper.{name} needs {sorted(PAPER_REQUIRED)} and may give "
                f"{sorted(PAPER_OPTIONAL)} (no_difference: the paper's words where it finds "
                f"none), got {entry}"
            )
    if spec.kind == "search" and (not spec.space or not spec.n_trials):
        raise ConfigError(f"{path}: a search study needs 'space' and 'n_trials'")
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


def _check_folder_name(path: Path, key: str, name: Any) -> None:
    """Refuse a study or variant name that is not one folder name: empty, `.` or `..`, or
    holding a path separator (an absolute path included), which would put the study's files
    outside --results-dir and --work-dir."""
    if isinstance(name, int) and not isinstance(name, bool):
        name = str(name)  # `variants: {1: ...}` in YAML
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or any(sep in name for sep in ("/", "\\", "\0"))
    ):
        raise ConfigError(
            f"{path}: key '{key}': {name!r} is not a folder name (it names the study's or the "
            "variant's folder); use letters, digits, '_', '-' and '.', without '/' or '..'"
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
            raise ConfigError(f"{path}: 'variants' is a list of names only under 'extends'")
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
