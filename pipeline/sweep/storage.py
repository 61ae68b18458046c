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
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RDBStorage
from sqlalchemy import event
from sqlalchemy.pool import NullPool

from pipeline.errors import ConfigError, PipelineError
from pipeline.redaction import hide_password, hide_passwords
from pipeline.sweep.claims import RETRY_OF_ATTR, RetryInterruptedTrial, optuna_table_names
from pipeline.sweep.pin import PIN_ATTR, Pin
from pipeline.sweep.pruning import build_pruner
from pipeline.sweep.spec import STUDY_DB, StudySpec, SweepSettings

log = logging.getLogger(__name__)

GRID_READY_ATTR = "grid_enqueued"


def default_storage(spec: StudySpec, results_root: Path) -> str:
    return f"sqlite:///{(results_root / spec.study / STUDY_DB).resolve()}"


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
        refuse_a_foreign_sqlite_file(Path(path))
        # Wait on SQLite's write lock instead of failing with "database is locked". No pool:
        # each session opens the file anew, so that a study.db replaced under running workers
        # (`git pull` or `git checkout` of the committed storage writes a new file) is the one
        # they go on with; a pooled connection would hold the deleted file, where SQLite
        # refuses every write ("attempt to write a readonly database").
        engine_kwargs = {"connect_args": {"timeout": 120}, "poolclass": NullPool}
    else:
        # No pool: a worker holds a server connection only while it reads or writes the study
        # (at most two at once: its loop and its trial's heartbeat), none while a trial trains,
        # so the server's connection limit bounds the workers reading at one moment, not the
        # workers of the study.
        engine_kwargs = {"poolclass": NullPool}
    retry = RetryInterruptedTrial(max_retries=settings.max_retries)
    for attempt in range(attempts):
        try:
            with experimental_warnings_silenced():
                storage = RDBStorage(
                    url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=settings.heartbeat_interval,
                    grace_period=settings.grace_period,
                    heartbeat_stale_trial_callback=retry,
                )
            if url.startswith("sqlite"):
                _begin_sqlite_transactions_immediately(storage.engine)
            elif storage.engine.dialect.name == "postgresql":
                _index_claims(storage.engine)
            return storage
        except Exception as err:  # concurrent CREATE TABLE / version row races
            if attempt == attempts - 1 or _lasting(err):
                raise PipelineError(
                    f"cannot open Optuna storage {hide_password(url)}: {hide_passwords(str(err))}"
                    + (TOO_MANY_CONNECTIONS_ADVICE if too_many_connections(err) else "")
                ) from err
            time.sleep(0.5 + attempt)
    raise AssertionError("unreachable")


SQLITE_HEADER = b"SQLite format 3\0"  # the first bytes of every SQLite database file


def refuse_a_foreign_sqlite_file(path: Path) -> None:
    """Refuse, before Optuna writes to it, a file that is not an SQLite database or that holds
    tables other than Optuna's (a database of the user's own named by mistake: Optuna would add
    its tables to it). Read-only: the file is left byte for byte."""
    import sqlite3

    if not path.is_file() or path.stat().st_size == 0:  # an empty file: a new database
        return
    with open(path, "rb") as file:
        header = file.read(len(SQLITE_HEADER))
    if header != SQLITE_HEADER:  # SQLite takes a file shorter than its header for a new one
        raise ConfigError(f"--storage {path}: not an SQLite database (no SQLite header)")
    try:
        uri = f"{path.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=120)) as database:
            rows = database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            tables = {name for (name,) in rows}
    except sqlite3.DatabaseError as err:
        raise ConfigError(f"--storage {path}: not an SQLite database ({err})") from None
    ours = {*optuna_table_names(), "alembic_version"}
    foreign = sorted(name for name in tables - ours if not name.startswith("sqlite_"))
    if foreign:
        raise ConfigError(
            f"--storage {path} holds tables that are not Optuna's ({', '.join(foreign)}): a "
            "study's storage is a database of its own. Name a new file, or the study.db of a "
            "study, and leave this one as it is"
        )


# What the server or driver says when asking again cannot help: the database or user is not
# there, the password is wrong, the host has no address, the driver is not installed.
LASTING_ERRORS = ("does not exist", "authentication failed", "no password supplied",
                  "could not translate host name", "unable to open database file",
                  "No module named")  # fmt: skip
# What a server says when it admits no more connections (PostgreSQL: its max_connections,
# reserved slots, a role's or database's CONNECTION LIMIT; MySQL: max_connections). Its
# clients do not go away within a retry's wait: they are other workers, for the whole study.
TOO_MANY_CONNECTIONS = ("too many clients", "too many connections", "connection slots are reserved")
TOO_MANY_CONNECTIONS_ADVICE = (
    ". The server admits no more connections: a sweep worker holds at most two at once (its "
    "loop and its trial's heartbeat) and none while a trial trains. Raise the server's "
    "max_connections (or the role's CONNECTION LIMIT), put a connection pooler such as "
    "PgBouncer in front of it, or start fewer workers."
)


def too_many_connections(err: BaseException) -> bool:
    """Whether `err` (or the database error under it) is the server refusing a connection."""
    while err is not None:
        if any(marker in str(err).lower() for marker in TOO_MANY_CONNECTIONS):
            return True
        err = err.__cause__
    return False


def _lasting(err: Exception) -> bool:
    """Whether opening the storage failed for a reason a retry cannot remove (the retries are
    for workers racing to create the schema): the user hears it at once, not ~50 s later."""
    return any(marker in str(err) for marker in LASTING_ERRORS) or too_many_connections(err)


# Indexes for the claims' queries on a server (`claims`): a worker's questions then cost the
# same in a study of 100 trials and of 100,000. Optuna's schema indexes trials by study only.
# SQLite files are left as Optuna made them (a committed study.db changes only by its trials).
CLAIM_INDEXES = {
    "ix_trials_study_id_state_number": "trials (study_id, state, number)",
    "ix_trial_system_attributes_retry": (
        f"trial_system_attributes (trial_id) WHERE key = '{RETRY_OF_ATTR}'"
    ),
}


def _index_claims(engine) -> None:
    """Create the CLAIM_INDEXES a PostgreSQL storage lacks. Workers starting together may race
    to create one: whichever loses finds it there."""
    for name, definition in CLAIM_INDEXES.items():
        with engine.connect() as connection:
            if connection.exec_driver_sql(f"SELECT to_regclass('{name}')").scalar() is not None:
                continue
        try:
            with engine.begin() as connection:
                connection.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS {name} ON {definition}")
        except sqlalchemy.exc.DBAPIError as err:
            with engine.connect() as connection:
                if connection.exec_driver_sql(f"SELECT to_regclass('{name}')").scalar() is None:
                    # A role without CREATE on the schema: claims stay right, only slower.
                    log.warning("cannot create index %s (claims read more): %s", name, err.orig)


@contextlib.contextmanager
def refused_connections_named(url: str):
    """A worker whose server refuses it a connection mid-study stops saying why and what to
    do, instead of with a traceback (retrying would not help: see TOO_MANY_CONNECTIONS)."""
    try:
        yield
    except PipelineError:
        raise
    except Exception as err:
        if not too_many_connections(err):
            raise
        cause = err.__cause__ or err
        raise PipelineError(
            f"Optuna storage {hide_password(url)} refused a connection: "
            f"{hide_passwords(str(cause))}{TOO_MANY_CONNECTIONS_ADVICE}"
        ) from err


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
        study_name=spec.study,
        storage=storage,
        sampler=_sampler(spec),
        pruner=build_pruner(spec.pruner),
    )
    try:
        study = optuna.create_study(direction=spec.direction, **kwargs)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(**kwargs)
        if study.metric_names is None:  # a study created before its objective was named
            with experimental_warnings_silenced():
                study.set_metric_names([spec.metric])
        if spec.kind == "grid":
            _wait_for_grid(study, spec)
        return study
    with experimental_warnings_silenced():
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
def experimental_warnings_silenced():
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

    database = study_results / STUDY_DB
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
