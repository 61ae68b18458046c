"""A worker: claims or asks for trials until the study is done, runs each under its heartbeat and
tells the storage how it ended (a preempted trial's point is queued again at once)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from pipeline.errors import Preempted
from pipeline.sweep.claims import (
    FINISHED,
    RetryInterruptedTrial,
    _count,
    claim_waiting_trial,
    fail_trials_without_heartbeat,
)
from pipeline.sweep.heartbeat import heartbeat
from pipeline.sweep.spec import RESULTS_ROOT, WORK_ROOT, StudySpec
from pipeline.sweep.storage import _experimental_ok, open_storage, open_study
from pipeline.sweep.summary import trial_line
from pipeline.sweep.trial import run_trial

log = logging.getLogger(__name__)


TrialFn = Callable[["StudySpec", optuna.Trial, Path], float]


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
