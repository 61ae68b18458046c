"""Which trial a worker runs next: claiming WAITING trials atomically, and queueing again the points
of trials that died, were preempted or failed."""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.orm
from optuna.storages import RDBStorage
from optuna.trial import TrialState

log = logging.getLogger(__name__)


FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)


GRID_POINT = ("variant", "seed")  # the params that name a grid point
RETRY_OF_ATTR = "failed_trial"  # a retry's system attribute: the number of its point's first try
# WAITING trials read at a time when a filter (--deadline's) may pass some over: most claims
# take the first, and a worker whose deadline leaves nothing that fits reads the rest once.
CLAIM_PAGE = 16


@dataclass(frozen=True)
class OptunaRdb:
    """The study's rows in Optuna's relational storage, read and written by SQL here (Optuna's
    own API reads every unfinished trial of the study for each question)."""

    storage: RDBStorage  # the database itself, under Optuna's cache
    study_id: int
    models: ModuleType  # optuna.storages._rdb.models: the tables' SQLAlchemy models
    frozen: Callable[[Any], optuna.trial.FrozenTrial]  # a TrialModel row as Optuna returns it
    started_utc: Any  # trials.datetime_start: naive UTC, as Optuna stores it
    # Tell Optuna's cache of the study a trial claimed here (its suggest_* write through it)
    remember: Callable[[optuna.trial.FrozenTrial], None]

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlalchemy.orm.Session]:
        """A session of its own (not Optuna's thread-scoped one, which Optuna's calls commit and
        close), committed at the end; on SQLite it begins with the write lock (`storage`)."""
        session = sqlalchemy.orm.Session(bind=self.storage.engine)
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()


# Optuna's private API is reached here only: `study_storage`, `study_id`, `trial_id`,
# `optuna_table_names` and `optuna_rdb` (`tests/test_sweep_claims.py` checks the last, which
# uses the others, against the installed Optuna).


def study_storage(study: optuna.Study) -> optuna.storages.BaseStorage:
    """The storage Optuna's own calls on `study` go through (for an RDB storage, its cache over
    the database): a trial's params and attributes written through it keep that cache right."""
    return study._storage


def study_id(study: optuna.Study) -> int:
    """The study's id in its storage."""
    return study._study_id


def trial_id(trial: optuna.Trial | optuna.trial.FrozenTrial) -> int:
    """The trial's id in its study's storage (its `number` counts within the study)."""
    return trial._trial_id


def optuna_table_names() -> set[str]:
    """The tables Optuna's relational storage creates (its schema's SQLAlchemy metadata)."""
    from optuna.storages._rdb.models import BaseModel

    return set(BaseModel.metadata.tables)


def optuna_rdb(study: optuna.Study) -> OptunaRdb:
    """The study's rows as Optuna's private API holds them: its storage beneath the cache, the
    study's id, the table models, its row-to-trial conversion."""
    from optuna.storages._rdb import models

    cache = study_storage(study)
    storage = getattr(cache, "_backend", cache)
    if not isinstance(storage, RDBStorage):
        raise TypeError(f"a sweep's study needs an RDB storage, not {type(storage).__name__}")

    def remember(trial: optuna.trial.FrozenTrial) -> None:
        if cache is storage:
            return
        from optuna.storages._cached_storage import _StudyInfo

        with cache._lock:
            cache._studies.setdefault(study_id(study), _StudyInfo())
            cache._add_trials_to_cache(study_id(study), [trial])

    return OptunaRdb(
        storage=storage,
        study_id=study_id(study),
        models=models,
        frozen=storage._build_frozen_trial_from_trial_model,
        started_utc=models.TrialModel.__table__.c.datetime_start,
        remember=remember,
    )


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
                system_attrs={**trial.system_attrs, RETRY_OF_ATTR: history[0],
                              "retry_history": history, "deaths": deaths},
            )
        )  # fmt: skip


def claim_waiting_trial(
    study: optuna.Study, accept: Callable[[optuna.trial.FrozenTrial], bool] | None = None
) -> optuna.Trial | None:
    """Atomically move one WAITING trial to RUNNING for this worker (None when none is left,
    or none that `accept` takes: one that fits before the worker's deadline, say).

    Retries of interrupted points first (RetryInterruptedTrial queues them last): they resume
    from their checkpoints, while a fresh point starts from step 0; each group by number.
    A claim reads the retries' ids (the database's few, by the server's index of them), then
    takes the first WAITING trial by one indexed query, whatever the study's size: a server
    skips the rows other workers are claiming (FOR UPDATE SKIP LOCKED) instead of queueing on
    the first one; on SQLite the transaction's write lock serializes the claims. Without
    `accept` it reads one trial; with it, pages of CLAIM_PAGE until one is taken."""
    rdb = optuna_rdb(study)
    trials, attrs = rdb.models.TrialModel, rdb.models.TrialSystemAttributeModel
    # Two steps, not a join: a planner whose statistics lag a freshly enqueued grid walks
    # every WAITING trial looking for retries.
    with rdb.transaction() as session:
        retries = session.scalars(
            sqlalchemy.select(attrs.trial_id).where(attrs.key == RETRY_OF_ATTR)
        ).all()
    is_retry = [trials.trial_id.in_(retries)] if retries else []
    for group in (*is_retry, None):  # the second pass takes any, retries locked a moment ago too
        after = -1  # the number of the last trial `accept` passed over
        while after is not None:
            claimed, after = claim_from_page(rdb, group, after, accept)
            if claimed is not None:
                rdb.remember(rdb.storage.get_trial(claimed))
                # Its first heartbeat comes from `heartbeat` as the trial starts; a worker that
                # dies in between leaves a trial `fail_trials_without_heartbeat` retries.
                return optuna.Trial(study, claimed)
    return None


def claim_from_page(rdb: OptunaRdb, group, after: int, accept) -> tuple[int | None, int | None]:
    """Claim the first WAITING trial numbered above `after` (of `group`) that `accept` takes:
    (its id, None); (None, the last number passed over) to read the next page; (None, None)
    when no trial is left."""
    trials = rdb.models.TrialModel
    with rdb.transaction() as session:
        query = session.query(trials).filter(
            trials.study_id == rdb.study_id,
            trials.state == TrialState.WAITING,
            trials.number > after,
        )
        if group is not None:
            query = query.filter(group)
        query = query.order_by(trials.number)
        if accept is None:
            model = query.limit(1).with_for_update(skip_locked=True, of=trials).one_or_none()
            if model is None:
                return None, None
            model.state = TrialState.RUNNING
            model.datetime_start = datetime.datetime.now()  # Optuna's own conversion to UTC
            return model.trial_id, None
        page = [(model.trial_id, model.number, rdb.frozen(model))
                for model in query.limit(CLAIM_PAGE).all()]  # fmt: skip
    # `accept` is asked outside the transaction: it may read the study through Optuna's own
    # connection, which SQLite's write lock, held by this one, would shut out.
    for trial_id, _, frozen in page:
        if accept(frozen) and _claim_if_waiting(rdb, trial_id):
            return trial_id, None
    return None, (page[-1][1] if page else None)


def _claim_if_waiting(rdb: OptunaRdb, trial_id: int) -> bool:
    """Move the trial to RUNNING if it is still WAITING (another worker may have claimed it
    since it was read): one conditional update, atomic on every database."""
    trials = rdb.models.TrialModel
    with rdb.transaction() as session:
        moved = (
            session.query(trials)
            .filter(trials.trial_id == trial_id, trials.state == TrialState.WAITING)
            .update(
                {
                    trials.__table__.c.state: TrialState.RUNNING,
                    rdb.started_utc: datetime.datetime.now(datetime.timezone.utc).replace(
                        tzinfo=None
                    ),
                },
                synchronize_session=False,
            )
        )
    return moved == 1


def fail_trials_without_heartbeat(study: optuna.Study, grace_period: float) -> None:
    """Retry the RUNNING trials that never recorded a heartbeat and started over
    `grace_period` seconds ago: their worker died between claiming the trial and its first
    heartbeat. `optuna.storages.fail_stale_trials` skips them, so without this they would stay
    RUNNING for ever and the study would never finish. One query over the study's RUNNING
    trials (the database itself: `study_storage` may be a cache)."""
    optuna_storage = optuna_rdb(study)
    trials, beats = optuna_storage.models.TrialModel, optuna_storage.models.TrialHeartbeatModel
    now_utc = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    started_before = now_utc - datetime.timedelta(seconds=grace_period)
    with optuna_storage.transaction() as session:
        candidates = [
            row[0]
            for row in session.query(trials.trial_id).filter(
                trials.study_id == optuna_storage.study_id,
                trials.state == TrialState.RUNNING,
                optuna_storage.started_utc < started_before,
                ~sqlalchemy.exists().where(beats.trial_id == trials.trial_id),
            )
        ]
    storage = study_storage(study)
    retry = storage.get_heartbeat_stale_trial_callback()
    for trial_id in sorted(candidates):
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


def count_trials(study: optuna.Study, states: tuple[TrialState, ...]) -> int:
    """How many of the study's trials are in `states`: counted by the database."""
    optuna_storage = optuna_rdb(study)
    trials = optuna_storage.models.TrialModel
    with optuna_storage.transaction() as session:
        return (
            session.query(sqlalchemy.func.count(trials.trial_id))
            .filter(trials.study_id == optuna_storage.study_id, trials.state.in_(states))
            .scalar()
        )
