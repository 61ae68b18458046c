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
  to look marks it failed and re-enqueues its parameters (RetryHeartbeatStaleTrialCallback).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from pipeline import config as config_lib
from pipeline.cli import main
from pipeline.errors import ConfigError, PipelineError, Preempted

log = logging.getLogger(__name__)

RESULTS_ROOT = Path("ablations/results")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
GRID_READY_ATTR = "grid_enqueued"
TrialFn = Callable[["StudySpec", optuna.Trial, Path], float]


# --------------------------------------------------------------------------- study specs


@dataclass
class SweepSettings:
    """How workers cooperate; the same for every study unless a spec overrides it."""

    heartbeat_interval: int = 10  # seconds between a running trial's heartbeats
    grace_period: int = 30  # a heartbeat older than this marks the trial's worker dead
    max_retries: int = 2  # re-runs of a trial whose worker died
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


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a study spec, naming the file and key of any problem."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: study spec not found (see ablations/*.yaml)")
    raw = yaml.safe_load(path.read_text()) or {}
    known = set(StudySpec.__dataclass_fields__)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {unknown}; known: {sorted(known)}")
    for key in ("study", "kind", "base_experiment", "objective"):
        if key not in raw:
            raise ConfigError(f"{path}: missing key '{key}'")
    settings = SweepSettings(**(raw.pop("settings", None) or {}))
    spec = StudySpec(**raw, settings=settings)
    if spec.kind not in ("grid", "search"):
        raise ConfigError(f"{path}: key 'kind' must be 'grid' or 'search', got '{spec.kind}'")
    if spec.direction not in ("maximize", "minimize"):
        raise ConfigError(f"{path}: key 'objective.direction' must be maximize or minimize")
    if spec.kind == "grid" and not spec.variants:
        raise ConfigError(f"{path}: a grid study needs 'variants'")
    if spec.kind == "search" and (not spec.space or not spec.n_trials):
        raise ConfigError(f"{path}: a search study needs 'space' and 'n_trials'")
    # Trials share one prepared + tokenized copy of the data (see ensure_data).
    varied = [*(k for v in spec.variants.values() for k in v), *spec.space]
    if any(key.startswith("data.") for key in varied):
        raise ConfigError(
            f"{path}: variants and space may not change data.* keys (trials share one "
            "tokenized dataset); put data settings in the base experiment or the budget"
        )
    # Compose every variant now, so a bad override fails before any compute.
    for name, overrides in spec.variants.items():
        try:
            trial_config(spec, {**overrides, "seed": spec.seeds[0]}, Path("/nonexistent"))
        except PipelineError as err:
            raise ConfigError(f"{path}: variant '{name}': {err}") from None
    return spec


def _as_override(key: str, value: Any) -> str:
    if isinstance(value, (list, dict)):
        value = yaml.safe_dump(value, default_flow_style=True).strip()
    elif value is None:
        value = "null"
    return f"{key}={value}"


def trial_config(spec: StudySpec, params: dict[str, Any], trial_dir: Path) -> config_lib.Config:
    """The full config of one trial: conf/ + base experiment + budget + the trial's values."""
    overrides = [f"experiment={spec.base_experiment}"]
    overrides += [_as_override(k, v) for k, v in spec.budget.items()]
    overrides += [_as_override(k, v) for k, v in params.items()]
    overrides += [
        f"logger.wandb.group={spec.study}",
        f"paths.train_dir={trial_dir / 'train'}",
        f"paths.eval_dir={trial_dir / 'eval'}",
        f"paths.metrics_dir={trial_dir / 'metrics'}",
        f"paths.plots_dir={trial_dir / 'plots'}",
        # Offline W&B runs of the whole study side by side: `wandb sync <dir>/wandb/*`.
        f"paths.wandb_dir={trial_dir.parent.parent / 'wandb'}",
    ]
    return config_lib.compose(overrides)


# --------------------------------------------------------------------------- storage


def default_storage(spec: StudySpec, results_root: Path) -> str:
    return f"sqlite:///{(results_root / spec.study / 'study.db').resolve()}"


def open_storage(url: str, settings: SweepSettings, attempts: int = 10) -> RDBStorage:
    """An RDB storage with heartbeats; tolerates several workers creating the schema at once."""
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite"):
        Path(url.split("///", 1)[1]).parent.mkdir(parents=True, exist_ok=True)
        # Wait on SQLite's write lock instead of failing with "database is locked".
        engine_kwargs = {"connect_args": {"timeout": 120}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    retry = RetryHeartbeatStaleTrialCallback(max_retry=settings.max_retries)
    for attempt in range(attempts):
        try:
            return RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=settings.heartbeat_interval,
                grace_period=settings.grace_period,
                failed_trial_callback=retry,
            )
        except Exception as err:  # concurrent CREATE TABLE / version row races
            if attempt == attempts - 1:
                raise PipelineError(f"cannot open Optuna storage {url}: {err}") from err
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


def _sampler(spec: StudySpec) -> optuna.samplers.BaseSampler:
    if spec.kind == "grid":
        return optuna.samplers.GridSampler(spec.grid_space(), seed=spec.sampler_seed)
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
        if spec.kind == "grid":
            _wait_for_grid(study, spec)
        return study
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


@contextlib.contextmanager
def heartbeat(storage: RDBStorage, trial_id: int, interval: float):
    """Record the trial's heartbeat every `interval` seconds while the body runs."""
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def claim_waiting_trial(study: optuna.Study) -> optuna.Trial | None:
    """Atomically move one WAITING trial to RUNNING for this worker (None when none is left)."""
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        try:
            if study._storage.set_trial_state_values(frozen._trial_id, state=TrialState.RUNNING):
                return optuna.Trial(study, frozen._trial_id)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue
    return None


def _count(study: optuna.Study, states: tuple[TrialState, ...]) -> int:
    return len(study.get_trials(deepcopy=False, states=states))


def run_worker(
    spec: StudySpec,
    storage_url: str,
    results_root: Path = RESULTS_ROOT,
    n_trials: int | None = None,
    trial_fn: TrialFn | None = None,
) -> optuna.Study:
    """Run trials until the study is done (or this worker has run `n_trials`).

    `trial_fn(spec, trial, results_root) -> objective` defaults to `run_trial` (train + evaluate).
    """
    trial_fn = trial_fn or run_trial
    storage = open_storage(storage_url, spec.settings)
    study = open_study(spec, storage)
    target = len(spec.grid()) if spec.kind == "grid" else spec.n_trials
    ran = 0
    while n_trials is None or ran < n_trials:
        optuna.storages.fail_stale_trials(study)  # re-enqueues the trials of dead workers
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
        _run_and_tell(study, spec, trial, storage, results_root, trial_fn)
        ran += 1
    return study


def _run_and_tell(
    study: optuna.Study,
    spec: StudySpec,
    trial: optuna.Trial,
    storage: RDBStorage,
    results_root: Path,
    trial_fn: TrialFn,
) -> None:
    with heartbeat(storage, trial._trial_id, spec.settings.heartbeat_interval):
        try:
            value = trial_fn(spec, trial, results_root)
        except optuna.TrialPruned:
            study.tell(trial, state=TrialState.PRUNED)
            return
        except Preempted:
            # Left RUNNING: its heartbeat stops, so a worker re-enqueues it after the grace
            # period, as for a killed worker (a FAIL would never be retried).
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
        return {**spec.variants[variant], "seed": seed}
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


def trial_dir(results_root: Path, spec: StudySpec, trial: optuna.Trial) -> Path:
    return results_root / spec.study / "trials" / f"{trial.number:04d}"


def run_trial(spec: StudySpec, trial: optuna.Trial, results_root: Path) -> float:
    """Train + evaluate one trial through the DVC stages' code; returns the objective."""
    from pipeline.evaluation import evaluate
    from pipeline.tracking import start_wandb_run
    from pipeline.training import trainer

    params = suggest_params(spec, trial)
    directory = trial_dir(results_root, spec, trial)
    cfg = trial_config(spec, params, directory)
    ensure_data(cfg, results_root / spec.study / "data")
    run = start_wandb_run(
        cfg, job_type="trial", name=f"{spec.study}-{trial.number:04d}", group=spec.study
    )
    try:
        callbacks = [_pruning_callback(trial, spec)] if spec.pruner else []
        train_metrics = trainer.run(cfg, wandb_run=run, callbacks=callbacks)
        eval_metrics = evaluate.run(cfg, wandb_run=run)
    finally:
        run.finish()
    _record(trial, cfg, directory, train_metrics, eval_metrics)
    return train_metrics.get(spec.metric)


def _pruning_callback(trial: optuna.Trial, spec: StudySpec):
    from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback

    class StepPruningCallback(PyTorchLightningPruningCallback):
        """optuna-integration reports at `current_epoch`, but we validate every
        `train.val_check_interval` optimizer steps, often several times within one epoch:
        report at the global step instead. Under DDP the integration's own path is kept."""

        def on_validation_end(self, trainer, pl_module) -> None:
            score = trainer.callback_metrics.get(self.monitor)
            if self.is_ddp_backend or trainer.sanity_checking or score is None:
                return super().on_validation_end(trainer, pl_module)
            step = trainer.global_step
            self._trial.report(score.item(), step=step)
            if self._trial.should_prune():
                raise optuna.TrialPruned(f"trial {self._trial.number} pruned at step {step}")

    return StepPruningCallback(trial, monitor=spec.metric)


def _record(trial, cfg, directory, train_metrics, eval_metrics) -> None:
    """Keep what the report needs on the trial itself."""
    test_split = cfg.data.test_splits[0] if cfg.data.test_splits else None
    test = eval_metrics.get(test_split, {}) if test_split else {}
    attrs = {
        "val_bleu": train_metrics.get("val/bleu"),
        "val_ppl": train_metrics.get("val/ppl"),
        "test_bleu": test.get("bleu"),
        "test_chrf": test.get("chrf"),
        "parameters": train_metrics.get("num_parameters"),
        "checkpoint_dir": str(Path(cfg.paths.train_dir).resolve()),
        "hypotheses": str((Path(cfg.paths.eval_dir) / f"{test_split}.hyp").resolve()),
        "config": config_lib.to_dict(cfg),
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, value)


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


# --------------------------------------------------------------------------- CLI


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.sweep", description=__doc__.split("\n")[0]
    )
    parser.add_argument("spec", help="study spec, e.g. ablations/table3.yaml")
    parser.add_argument("--storage", help="SQLAlchemy URL (default: SQLite under the results dir)")
    parser.add_argument("--n-trials", type=int, help="run at most this many trials in this worker")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_ROOT)
    return parser.parse_args(argv)


def cli(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    spec = load_spec(args.spec)
    storage = args.storage or default_storage(spec, args.results_dir)
    study = run_worker(spec, storage, args.results_dir, args.n_trials)
    finished = _count(study, FINISHED)
    print(f"study '{spec.study}': {finished} finished trials in {storage}")


if __name__ == "__main__":
    main(cli)
