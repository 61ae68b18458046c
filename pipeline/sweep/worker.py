"""A worker: claims or asks for trials until the study is done, runs each under its heartbeat and
tells the storage how it ended (a preempted trial's point is queued again at once)."""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from pipeline.errors import Preempted
from pipeline.sweep import pin
from pipeline.sweep.claims import (
    FINISHED,
    RetryInterruptedTrial,
    claim_waiting_trial,
    count_trials,
    fail_trials_without_heartbeat,
    study_id,
    study_storage,
    trial_id,
)
from pipeline.sweep.deadline import (
    CURRENT_DEADLINE,
    Deadline,
    TrialTimes,
    fits,
    hours,
    trial_variant,
)
from pipeline.sweep.heartbeat import heartbeat
from pipeline.sweep.spec import RESULTS_ROOT, WORK_ROOT, StudySpec
from pipeline.sweep.storage import (
    commit_study,
    experimental_warnings_silenced,
    open_storage,
    open_study,
    refused_connections_named,
)
from pipeline.sweep.summary import deadline_line, start_line, trial_line
from pipeline.sweep.trial import run_trial
from pipeline.sweep.trial_params import point_name
from pipeline.sweep.work_dirs import claim_study_work_dir

log = logging.getLogger(__name__)


TrialFn = Callable[["StudySpec", optuna.Trial, Path], float]


def _refused_connections_named(run: Callable[..., optuna.Study]) -> Callable[..., optuna.Study]:
    """`run_worker` stopping with what to do when its server admits no more connections."""

    @functools.wraps(run)
    def worker(spec: StudySpec, storage_url: str, *args, **kwargs) -> optuna.Study:
        with refused_connections_named(storage_url):
            return run(spec, storage_url, *args, **kwargs)

    return worker


@_refused_connections_named
def run_worker(
    spec: StudySpec,
    storage_url: str,
    results_root: Path = RESULTS_ROOT,
    n_trials: int | None = None,
    trial_fn: TrialFn | None = None,
    work_root: Path = WORK_ROOT,
    deadline: Deadline | None = None,
    allow_mixed: bool = False,
    commit: bool = False,
) -> optuna.Study:
    """Run trials until the study is done (or this worker has run `n_trials`, or nothing left
    fits before `deadline`).

    `trial_fn(spec, trial, results_root) -> objective` defaults to `run_trial` (train +
    evaluate, in the study's folder under `work_root`, `study_work_dir`). The worker checks the study's pin first (`pipeline.sweep.pin`;
    a study it creates is pinned to it). `commit`: commit the study's records after each
    finished trial (`storage.commit_study`).
    """
    pin.check_commit_known()  # before the storage: a study it created would be pinned to it
    storage = open_storage(storage_url, spec.settings)
    study = open_study(spec, storage, pin=lambda: pin.this_worker(spec))
    pinned = pin.Pin.from_attr(study.user_attrs.get(pin.PIN_ATTR))
    worker = pin.this_worker(spec, pinned)
    pin.check_pin(study, spec, worker, allow_mixed)
    if pinned is not None:  # for a report that reads the records, not the storage
        pin.write_pin_file(results_root / spec.study, pinned)
    if trial_fn is None:
        study_dir = claim_study_work_dir(work_root, spec.study, storage_url, study_id(study))

        def trial_fn(spec: StudySpec, trial: optuna.Trial, results_root: Path) -> float:
            return run_trial(spec, trial, results_root, study_dir, precision=worker.precision)

    target = len(spec.grid()) if spec.kind == "grid" else spec.n_trials
    if deadline is not None:
        print(deadline_line(deadline), flush=True)
    ran = 0
    while n_trials is None or ran < n_trials:
        with experimental_warnings_silenced():
            optuna.storages.fail_stale_trials(study)  # re-enqueues the trials of dead workers
        fail_trials_without_heartbeat(study, spec.settings.grace_period)
        if count_trials(study, FINISHED) >= target:
            break
        if spec.kind == "grid":
            trial = claim_waiting_trial(study, fits(study, deadline, spec))
            if trial is None:
                if deadline is not None and count_trials(study, (TrialState.WAITING,)):
                    print(_stopping_at_deadline(study, spec, deadline, target), flush=True)
                    break  # what waits does not fit in the time left
                # A server may answer none while others hold the waiting rows a moment
                # (SKIP LOCKED): exhausted only when none waits and none runs.
                if count_trials(study, (TrialState.RUNNING, TrialState.WAITING)) == 0:
                    break  # nothing waiting, nothing running: exhausted (failed trials remain)
                time.sleep(spec.settings.poll_interval)  # others are finishing; a retry may come
                continue
        else:
            expected = TrialTimes.of_study(study, spec).seconds(None)
            if deadline is not None and expected is not None and expected > deadline.left():
                print(_stopping_at_deadline(study, spec, deadline, target), flush=True)
                break
            trial = study.ask()
        print(start_line(study, spec, storage.get_trial(trial_id(trial)), target), flush=True)
        started = time.perf_counter()
        token = CURRENT_DEADLINE.set(deadline)
        try:
            _run_and_tell(study, spec, trial, storage, results_root, trial_fn)
        except Preempted:
            if deadline is None or not deadline.passed():
                raise
            print(_stopping_at_deadline(study, spec, deadline, target, stopped=trial), flush=True)
            break
        finally:
            CURRENT_DEADLINE.reset(token)
        ran += 1
        frozen = storage.get_trial(trial_id(trial))
        print(trial_line(study, spec, frozen, target, time.perf_counter() - started), flush=True)
        if spec.kind == "grid":  # the dashboard page says where the study stands
            from pipeline.sweep.upgrade import save_status_note

            save_status_note(study, spec, results_root / spec.study)
        if commit and frozen.state == TrialState.COMPLETE:
            commit_study(results_root / spec.study, f"{spec.study}: {point_name(spec, frozen)} "
                         f"finished ({count_trials(study, FINISHED)}/{target})")  # fmt: skip
    return study


def _stopping_at_deadline(study: optuna.Study, spec: StudySpec, deadline: Deadline,
                          target: int | None, stopped: optuna.Trial | None = None) -> str:  # fmt: skip
    """What a worker says as its deadline stops it: the trial it stopped, and what is left."""
    left = [t for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))]
    times = TrialTimes.of_study(study, spec)
    expected = [times.seconds(trial_variant(t)) for t in left]
    known = [seconds for seconds in expected if seconds is not None]
    head = f"deadline {deadline.clock()}: "
    if stopped is not None:
        head += (f"trial {stopped.number} stopped at a checkpoint and queued again "
                 "(it resumes from there); ")  # fmt: skip
    else:
        head += f"no waiting trial fits in the {deadline.left() / 60:.0f} min left; "
    finished = count_trials(study, FINISHED)
    of = f" of {target}" if target else ""
    tail = f"{finished}{of} trials finished, {len(left)} waiting"
    if known:
        tail += f" (about {hours(sum(known))} of one worker at the measured times)"
    return head + tail


def _run_and_tell(
    study: optuna.Study,
    spec: StudySpec,
    trial: optuna.Trial,
    storage: RDBStorage,
    results_root: Path,
    trial_fn: TrialFn,
) -> None:
    with heartbeat(storage, trial_id(trial), spec.settings.heartbeat_interval) as beat:
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
            frozen = storage.get_trial(trial_id(trial))
            RetryInterruptedTrial(spec.settings.max_retries)(study, frozen, preempted=True)
            study_storage(study).set_trial_user_attr(trial_id(trial), "preempted", True)
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
