"""The study's storage: one relational database (SQLite or a server) that every worker, heartbeat
and DDP rank shares; the study created (a grid's points enqueued once) or loaded from it; a
consistent copy of a SQLite storage staged for a commit."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna
from optuna.storages import RDBStorage
from sqlalchemy import event
from sqlalchemy.pool import NullPool

from pipeline.errors import ConfigError, PipelineError
from pipeline.redaction import hide_password, hide_passwords
from pipeline.sweep.claims import RetryInterruptedTrial
from pipeline.sweep.pruning import _pruner
from pipeline.sweep.spec import StudySpec, SweepSettings

if TYPE_CHECKING:
    from pipeline.sweep.pin import Pin

log = logging.getLogger(__name__)

GRID_READY_ATTR = "grid_enqueued"
PIN_ATTR = "pin"  # the study's commit, hardware class and precision (pipeline.sweep.pin)


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
            if attempt == attempts - 1 or _lasting(err):
                raise PipelineError(
                    f"cannot open Optuna storage {hide_password(url)}: {hide_passwords(str(err))}"
                ) from err
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


# What the server or driver says when asking again cannot help: the database or user is not
# there, the password is wrong, the host has no address, the driver is not installed.
LASTING_ERRORS = ("does not exist", "authentication failed", "no password supplied",
                  "could not translate host name", "unable to open database file",
                  "No module named")  # fmt: skip


def _lasting(err: Exception) -> bool:
    """Whether opening the storage failed for a reason a retry cannot remove (the retries are
    for workers racing to create the schema): the user hears it at once, not ~50 s later."""
    return any(marker in str(err) for marker in LASTING_ERRORS)


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


def open_study(
    spec: StudySpec, storage: RDBStorage, pin: Callable[[], Pin] | None = None
) -> optuna.Study:
    """Create the study (and, for a grid, enqueue its points once) or load it. `pin`: what a
    new study is pinned to (`pipeline.sweep.pin`), recorded before its grid is ready, so that
    every worker that waits for the grid finds the pin."""
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
    if pin is not None:
        study.set_user_attr(PIN_ATTR, asdict(pin()))
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


@contextlib.contextmanager
def _experimental_ok():
    """The heartbeat, stale-trial and metric-name APIs a sweep relies on are marked
    experimental; the warning on each use tells a sweep's user nothing they can act on."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield


def git_add_study(study_results: Path) -> None:
    """`git add` the study's records and its SQLite storage while holding the storage's write
    lock, so that the committed database is a consistent snapshot even while workers run
    (they wait on the lock for the moment it takes)."""
    with _storage_locked(study_results):
        _git(study_results, "add", "--", ".")


def commit_study(study_results: Path, message: str) -> bool:
    """Commit the study's records and storage, and nothing else that is staged, in the git
    checkout that holds them (which may be another than the worker's code: a pinned worktree
    writing into the main checkout's results). A failure (another git command holds the
    index, a merge in progress) is logged, not raised: the next finished trial commits both."""
    try:
        with _storage_locked(study_results):
            _git(study_results, "add", "--", ".")
            _git(study_results, "commit", "--quiet", "--only", "-m", message, "--", ".")
    except subprocess.CalledProcessError as err:
        log.warning("could not commit %s: %s", study_results, (err.stderr or "").strip())
        return False
    return True


def _git(folder: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def _storage_locked(study_results: Path):
    """Hold the study's SQLite write lock (none for a server storage): no worker is then
    mid-transaction, and the database file is a consistent snapshot."""
    import sqlite3

    database = study_results / "study.db"
    if not database.exists():
        yield
        return
    connection = sqlite3.connect(database, timeout=120, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")  # no writer can be mid-transaction now
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()
