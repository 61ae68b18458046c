"""One trial: train + evaluate through the DVC stages' code in the point's work directory, then
record it; or, as a DDP rank > 0, join its training."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

from pipeline import config_schema
from pipeline.errors import PipelineError, Preempted
from pipeline.sweep.claims import study_id, study_storage, trial_id
from pipeline.sweep.ddp import trial_ddp_world
from pipeline.sweep.deadline import CURRENT_DEADLINE
from pipeline.sweep.heartbeat import CURRENT_HEARTBEAT
from pipeline.sweep.pruning import build_pruner
from pipeline.sweep.records import logged_attempt, record_trial
from pipeline.sweep.spec import WORK_ROOT, StudySpec, TrialPaths, trial_config
from pipeline.sweep.storage import open_storage
from pipeline.sweep.trial_params import suggest_params, trial_paths
from pipeline.sweep.work_dirs import study_work_dir

PRECISION_ATTR = "train_precision"  # what the trial trains at: its DDP ranks read it


def run_trial(
    spec: StudySpec,
    trial: optuna.Trial,
    results_root: Path,
    study_dir: Path,
    precision: str | None = None,
) -> float:
    """Train + evaluate one trial through the DVC stages' code in the point's folder under
    `study_dir` (the study's work folder, `study_work_dir`); returns the objective.

    `precision`: what `train.precision: auto` stands for in this trial (the study's pinned
    precision, decided once for the whole study; see `pipeline.sweep.pin`)."""
    from pipeline.evaluation import evaluate
    from pipeline.tracking import finish_run, start_wandb_run

    paths, cfg = trial_setup(spec, trial, results_root, study_dir, precision)
    trial.set_user_attr(PRECISION_ATTR, cfg.train.precision)
    run = start_wandb_run(
        cfg, job_type="trial", name=f"{spec.study}-{paths.record.name}", group=spec.study
    )
    try:
        with logged_attempt(paths.work, trial) as attempt:  # finished once evaluated too
            with owned_folder(paths.work, trial.number):  # no second writer of its checkpoints
                train_metrics = _train(spec, trial, cfg, wandb_run=run)
            attempt.trained()
            eval_started = time.perf_counter()
            eval_metrics = evaluate.run(cfg, wandb_run=run)
            eval_seconds = time.perf_counter() - eval_started
    finally:
        finish_run(run)
    _ensure_still_running(trial)
    curve = record_trial(trial, cfg, paths, train_metrics, eval_metrics, eval_seconds)
    report_curve(trial, spec.metric, curve)
    return train_metrics.get(spec.metric)


def trial_setup(
    spec: StudySpec, trial: optuna.Trial, results_root: Path, study_dir: Path, precision: str | None
) -> tuple[TrialPaths, config_schema.Config]:
    """What every rank of a trial trains from: its folders and its config (the params drawn
    for it, or already drawn: a DDP rank > 0 reads them back), `train.precision: auto` as
    `precision` where given, and the study's data prepared and tokenized."""
    params = suggest_params(spec, trial)
    paths = trial_paths(results_root, study_dir, spec, trial)
    cfg = trial_config(spec, params, paths)
    if precision is not None and cfg.train.precision == "auto":
        cfg.train.precision = precision
    ensure_data(cfg, study_dir / "data")
    return paths, cfg


def report_curve(trial: optuna.Trial, metric: str, curve: list[dict[str, float]]) -> None:
    """Every validation of the finished point as the trial's intermediate values (the
    dashboard's learning curves), those a pruner has not had reported live already."""
    reported = study_storage(trial.study).get_trial(trial_id(trial)).intermediate_values
    for point in curve:
        if metric in point and point["step"] not in reported:
            trial.report(point[metric], step=int(point["step"]))


def _ensure_still_running(trial: optuna.Trial) -> None:
    """Refuse to record a trial that the storage no longer has RUNNING. `HeartbeatWatchdog`
    watches training only: a worker whose heartbeat went stale during evaluation (suspended,
    cut off from the storage) has been counted dead by another, which runs the point again
    from its finished checkpoint and records it; this worker then leaves it to that one."""
    state = study_storage(trial.study).get_trial(trial_id(trial)).state
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


def _train(spec: StudySpec, trial: optuna.Trial, cfg: config_schema.Config, wandb_run) -> dict:
    """`trainer.run` with the pruning callback; raises `optuna.TrialPruned` once training has
    stopped on the pruner's word (on every rank: the others stop at the same step)."""
    from pipeline.sweep.trial_callbacks import (
        DeadlineCallback,
        HeartbeatWatchdog,
        StepPruningCallback,
    )
    from pipeline.training import trainer

    # A pruner hears every validation as it happens. Without one the curve is reported once
    # the point is recorded (`report_curve`): a write during training would wait on a locked
    # storage, where the heartbeat watchdog must be free to stop the run at a checkpoint.
    pruning = StepPruningCallback(trial, monitor=spec.metric) if spec.pruner else None
    beat = CURRENT_HEARTBEAT.get()
    watchdog = HeartbeatWatchdog(beat, spec.settings) if beat is not None else None
    deadline = CURRENT_DEADLINE.get()
    at_deadline = DeadlineCallback(deadline) if deadline is not None else None
    callbacks = [cb for cb in (pruning, watchdog, at_deadline) if cb is not None]
    with trial_ddp_world(trial.number):
        # A point whose training finished before its worker stopped is not trained again.
        metrics = trainer.run(cfg, wandb_run=wandb_run, callbacks=callbacks, keep_finished=True)
    if pruning is not None and pruning.pruned_at_step is not None:
        raise optuna.TrialPruned(f"trial {trial.number} pruned at step {pruning.pruned_at_step}")
    return metrics


def run_trial_rank(
    spec: StudySpec, storage_url: str, results_root: Path, number: int, work_root: Path = WORK_ROOT
) -> None:
    """A DDP rank > 0 of trial `number`, started by Lightning re-running the worker's command:
    the same config, the same pruning decisions (broadcast from rank 0), no W&B run of its own
    (the logger is rank zero's), no evaluation."""
    storage = open_storage(storage_url, spec.settings)
    study = optuna.load_study(
        study_name=spec.study, storage=storage, pruner=build_pruner(spec.pruner)
    )
    (frozen,) = [t for t in study.get_trials(deepcopy=False) if t.number == number]
    trial = optuna.Trial(study, trial_id(frozen))
    study_dir = study_work_dir(work_root, spec.study, storage_url, study_id(study))
    precision = frozen.user_attrs.get(PRECISION_ATTR)  # what rank 0 trains at
    _, cfg = trial_setup(spec, trial, results_root, study_dir, precision)
    with contextlib.suppress(optuna.TrialPruned):
        _train(spec, trial, cfg, wandb_run=None)


LOCK_FILE = ".lock"  # in a point's work folder: held by the worker that trains there


@contextlib.contextmanager
def owned_folder(work: Path, number: int):
    """Hold the point's folder for this process while it trains there (an exclusive lock on
    `work/.lock`, let go by the kernel when the process dies); a folder another live process
    holds is refused, naming it, before anything is written."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / LOCK_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise PipelineError(
                f"trial {number}: its folder {work} is in use by {holder} (a worker still "
                "training this point); this worker leaves it alone"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()} on {socket.gethostname()}\n")
        lock.flush()
        yield


def ensure_data(cfg: config_schema.Config, data_root: Path) -> None:
    """Prepare + tokenize once per machine for the study (a file lock serialises workers; the
    ranks > 0 of a DDP trial find it done by rank 0, and only take its paths)."""
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenized import tokenize

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
