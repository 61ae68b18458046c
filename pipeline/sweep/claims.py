"""Which trial a worker runs next: claiming WAITING trials atomically, and queueing again the points
of trials that died, were preempted or failed."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

log = logging.getLogger(__name__)


FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


GRID_POINT = ("variant", "seed")  # the params that name a grid point


def grid_point(trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
    """A grid trial's `variant` and `seed`: among its params, or its user attributes in a study
    `pipeline.sweep.upgrade` rewrote, or the fixed params a WAITING trial was enqueued with."""
    sources = (
        lambda: trial.params,
        lambda: trial.user_attrs,
        lambda: trial.system_attrs.get("fixed_params") or {},
    )
    for source in sources:
        point = {key: value for key, value in source().items() if key in GRID_POINT}
        if point:
            return point
    return {}


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


def claim_waiting_trial(
    study: optuna.Study, accept: Callable[[optuna.trial.FrozenTrial], bool] | None = None
) -> optuna.Trial | None:
    """Atomically move one WAITING trial to RUNNING for this worker (None when none is left,
    or none that `accept` takes: one that fits before the worker's deadline, say).

    Retries of interrupted points first (RetryInterruptedTrial queues them last): they resume
    from their checkpoints, while a fresh point starts from step 0; each group by number."""
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    waiting.sort(key=lambda trial: ("failed_trial" not in trial.system_attrs, trial.number))
    for frozen in waiting:
        if accept is not None and not accept(frozen):
            continue
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
        point = grid_point(trial)  # not the keys it sets
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


def _count(study: optuna.Study, states: tuple[TrialState, ...]) -> int:
    return len(study.get_trials(deepcopy=False, states=states))
