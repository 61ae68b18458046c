"""Optuna ablation sweeps: `python -m pipeline.sweep ablations/<spec>.yaml [--storage URL] [--n-trials N]`.

A trial is the same code path as `dvc repro`: its config is conf/ composed with the study's base
experiment, budget and the trial's overrides, then `training.trainer.run(cfg)` and
`evaluation.evaluate.run(cfg)` run in-process, into the trial's own directory, as one W&B run
(group = study, job_type = trial).

Many workers, on one machine or many, run the same command against one storage URL:
- grid studies: the worker that creates the study enqueues every (variant, seed) point once, in
  Optuna GridSampler's order; workers claim WAITING trials atomically (the storage's row lock), so
  no point runs twice and a finished study runs nothing new. (GridSampler alone re-runs unfinished
  points once every point has started, and a random point when the study is re-run.)
- search studies: TPE with a seed, `n_trials` finished trials in total across workers.
- heartbeats: a worker that dies leaves a RUNNING trial whose heartbeat goes stale; the next worker
  to look marks it failed and re-enqueues its parameters (`RetryInterruptedTrial`, at most
  `settings.max_retries` times). A worker stopped by SIGTERM/SIGUSR1 saves the trial's checkpoint,
  marks the trial failed and re-enqueues its point at once (not counted as a retry). A worker
  whose storage records none of its heartbeats for `grace_period - heartbeat_interval` seconds
  stops the trial the same way, but leaves the storage alone: others retry the stale trial. One
  whose heartbeat went stale while it evaluated records nothing if the storage no longer has its
  trial RUNNING (another worker has counted it dead and runs the point again).
- a trial trains in its point's own work directory (`<work-dir>/<study>/<variant>-seed<seed>/`,
  outside the repository: checkpoints, averaged model, heatmaps), so the re-run of an interrupted
  point resumes from its checkpoint instead of training from step 0. A finished trial's record
  (metrics, params, val and test hypotheses, validation curves, run info) is copied into
  `<results-dir>/<study>/trials/<point>/`, beside the study's storage: commit that folder and
  another machine continues the study where this one stopped, never re-running a finished point.
- DDP trials (`train.devices` > 1): the worker is rank 0. Lightning's DDP launcher starts the other
  ranks by re-running this command; `PIPELINE_SWEEP_TRIAL` in their environment makes them join
  that one trial's training (`run_trial_rank`) instead of acting as workers. Rank 0 reports every
  validation to the study and decides on pruning; the decision is broadcast so every rank stops
  at the same step. The ranks share the trial through the RDB storage (SQLite or a server).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import datetime
import fcntl
import itertools
import json
import logging
import math
import os
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch
import yaml
from lightning.pytorch.callbacks import Callback
from optuna.storages import RDBStorage
from optuna.trial import TrialState
from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback
from sqlalchemy import event
from sqlalchemy.pool import NullPool

from pipeline import config as config_lib
from pipeline import sweep_launch
from pipeline.atomic import write_json_atomic, write_text_atomic
from pipeline.cli import main
from pipeline.errors import ConfigError, PipelineError, Preempted
from pipeline.redaction import hide_password, hide_passwords
from pipeline.training.preemption import PreemptionCallback

log = logging.getLogger(__name__)

RESULTS_ROOT = Path("ablations/results")
# Checkpoints and other bulky trial outputs live outside the repository (never in git).
WORK_ROOT = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "transformer-ablations"
)
RUN_FILE = "run.json"  # written last: a record folder with it is a finished trial
ATTEMPTS_FILE = "attempts.jsonl"  # in the work dir: the point's attempts (`read_attempts`)
CURVE_METRICS = ("val/bleu", "val/loss", "val/ppl")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
GRID_READY_ATTR = "grid_enqueued"
GRID_POINT = ("variant", "seed")  # the params that name a grid point
TRIAL_ENV = "PIPELINE_SWEEP_TRIAL"  # set for the DDP ranks Lightning launches: the trial number
TrialFn = Callable[["StudySpec", optuna.Trial, Path], float]


# --------------------------------------------------------------------------- study specs


@dataclass
class SweepSettings:
    """How workers cooperate; the same for every study unless a spec overrides it."""

    heartbeat_interval: int = 10  # seconds between a running trial's heartbeats
    grace_period: int = 30  # a heartbeat older than this marks the trial's worker dead
    max_retries: int = 2  # re-runs of a trial whose worker died (preemptions are not counted)
    grid_ready_timeout: float = 120.0  # seconds a late worker waits for the creator's grid
    poll_interval: float = 2.0  # seconds between looks at a study still running elsewhere


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


def point_config(spec: StudySpec, params: dict[str, Any]) -> config_lib.Config:
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

    @property
    def study_results(self) -> Path:
        return self.record.parent.parent

    @property
    def wandb(self) -> Path:
        """The study's offline W&B runs: `<results root>/../wandb/<study>/`, beside the results
        root, not in the study's folder. `dvc exp apply` (git's stash of untracked files)
        deletes the ignored files inside an untracked folder, which a new study's folder is."""
        return self.study_results.parent.parent / "wandb" / self.study_results.name


def trial_config(spec: StudySpec, params: dict[str, Any], paths: TrialPaths) -> config_lib.Config:
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


# --------------------------------------------------------------------------- storage


def default_storage(spec: StudySpec, results_root: Path) -> str:
    return f"sqlite:///{(results_root / spec.study / 'study.db').resolve()}"


def open_storage(url: str, settings: SweepSettings, attempts: int = 10) -> RDBStorage:
    """An RDB storage with heartbeats; tolerates several workers creating the schema at once."""
    if "://" not in url:
        # Workers, heartbeats and DDP ranks share trials through one relational database;
        # Optuna's in-memory and journal storages cannot serve them.
        raise ConfigError(
            f"--storage {hide_password(url)!r} is not an SQLAlchemy URL: use "
            "sqlite:///path/study.db (one machine) or postgresql://user@host/db (many). "
            "Sweeps, their heartbeats and DDP trials need an RDB storage."
        )
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path in ("", ":memory:"):
            raise ConfigError(
                f"--storage {hide_password(url)!r} is an in-memory SQLite database, which "
                "lives and dies with one connection: no other worker, and no later run, could "
                "read the study. Use a file, sqlite:///path/study.db."
            )
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        # Wait on SQLite's write lock instead of failing with "database is locked". No pool:
        # each session opens the file anew, so that a study.db replaced under running workers
        # (`git pull` or `git checkout` of the committed storage writes a new file) is the one
        # they go on with; a pooled connection would hold the deleted file, where SQLite
        # refuses every write ("attempt to write a readonly database").
        engine_kwargs = {"connect_args": {"timeout": 120}, "poolclass": NullPool}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    retry = RetryInterruptedTrial(max_retries=settings.max_retries)
    for attempt in range(attempts):
        try:
            with _experimental_ok():
                storage = RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=settings.heartbeat_interval,
                    grace_period=settings.grace_period,
                    heartbeat_stale_trial_callback=retry,
                )
            if url.startswith("sqlite"):
                _begin_sqlite_transactions_immediately(storage.engine)
            return storage
        except Exception as err:  # concurrent CREATE TABLE / version row races
            if attempt == attempts - 1:
                raise PipelineError(
                    f"cannot open Optuna storage {hide_password(url)}: {hide_passwords(str(err))}"
                ) from err
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


class RetryInterruptedTrial:
    """Re-enqueue an interrupted trial's point (its params) as a WAITING trial, so that a worker
    runs it again: it resumes from the point's checkpoint.

    Optuna's RetryHeartbeatStaleTrialCallback, except that only deaths count towards
    `max_retries`: a preemption (SIGTERM/SIGUSR1: the checkpoint was saved, the scheduler will
    stop the worker many times over a long study) is retried however often it happens.
    The retry carries `failed_trial` (the first attempt's number) and `retry_history`."""

    def __init__(self, max_retries: int | None) -> None:
        self.max_retries = max_retries

    def __call__(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, preempted=False):
        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        deaths = trial.system_attrs.get("deaths", 0) + (0 if preempted else 1)
        if self.max_retries is not None and deaths > self.max_retries:
            log.warning("trial %d died %d times: not retried (max_retries)", trial.number, deaths)
            return
        study.add_trial(
            optuna.create_trial(
                state=TrialState.WAITING,
                params=trial.params,
                distributions=trial.distributions,
                user_attrs=trial.user_attrs,
                # The point's fixed params (an enqueued trial's) come along.
                system_attrs={**trial.system_attrs, "failed_trial": history[0],
                              "retry_history": history, "deaths": deaths},
            )
        )  # fmt: skip


def _begin_sqlite_transactions_immediately(engine) -> None:
    """Take SQLite's write lock when a transaction begins (SQLAlchemy's pysqlite recipe).

    SQLite ignores Optuna's SELECT ... FOR UPDATE and pysqlite sends no BEGIN before a SELECT, so
    two workers could both read a trial as WAITING and both claim it (seen in CI: a grid point
    ran twice). BEGIN IMMEDIATE makes each read-check-write atomic; other workers wait on the
    connection timeout.
    """

    @event.listens_for(engine, "connect")
    def _driver_autocommit(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # BEGIN comes from the listener below

    @event.listens_for(engine, "begin")
    def _begin_immediate(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine.dispose()  # pooled connections from the schema check reconnect with the listeners


def _sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    """TPE for a search. A grid's points are enqueued in GridSampler's order (`StudySpec.grid`)
    and claimed with their params fixed, so its sampler never draws a value: not GridSampler,
    whose `after_trial` reads a `grid_id` that only its own `ask` sets (a one-point grid's
    trial could not be told)."""
    if spec.kind == "grid":
        return optuna.samplers.RandomSampler(seed=spec.sampler_seed)
    return optuna.samplers.TPESampler(seed=spec.sampler_seed)


def _pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    if not spec.pruner:
        return optuna.pruners.NopPruner()
    kind = spec.pruner.get("type", "median")
    options = {k: v for k, v in spec.pruner.items() if k != "type"}
    pruners = {
        "median": optuna.pruners.MedianPruner,
        "hyperband": optuna.pruners.HyperbandPruner,
        "successive_halving": optuna.pruners.SuccessiveHalvingPruner,
        "threshold": optuna.pruners.ThresholdPruner,
    }
    if kind not in pruners:
        raise ConfigError(f"study '{spec.study}': pruner.type must be one of {sorted(pruners)}")
    return pruners[kind](**options)


def open_study(spec: StudySpec, storage: RDBStorage) -> optuna.Study:
    """Create the study (and, for a grid, enqueue its points once) or load it."""
    kwargs = dict(
        study_name=spec.study, storage=storage, sampler=_sampler(spec), pruner=_pruner(spec)
    )
    try:
        study = optuna.create_study(direction=spec.direction, **kwargs)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(**kwargs)
        if study.metric_names is None:  # a study created before its objective was named
            with _experimental_ok():
                study.set_metric_names([spec.metric])
        if spec.kind == "grid":
            _wait_for_grid(study, spec)
        return study
    with _experimental_ok():
        study.set_metric_names([spec.metric])  # the dashboard's name for the objective
    if spec.kind == "grid":
        for point in spec.grid():
            study.enqueue_trial(point, skip_if_exists=False)
        study.set_user_attr(GRID_READY_ATTR, len(spec.grid()))
    study.set_user_attr("spec", _spec_dict(spec))
    return study


def _spec_dict(spec: StudySpec) -> dict[str, Any]:
    return asdict(spec)


def _wait_for_grid(study: optuna.Study, spec: StudySpec) -> None:
    deadline = time.monotonic() + spec.settings.grid_ready_timeout
    while GRID_READY_ATTR not in study.user_attrs:
        if time.monotonic() > deadline:
            raise PipelineError(
                f"study '{spec.study}' exists but its grid was never enqueued (its creator died "
                f"while setting it up); delete it with `optuna delete-study --study-name "
                f"{spec.study} --storage <url>` and start again"
            )
        time.sleep(spec.settings.poll_interval)


# --------------------------------------------------------------------------- workers


class Heartbeat:
    """A running trial's heartbeat, recorded by `heartbeat`'s thread. A beat the storage refuses
    is logged and tried again at the next; `silent_for` tells how long the storage has recorded
    none (`HeartbeatWatchdog` stops the trial before others count it dead).
    """

    def __init__(self, storage: RDBStorage, trial_id: int) -> None:
        self.storage, self.trial_id = storage, trial_id
        self.last_recorded = time.monotonic()
        self.last_error: BaseException | None = None
        self.lost = False  # the trial was stopped because of it

    def record(self) -> None:
        try:
            self.storage.record_heartbeat(self.trial_id)
        except Exception as err:  # keep beating: a storage that comes back hears it again
            # Optuna's StorageInternalError hides the database's own message in its cause.
            self.last_error = err.__cause__ or err
            log.error("trial %d: cannot record its heartbeat: %s", self.trial_id, self.last_error)
        else:
            self.last_recorded = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.last_recorded


# The heartbeat of the trial this worker runs, for the trial's training (`HeartbeatWatchdog`).
CURRENT_HEARTBEAT: contextvars.ContextVar[Heartbeat | None] = contextvars.ContextVar(
    "current_heartbeat", default=None
)


@contextlib.contextmanager
def heartbeat(storage: RDBStorage, trial_id: int, interval: float):
    """Record the trial's heartbeat every `interval` seconds while the body runs; the first one
    before the body starts, so that a worker killed at any point of its trial leaves a heartbeat
    to go stale (Optuna never retries a RUNNING trial that has none). Yields the `Heartbeat`."""
    storage.record_heartbeat(trial_id)
    beat = Heartbeat(storage, trial_id)
    stop = threading.Event()

    def beat_until_stopped() -> None:
        while not stop.wait(interval):
            beat.record()

    thread = threading.Thread(target=beat_until_stopped, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    token = CURRENT_HEARTBEAT.set(beat)
    try:
        yield beat
    finally:
        CURRENT_HEARTBEAT.reset(token)
        stop.set()
        # A beat stuck on a storage out of reach (SQLite waits for its lock) is left behind.
        thread.join(timeout=0 if beat.lost else None)


class HeartbeatWatchdog(Callback):
    """Stops a trial's training at a checkpoint, as a preemption does, once the storage has
    recorded none of its heartbeats for `grace_period - heartbeat_interval` seconds: past
    `grace_period` other workers count the trial dead and run its point again, in the same
    work directory, and two processes would train one run."""

    def __init__(self, beat: Heartbeat, settings: SweepSettings) -> None:
        self.beat = beat
        self.limit = settings.grace_period - settings.heartbeat_interval

    def on_train_batch_end(self, trainer, *args) -> None:
        silent = self.beat.silent_for()
        if self.beat.lost or silent < self.limit:
            return
        self.beat.lost = True
        why = self.beat.last_error or "no answer"
        (preemption,) = [cb for cb in trainer.callbacks if isinstance(cb, PreemptionCallback)]
        preemption.request_stop(
            f"a lost heartbeat (the study's storage recorded none for {silent:.0f} s: {why})"
        )


def claim_waiting_trial(study: optuna.Study) -> optuna.Trial | None:
    """Atomically move one WAITING trial to RUNNING for this worker (None when none is left).

    Retries of interrupted points first (RetryInterruptedTrial queues them last): they resume
    from their checkpoints, while a fresh point starts from step 0; each group by number."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    waiting.sort(key=lambda trial: ("failed_trial" not in trial.system_attrs, trial.number))
    for frozen in waiting:
        try:
            # Its first heartbeat comes from `heartbeat` as the trial starts; a worker that dies
            # in between leaves a trial `fail_trials_without_heartbeat` retries.
            if study._storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
                return optuna.Trial(study, frozen._trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def fail_trials_without_heartbeat(
    study: optuna.Study, rdb: RDBStorage, grace_period: float
) -> None:
    """Retry the RUNNING trials that never recorded a heartbeat and started over
    `grace_period` seconds ago: their worker died between claiming the trial and its first
    heartbeat. `optuna.storages.fail_stale_trials` skips them, so without this they would stay
    RUNNING for ever and the study would never finish."""
    from optuna.storages._rdb import models

    storage = study._storage
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    started_before = datetime.datetime.now() - datetime.timedelta(seconds=grace_period)
    candidates = [
        t._trial_id for t in running if t.datetime_start and t.datetime_start < started_before
    ]
    if not candidates:
        return
    session = rdb.scoped_session()  # the database itself: `study._storage` may be a cache
    try:
        beating = models.TrialHeartbeatModel.trial_id
        with_heartbeat = {row[0] for row in session.query(beating).filter(beating.in_(candidates))}
    finally:
        rdb.scoped_session.remove()
    retry = storage.get_heartbeat_stale_trial_callback()
    for trial_id in sorted(set(candidates) - with_heartbeat):
        try:
            if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another worker got there first
        if retry is not None:
            retry(study, storage.get_trial(trial_id))


def retry_failed(study: optuna.Study) -> list[dict[str, Any]]:
    """Queue again every grid point whose last attempt failed with an error (a bug fixed since,
    say: such a trial is never retried by itself, unlike a death or a preemption), its newest
    failed attempt's params as a WAITING trial that resumes from the point's checkpoint, not
    counted as a death. A point that is finished, waiting or running is left alone, so running
    it twice queues nothing twice. Returns the points queued."""
    attempts: dict[tuple, list[optuna.trial.FrozenTrial]] = {}
    for trial in study.get_trials(deepcopy=False):
        # a trial still WAITING has its point only as the params it was enqueued with
        params = trial.params or trial.system_attrs.get("fixed_params", {})
        point = {key: params[key] for key in GRID_POINT if key in params}  # not the keys it sets
        attempts.setdefault(tuple(sorted(point.items())), []).append(trial)
    queued = []
    for point, trials in attempts.items():
        if any(t.state in (TrialState.COMPLETE, TrialState.WAITING, TrialState.RUNNING)
               for t in trials):  # fmt: skip
            continue
        failed = [t for t in trials if t.state == TrialState.FAIL]
        if not failed:
            continue  # pruned: the pruner's decision, not an error
        newest = max(failed, key=lambda t: t.number)
        RetryInterruptedTrial(max_retries=None)(study, newest, preempted=True)
        queued.append(dict(point))
    return queued


@contextlib.contextmanager
def _experimental_ok():
    """The heartbeat, stale-trial and metric-name APIs a sweep relies on are marked
    experimental; the warning on each use tells a sweep's user nothing they can act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def _count(study: optuna.Study, states: tuple[TrialState, ...]) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def run_worker(
    spec: StudySpec,
    storage_url: str,
    results_root: Path = RESULTS_ROOT,
    n_trials: int | None = None,
    trial_fn: TrialFn | None = None,
    work_root: Path = WORK_ROOT,
) -> optuna.Study:
    """Run trials until the study is done (or this worker has run `n_trials`).

    `trial_fn(spec, trial, results_root) -> objective` defaults to `run_trial` (train +
    evaluate, in `work_root`).
    """
    if trial_fn is None:

        def trial_fn(spec: StudySpec, trial: optuna.Trial, results_root: Path) -> float:
            return run_trial(spec, trial, results_root, work_root)

    storage = open_storage(storage_url, spec.settings)
    study = open_study(spec, storage)
    target = len(spec.grid()) if spec.kind == "grid" else spec.n_trials
    ran = 0
    while n_trials is None or ran < n_trials:
        with _experimental_ok():
            optuna.storages.fail_stale_trials(study)  # re-enqueues the trials of dead workers
        fail_trials_without_heartbeat(study, storage, spec.settings.grace_period)
        if _count(study, FINISHED) >= target:
            break
        if spec.kind == "grid":
            trial = claim_waiting_trial(study)
            if trial is None:
                if _count(study, (TrialState.RUNNING,)) == 0:
                    break  # nothing waiting, nothing running: exhausted (failed trials remain)
                time.sleep(spec.settings.poll_interval)  # others are finishing; a retry may come
                continue
        else:
            trial = study.ask()
        started = time.perf_counter()
        _run_and_tell(study, spec, trial, storage, results_root, trial_fn)
        ran += 1
        print(trial_line(study, spec, storage.get_trial(trial._trial_id), target,
                         time.perf_counter() - started), flush=True)  # fmt: skip
    return study


def _duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {seconds:02d} s"


def _value_text(trial: optuna.trial.FrozenTrial) -> str:
    return f"{trial.value:.2f}" if trial.value is not None else "-"


def trial_line(
    study: optuna.Study,
    spec: StudySpec,
    trial: optuna.trial.FrozenTrial,
    target: int | None,
    seconds: float,
) -> str:
    """`trial 3/22 heads_2-seed1: val/bleu 35.21 (complete) in 14 min 03 s`: k counts the
    study's finished trials, this one included (other workers' too), of the study's N."""
    finished = _count(study, FINISHED)
    of = f"{finished}/{target}" if target else str(finished)
    state = trial.state.name.lower()
    return (f"trial {of} {point_name(spec, trial)}: {spec.metric} {_value_text(trial)} "
            f"({state}) in {_duration(seconds)}")  # fmt: skip


def study_summary(study: optuna.Study, spec: StudySpec) -> str:
    """The finished trials best first (objective, test BLEU, state) and the best one."""
    trials = study.get_trials(deepcopy=False, states=FINISHED)
    if not trials:
        return f"study '{spec.study}': no finished trial yet"
    sign = -1 if spec.direction == "maximize" else 1
    trials = sorted(trials, key=lambda t: (t.value is None, sign * (t.value or 0.0), t.number))
    header = ["trial", "point", spec.metric, "test BLEU", "state"]
    rows = [header] + [
        [str(t.number), point_name(spec, t), _value_text(t),
         f"{t.user_attrs['test_bleu']:.2f}" if t.user_attrs.get("test_bleu") is not None else "-",
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


def _run_and_tell(
    study: optuna.Study,
    spec: StudySpec,
    trial: optuna.Trial,
    storage: RDBStorage,
    results_root: Path,
    trial_fn: TrialFn,
) -> None:
    with heartbeat(storage, trial._trial_id, spec.settings.heartbeat_interval) as beat:
        try:
            value = trial_fn(spec, trial, results_root)
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
            return
        except Preempted:
            if beat.lost:
                raise  # the storage is out of reach; its stale heartbeat queues the point again
            # The checkpoint is saved: queue the point again first (so that no worker sees the
            # study as exhausted in between), then close this attempt.
            frozen = storage.get_trial(trial._trial_id)
            RetryInterruptedTrial(spec.settings.max_retries)(study, frozen, preempted=True)
            study._storage.set_trial_user_attr(trial._trial_id, "preempted", True)
            study.tell(trial, state=TrialState.FAIL)
            raise
        except Exception:
            study.tell(trial, state=TrialState.FAIL)
            log.exception("trial %d failed", trial.number)
            raise
    if value is None or not math.isfinite(value):
        study.tell(trial, state=TrialState.FAIL)
    else:
        study.tell(trial, value)


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
    params.setdefault("seed", spec.sampler_seed + trial.number)
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
    return _as_override("", value)[1:]


def _record_grid_params(spec: StudySpec, trial: optuna.Trial) -> None:
    """Record the config keys this grid point sets (model.heads=2, ...) as the trial's params,
    beside `variant` and `seed`, so that the dashboard's parameter views (slice, parallel
    coordinates, importance) speak of settings rather than variant names. Written to the
    storage directly: a claimed trial's sampler must not draw them."""
    storage = trial.study._storage
    recorded = storage.get_trial(trial._trial_id).params
    variant = list(spec.variants).index(trial.params["variant"])
    for key, values in grid_values(spec).items():
        if key in recorded:  # a DDP rank > 0, or a retry enqueued with them
            continue
        distribution = _distribution(values)
        value = values[variant]
        if isinstance(distribution, optuna.distributions.CategoricalDistribution):
            value = _choice(value)
        storage.set_trial_param(
            trial._trial_id, key, distribution.to_internal_repr(value), distribution
        )


def point_name(spec: StudySpec, trial: optuna.Trial) -> str:
    """The folder name of a trial's point: `<variant>-seed<seed>` in a grid (the same for every
    attempt at the point), `trial-<number>` in a search."""
    if spec.kind == "grid":
        return f"{trial.params['variant']}-seed{trial.params['seed']}"
    return f"trial-{trial.number:04d}"


def trial_paths(
    results_root: Path, work_root: Path, spec: StudySpec, trial: optuna.Trial
) -> TrialPaths:
    name = point_name(spec, trial)
    return TrialPaths(
        work=work_root / spec.study / name, record=results_root / spec.study / "trials" / name
    )


def run_trial(
    spec: StudySpec, trial: optuna.Trial, results_root: Path, work_root: Path = WORK_ROOT
) -> float:
    """Train + evaluate one trial through the DVC stages' code; returns the objective."""
    from pipeline.evaluation import evaluate
    from pipeline.tracking import start_wandb_run

    params = suggest_params(spec, trial)
    paths = trial_paths(results_root, work_root, spec, trial)
    cfg = trial_config(spec, params, paths)
    ensure_data(cfg, work_root / spec.study / "data")
    run = start_wandb_run(
        cfg, job_type="trial", name=f"{spec.study}-{paths.record.name}", group=spec.study
    )
    try:
        with _attempt_logged(paths.work, trial):
            train_metrics = _train(spec, trial, cfg, wandb_run=run)
        eval_started = time.perf_counter()
        eval_metrics = evaluate.run(cfg, wandb_run=run)
        eval_seconds = time.perf_counter() - eval_started
    finally:
        run.finish()
    _ensure_still_running(trial)
    _record(trial, cfg, paths, train_metrics, eval_metrics, eval_seconds)
    return train_metrics.get(spec.metric)


def _ensure_still_running(trial: optuna.Trial) -> None:
    """Refuse to record a trial that the storage no longer has RUNNING. `HeartbeatWatchdog`
    watches training only: a worker whose heartbeat went stale during evaluation (suspended,
    cut off from the storage) has been counted dead by another, which runs the point again
    from its finished checkpoint and records it; this worker then leaves it to that one."""
    state = trial.study._storage.get_trial(trial._trial_id).state
    if state == TrialState.RUNNING:
        return
    beat = CURRENT_HEARTBEAT.get()
    if beat is not None:
        beat.lost = True  # so that `_run_and_tell` tells the storage nothing more
    raise Preempted(
        f"trial {trial.number} evaluated but not recorded: the study's storage has it {state.name} "
        "(its heartbeat went stale during evaluation and another worker counted it dead; the "
        "point is queued again, and its finished training is evaluated there)"
    )


@contextlib.contextmanager
def _attempt_logged(work: Path, trial: optuna.Trial):
    """Log each training attempt at the point (trial, steps, wall time, machine) in its work dir,
    also for an attempt that was preempted or killed: the record sums them.

    A line saying the attempt started comes first; its outcome follows when it ends. A SIGKILL
    leaves only the first: the next attempt at the point counts that one killed, at the step
    of the newest checkpoint it left, for the time until the last file it wrote."""
    from pipeline.environment import hardware

    base = {"trial": trial.number, "hardware": hardware(), "threads": torch.get_num_threads()}
    _close_killed_attempts(work)
    start = {"outcome": STARTED, "step": _checkpoint_step(work), "wall_time_s": 0.0}
    _append_attempt(work, {**base, **start, "started_at": time.time()})
    started = time.perf_counter()
    outcome = "interrupted"
    try:
        yield
        outcome = "finished"
    except Preempted:
        outcome = "preempted"
        raise
    finally:
        wall = round(time.perf_counter() - started, 1)
        step = _checkpoint_step(work)
        _append_attempt(work, {**base, "outcome": outcome, "step": step, "wall_time_s": wall})


STARTED = "started"  # an attempt's first line; its last says how it ended


def _append_attempt(work: Path, line: dict) -> None:
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ATTEMPTS_FILE, "a", encoding="utf-8") as attempts:
        attempts.write(json.dumps(line) + "\n")


def read_attempts(work: Path) -> list[dict]:
    """The point's attempts in the order they started, each as its last line says."""
    path = work / ATTEMPTS_FILE
    if not path.exists():
        return []
    latest: dict[int, dict] = {}
    for text in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(ValueError):  # a line cut short by a kill
            line = json.loads(text)
            latest[line["trial"]] = {**latest.get(line["trial"], {}), **line}
    return list(latest.values())


def _checkpoint_step(work: Path) -> int:
    """The step of the point's newest checkpoint (0 for none)."""
    progress = work / "train" / "checkpoints" / "progress.json"
    return json.loads(progress.read_text())["step"] if progress.exists() else 0


def _close_killed_attempts(work: Path) -> None:
    """Record the attempts that started but never ended (their process was killed) as killed:
    at the step of the newest checkpoint (where the next attempt resumes), for the time until
    the last checkpoint or history row written at the point."""
    step = _checkpoint_step(work)
    written = [work / "train" / "checkpoints", work / "plots"]
    last_write = max((p.stat().st_mtime for d in written if d.is_dir() for p in d.rglob("*")),
                     default=0.0)  # fmt: skip
    for attempt in read_attempts(work):
        if attempt["outcome"] != STARTED:
            continue
        wall = round(max(0.0, last_write - attempt["started_at"]), 1)
        killed = {"outcome": "killed", "step": max(step, attempt["step"]), "wall_time_s": wall}
        _append_attempt(work, {**attempt, **killed})


def _train(spec: StudySpec, trial: optuna.Trial, cfg: config_lib.Config, wandb_run) -> dict:
    """`trainer.run` with the pruning callback; raises `optuna.TrialPruned` once training has
    stopped on the pruner's word (on every rank: the others stop at the same step)."""
    from pipeline.training import trainer

    # Every validation is reported (the dashboard's intermediate values); only a pruner acts.
    pruning = StepPruningCallback(trial, monitor=spec.metric)
    beat = CURRENT_HEARTBEAT.get()
    watchdog = HeartbeatWatchdog(beat, spec.settings) if beat is not None else None
    callbacks = [callback for callback in (pruning, watchdog) if callback is not None]
    with _one_ddp_launch(trial.number):
        # A point whose training finished before its worker stopped is not trained again.
        metrics = trainer.run(cfg, wandb_run=wandb_run, callbacks=callbacks, keep_finished=True)
    if pruning is not None and pruning.pruned_at_step is not None:
        raise optuna.TrialPruned(f"trial {trial.number} pruned at step {pruning.pruned_at_step}")
    return metrics


@contextlib.contextmanager
def _one_ddp_launch(trial_number: int):
    """One trial's DDP world, torn down after it. Lightning's launcher marks the process as
    launched (LOCAL_RANK, MASTER_PORT, ... in os.environ) and keeps the process group: a
    worker's next trial would then wait for ranks that have exited instead of launching its
    own. `TRIAL_ENV` tells the launched ranks which trial they join."""
    saved = dict(os.environ)
    os.environ[TRIAL_ENV] = str(trial_number)
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        os.environ.clear()
        os.environ.update(saved)


def run_trial_rank(
    spec: StudySpec, storage_url: str, results_root: Path, number: int, work_root: Path = WORK_ROOT
) -> None:
    """A DDP rank > 0 of trial `number`, started by Lightning re-running the worker's command:
    the same config, the same pruning decisions (broadcast from rank 0), no W&B run of its own
    (the logger is rank zero's), no evaluation."""
    storage = open_storage(storage_url, spec.settings)
    study = optuna.load_study(study_name=spec.study, storage=storage, pruner=_pruner(spec))
    (frozen,) = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    trial = optuna.Trial(study, frozen._trial_id)
    params = suggest_params(spec, trial)  # the values already drawn for this trial
    paths = trial_paths(results_root, work_root, spec, trial)
    cfg = trial_config(spec, params, paths)
    # done by rank 0: sets the paths
    ensure_data(cfg, work_root / spec.study / "data")
    with contextlib.suppress(optuna.TrialPruned):
        _train(spec, trial, cfg, wandb_run=None)


class StepPruningCallback(PyTorchLightningPruningCallback):
    """optuna-integration's Lightning pruning callback, reporting at the optimizer step.

    The integration reports at `current_epoch`, but we validate every `train.val_check_interval`
    steps, often several times within one epoch, so its values would all land on step 0. It
    also raises `TrialPruned` inside `fit` when single-process, and under DDP expects the
    ranks to be spawned from the process that holds the trial. Here rank 0 (the worker itself)
    reports and asks the pruner; the decision is broadcast; every rank stops training at that
    step; `pruned_at_step` tells the caller. Its `on_fit_start` still refuses non-RDB storages
    under DDP."""

    def __init__(self, trial: optuna.Trial, monitor: str) -> None:
        super().__init__(trial, monitor=monitor)
        self.pruned_at_step: int | None = None

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        score = trainer.callback_metrics.get(self.monitor)
        if score is None:
            log.warning("pruning: '%s' is not among the validation metrics", self.monitor)
            return
        step = trainer.global_step
        should_stop = False
        if trainer.is_global_zero:
            self._trial.report(score.item(), step=step)
            should_stop = self._trial.should_prune()
        should_stop = trainer.strategy.broadcast(should_stop)
        if should_stop:
            trainer.should_stop = True
            self.pruned_at_step = step


def _record(trial, cfg, paths: TrialPaths, train_metrics, eval_metrics, eval_seconds) -> None:
    """Copy what the report needs into the point's record folder (committed with the study) and
    keep the headline numbers on the trial itself. `run.json` is written last."""
    from pipeline.environment import provenance
    from pipeline.training.module import LOSS_AVERAGE

    record = paths.record
    record.mkdir(parents=True, exist_ok=True)
    for name in ("train.json", "eval.json"):
        shutil.copyfile(Path(cfg.paths.metrics_dir) / name, record / name)
    for hypotheses in sorted(Path(cfg.paths.eval_dir).glob("*.hyp")):
        shutil.copyfile(hypotheses, record / hypotheses.name)
    write_text_atomic(
        record / "params.yaml", yaml.safe_dump(config_lib.to_dict(cfg), sort_keys=False)
    )
    write_json_atomic(record / "curve.json", validation_curve(cfg))
    attempts = [
        {key: value for key, value in attempt.items() if key != "started_at"}
        for attempt in read_attempts(paths.work)
    ]
    run = {
        "trial": trial.number,
        "params": trial.params,
        **provenance(),
        "precision": train_metrics.get("precision"),
        "loss_average": LOSS_AVERAGE,
        "threads": torch.get_num_threads(),
        "train_wall_time_s": round(sum(a["wall_time_s"] for a in attempts), 1),
        "eval_wall_time_s": round(eval_seconds, 1),
        "attempts": attempts,
    }
    write_json_atomic(record / RUN_FILE, run)

    test_split = cfg.data.test_splits[0] if cfg.data.test_splits else None
    test = eval_metrics.get(test_split, {}) if test_split else {}
    attrs = {
        "val_bleu": train_metrics.get("val/bleu"),
        "val_ppl": train_metrics.get("val/ppl"),
        "test_bleu": test.get("bleu"),
        "test_bleu_lc": test.get("bleu_lc"),
        "test_chrf": test.get("chrf"),
        "parameters": train_metrics.get("num_parameters"),
        "record": record.name,
        "checkpoint_dir": str(Path(cfg.paths.train_dir).resolve()),
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


def validation_curve(cfg: config_lib.Config) -> list[dict[str, float]]:
    """Every validation of the run by step ({"step", "val/bleu", "val/loss", "val/ppl"}), from
    DVCLive's files, which a resumed run appends to (a step logged twice keeps its last row)."""
    from pipeline.training.trainer import DVCLIVE_SUBDIR

    by_step: dict[int, dict[str, float]] = {}
    metrics = Path(cfg.paths.plots_dir) / DVCLIVE_SUBDIR / "plots" / "metrics"
    for key in CURVE_METRICS:
        path = metrics / f"{key}.tsv"
        if not path.exists():
            continue
        header, *rows = path.read_text(encoding="utf-8").splitlines()
        columns = header.split("\t")
        for row in rows:
            values = dict(zip(columns, row.split("\t")))
            step = int(values["step"])
            by_step.setdefault(step, {"step": step})[key] = float(values[key.split("/")[-1]])
    return [by_step[step] for step in sorted(by_step)]


# --------------------------------------------------------------------------- data, once


def ensure_data(cfg: config_lib.Config, data_root: Path) -> None:
    """Prepare + tokenize once per machine for the study (a file lock serialises workers)."""
    from pipeline.data.corpus import prepare
    from pipeline.data.tokenizer import tokenize

    cfg.paths.prepared = str(data_root / "prepared")
    cfg.paths.tokenized = str(data_root / "tokenized")
    data_root.mkdir(parents=True, exist_ok=True)
    with open(data_root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = data_root / ".done"
        if not done.exists():
            prepare(cfg)
            tokenize(cfg)
            done.write_text("ok\n")


# --------------------------------------------------------------------------- committing a study


def git_add_study(study_results: Path) -> None:
    """`git add` the study's records and its SQLite storage while holding the storage's write
    lock, so that the committed database is a consistent snapshot even while workers run
    (they wait on the lock for the moment it takes)."""
    import sqlite3

    database = study_results / "study.db"
    connection = sqlite3.connect(database, timeout=120, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")  # no writer can be mid-transaction now
        subprocess.run(["git", "add", "--", str(study_results)], check=True)
        connection.execute("ROLLBACK")
    finally:
        connection.close()


# --------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("spec", help="study spec, e.g. ablations/table3.yaml")
    parser.add_argument("--storage", help="SQLAlchemy URL (default: SQLite under the results dir)")
    parser.add_argument("--n-trials", type=int, help="run at most this many trials in this worker")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_ROOT)
    parser.add_argument(
        "--git-add",
        action="store_true",
        help="run no trial: stage the study's records and a consistent copy of its SQLite "
        "storage for a commit (safe while workers run)",
    )
    parser.add_argument(
        "--retry-failed",
        action="store_true",
        help="run no trial: queue again every grid point whose last attempt failed with an "
        "error (after fixing its cause); workers then resume it from its checkpoint",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=WORK_ROOT,
        help="where trials keep checkpoints and other bulky outputs (outside the repository); "
        "an interrupted point resumes from its checkpoint here",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="start this many workers on this machine, sharing its device (threads = cores / "
        "N each; CUDA MPS where installed); see pipeline.sweep_launch",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    return args


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = load_spec(args.spec)
    storage = args.storage or default_storage(spec, args.results_dir)
    if args.git_add:
        git_add_study(args.results_dir / spec.study)
        return
    if args.retry_failed:
        if spec.kind != "grid":
            raise ConfigError(f"{args.spec}: --retry-failed is for grid studies (a search "
                              "draws new trials in place of failed ones)")  # fmt: skip
        study = open_study(spec, open_storage(storage, spec.settings))
        queued = retry_failed(study)
        for point in queued:
            print(f"queued again: {_overrides_text(point)}")
        print(f"{len(queued)} failed point(s) of study '{spec.study}' queued again")
        return
    if TRIAL_ENV in os.environ:  # a DDP rank of a trial, launched by Lightning (see above)
        run_trial_rank(spec, storage, args.results_dir, int(os.environ[TRIAL_ENV]), args.work_dir)
        return
    if args.workers > 1:
        command = sweep_launch.worker_command(args.spec, storage, args.results_dir,
                                              args.work_dir, args.n_trials)  # fmt: skip
        raise SystemExit(sweep_launch.launch_workers(command, args.workers))
    study = run_worker(spec, storage, args.results_dir, args.n_trials, work_root=args.work_dir)
    finished = _count(study, FINISHED)
    print(study_summary(study, spec))
    print(f"study '{spec.study}': {finished} finished trials in {hide_password(storage)}")
    from pipeline.disk_usage import leftovers_message

    print(f"trial work folders: {leftovers_message([args.work_dir / spec.study])}")


def console() -> None:
    """The `transformer-sweep` command (pyproject.toml)."""
    main(cli)


if __name__ == "__main__":
    console()
