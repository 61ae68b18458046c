"""pipeline.sweep.claims on real SQLite and PostgreSQL storages: claims by one query that skips
the rows other workers hold, counts and the stale-trial scan in SQL, Optuna's private API in one
place; and a server's connection limit (a private PostgreSQL server with a low
max_connections)."""

from __future__ import annotations

import datetime
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import psycopg
import pytest
import sqlalchemy
import yaml
from optuna.trial import TrialState

from pipeline import sweep
from pipeline.errors import PipelineError
from pipeline.sweep import claims, storage
from tests.conftest import REPO_ROOT
from tests.test_sweep import POSTGRES_URL, storage_url, write_spec  # noqa: F401

PG_BIN = Path(os.environ.get("TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
SERVER_TIMEOUT_S = 60  # initdb and pg_ctl on a busy machine
BARRIER_TIMEOUT_S = 120
START_TIMEOUT_S = 600  # worker processes importing the pipeline on a busy machine
WORKERS = 4


def new_study(url: str, points: int) -> optuna.Study:
    """A study of `points` enqueued trials {"x": i} on a storage of the sweep's own."""
    study = optuna.create_study(
        study_name=f"claims-{uuid.uuid4().hex[:8]}",
        storage=sweep.open_storage(url, sweep.SweepSettings()),
    )
    for x in range(points):
        study.enqueue_trial({"x": x})
    return study


def queue_retry(study: optuna.Study, trial: optuna.Trial) -> None:
    """Close `trial` as preempted and queue its point again, as a worker does."""
    study.tell(trial, state=TrialState.FAIL)
    frozen = study._storage.get_trial(trial._trial_id)
    sweep.RetryInterruptedTrial(max_retries=3)(study, frozen, preempted=True)


def test_optuna_rdb_reads_and_writes_the_installed_optunas_rows(tmp_path):
    """The one reach into Optuna's private API, against the installed version: the storage
    under its cache, the study's id, a row as Optuna returns the trial, and the start time a
    claim writes as Optuna's own RUNNING does (naive UTC in the table, local in the trial)."""
    study = new_study(f"sqlite:///{tmp_path / 'study.db'}", points=2)
    rdb = claims.optuna_rdb(study)
    assert isinstance(rdb.storage, optuna.storages.RDBStorage)
    assert rdb.study_id == study._study_id
    with rdb.transaction() as session:
        row = session.query(rdb.models.TrialModel).filter_by(study_id=rdb.study_id).first()
        frozen = rdb.frozen(row)
    assert frozen == study.trials[0]
    assert frozen.system_attrs["fixed_params"] == {"x": 0}
    before = datetime.datetime.now().replace(microsecond=0)
    claimed = sweep.claim_waiting_trial(study)
    ran = study.ask()  # Optuna's own WAITING -> RUNNING, for the same clock
    after = datetime.datetime.now()
    by_optuna = study._storage.get_trial(ran._trial_id).datetime_start
    by_claim = study._storage.get_trial(claimed._trial_id).datetime_start
    assert before <= by_claim <= by_optuna <= after
    with rdb.transaction() as session:
        (stored,) = session.execute(
            sqlalchemy.select(rdb.started_utc).where(
                rdb.models.TrialModel.trial_id == claimed._trial_id
            )
        ).one()
    utc = by_claim.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    assert stored == utc
    # Optuna's cache knows the claimed trial: its parameters are written through it.
    assert claimed.suggest_categorical("x", [0, 1]) == 0
    assert study._storage.get_trial(claimed._trial_id).params == {"x": 0}


def test_retries_go_first_in_number_order_then_fresh_points(storage_url):  # noqa: F811
    study = new_study(storage_url, points=4)
    first, second = sweep.claim_waiting_trial(study), sweep.claim_waiting_trial(study)
    queue_retry(study, second)  # queued as trial 4
    queue_retry(study, first)  # queued as trial 5
    order = [sweep.claim_waiting_trial(study).number for _ in range(4)]
    assert order == [4, 5, 2, 3]
    assert sweep.claim_waiting_trial(study) is None


def test_a_filter_passes_over_trials_across_pages_and_leaves_them_waiting(storage_url):  # noqa: F811
    """--deadline's filter: a worker takes the first trial it accepts, however many trials
    before it are passed over (more than a page of them), and leaves those WAITING; a retry it
    refuses does not stop it from taking a fresh point."""
    points = 2 * claims.CLAIM_PAGE + 3
    study = new_study(storage_url, points)
    last = points - 1
    claimed = sweep.claim_waiting_trial(
        study, accept=lambda t: t.system_attrs["fixed_params"]["x"] == last
    )
    assert claimed.number == last
    states = Counter(t.state for t in study.get_trials(deepcopy=False))
    assert states == {TrialState.WAITING: points - 1, TrialState.RUNNING: 1}
    assert sweep.claim_waiting_trial(study, accept=lambda t: False) is None
    queue_retry(study, claimed)
    fresh = sweep.claim_waiting_trial(study, accept=lambda t: "failed_trial" not in t.system_attrs)
    assert fresh.number == 0
    assert sweep.claim_waiting_trial(study).number == points  # the retry, queued last


def test_counts_are_the_studys_own(storage_url):  # noqa: F811
    study = new_study(storage_url, points=5)
    other = new_study(storage_url, points=3)  # another study in the same database
    running = sweep.claim_waiting_trial(study)
    study.tell(sweep.claim_waiting_trial(study), 1.0)
    study.tell(sweep.claim_waiting_trial(study), state=TrialState.PRUNED)
    assert claims.count_trials(study, claims.FINISHED) == 2
    assert claims.count_trials(study, (TrialState.WAITING,)) == 2
    assert claims.count_trials(study, (TrialState.RUNNING,)) == 1
    assert claims.count_trials(other, (TrialState.WAITING,)) == 3
    study.tell(running, state=TrialState.FAIL)
    assert claims.count_trials(study, (TrialState.RUNNING,)) == 0


def test_the_stale_trial_scan_retries_only_trials_claimed_long_ago_without_a_heartbeat(
    storage_url,  # noqa: F811
):
    study = new_study(storage_url, points=4)
    silent, beating, recent = (sweep.claim_waiting_trial(study) for _ in range(3))
    study._storage.record_heartbeat(beating._trial_id)
    rdb = claims.optuna_rdb(study)
    long_ago = datetime.datetime.now() - datetime.timedelta(hours=1)
    with rdb.transaction() as session:
        for trial in (silent, beating):
            session.get(rdb.models.TrialModel, trial._trial_id).datetime_start = long_ago
    claims.fail_trials_without_heartbeat(study, grace_period=60)
    trials = study.get_trials(deepcopy=False)
    assert [trials[t.number].state for t in (silent, beating, recent)] == [
        TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]  # fmt: skip
    (retry,) = [t for t in trials if "failed_trial" in t.system_attrs]
    assert retry.state == TrialState.WAITING and retry.system_attrs["failed_trial"] == 0
    assert retry.system_attrs["fixed_params"] == {"x": 0}
    claims.fail_trials_without_heartbeat(study, grace_period=60)  # again: nothing new
    assert len(study.get_trials(deepcopy=False)) == len(trials)


def test_a_server_storage_gets_the_claim_indexes_once():
    study = new_study(POSTGRES_URL, points=1)
    engine = claims.optuna_rdb(study).storage.engine
    storage._index_claims(engine)  # a second worker: finds them there
    with engine.connect() as connection:
        found = connection.execute(
            sqlalchemy.text("SELECT indexname FROM pg_indexes WHERE indexname = ANY(:names)"),
            {"names": list(storage.CLAIM_INDEXES)},
        ).scalars()
        assert sorted(found) == sorted(storage.CLAIM_INDEXES)


# ---- a private PostgreSQL server with a low max_connections ----


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def small_server():
    """A PostgreSQL server of its own in a temp dir, admitting MAX_CONNECTIONS clients
    (superusers included): yields its URL. Skipped without PostgreSQL's server binaries, or as
    root without a `postgres` user to run them (the server refuses root)."""
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL server binaries in {PG_BIN} (TEST_PG_BIN)")
    run_as: list[str] = []
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root with no 'postgres' user to run a server as")
        run_as = ["runuser", "-u", "postgres", "--"]
    folder = Path(tempfile.mkdtemp(prefix="sweep-pg-"))
    if run_as:
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    data, port = folder / "data", _free_port()

    def pg(*args: str) -> None:
        subprocess.run([*run_as, *args], check=True, capture_output=True, timeout=SERVER_TIMEOUT_S)

    pg(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync")
    options = (f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off "
               f"-c max_connections={MAX_CONNECTIONS} -c superuser_reserved_connections=0")  # fmt: skip
    pg(str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(folder / "log"),
       "-w", "-t", str(SERVER_TIMEOUT_S), "start")  # fmt: skip
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        pg(str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(folder, ignore_errors=True)


# Room for WORKERS workers' loops and heartbeats at once, and the test's own connection: a
# worker that kept its pooled connections between uses would hold 2 x WORKERS all the time.
MAX_CONNECTIONS = 2 * WORKERS + 2


def client_connections(connection: psycopg.Connection) -> int:
    """The server's client connections other than `connection`."""
    return connection.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
        "AND pid <> pg_backend_pid()"
    ).fetchone()[0]


IN_TRIAL_WORKER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from pipeline import sweep

    spec_path, storage, folder, timeout = sys.argv[1:5]

    def trial_fn(spec, trial, root):
        Path(folder, f"in-trial-{trial.number}").touch()
        released_by = time.monotonic() + float(timeout)
        while not Path(folder, "release").exists():
            assert time.monotonic() < released_by, "never released"
            time.sleep(0.05)
        return 1.0

    sweep.run_worker(sweep.load_spec(spec_path), storage, Path(folder) / "results", n_trials=1,
                     trial_fn=trial_fn, allow_mixed=True)
    """
)


@pytest.mark.slow
def test_workers_hold_no_connection_while_their_trials_run(tmp_path, small_server):
    """WORKERS worker processes (the sweep's own loop), each in a trial: between their uses of
    the storage they hold no connection, so only a heartbeat being recorded at that moment can
    hold one (at most one per worker)."""
    spec_path = write_spec(tmp_path, f"held_{uuid.uuid4().hex[:8]}")
    raw = yaml.safe_load(spec_path.read_text())
    del raw["settings"]  # the default heartbeats: a busy machine's late beat is not a death
    spec_path.write_text(yaml.safe_dump(raw))
    spec = sweep.load_spec(spec_path)
    sweep.open_study(spec, sweep.open_storage(small_server, spec.settings))
    script = tmp_path / "in_trial_worker.py"
    script.write_text(IN_TRIAL_WORKER)
    command = [sys.executable, str(script), str(spec_path), small_server, str(tmp_path),
               str(2 * START_TIMEOUT_S)]  # fmt: skip
    workers = [subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True) for _ in range(WORKERS)]  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while len(list(tmp_path.glob("in-trial-*"))) < WORKERS:
            assert time.monotonic() < deadline, "the workers never all reached a trial"
            ended = [worker for worker in workers if worker.poll() is not None]
            assert not ended, [(w.returncode, w.stdout.read()) for w in ended]
            time.sleep(0.1)
        with psycopg.connect(small_server) as connection:
            held = client_connections(connection)
    finally:
        (tmp_path / "release").touch()
        outputs = [worker.communicate(timeout=BARRIER_TIMEOUT_S)[0] for worker in workers]
    assert [worker.returncode for worker in workers] == [0] * WORKERS, outputs
    assert held <= WORKERS
    study = optuna.load_study(
        study_name=spec.study, storage=sweep.open_storage(small_server, spec.settings)
    )
    assert Counter(t.state for t in study.trials)[TrialState.COMPLETE] == WORKERS


def test_a_server_that_admits_no_more_connections_is_named_at_once(small_server, monkeypatch):
    """ "too many clients" does not pass within a retry's wait (the clients are other workers,
    for the whole study): the worker hears it at once, with what to do."""
    waits: list[float] = []
    monkeypatch.setattr(storage.time, "sleep", waits.append)
    others = [psycopg.connect(small_server) for _ in range(MAX_CONNECTIONS)]
    try:
        with pytest.raises(PipelineError) as refused:
            sweep.open_storage(small_server, sweep.SweepSettings())
    finally:
        for other in others:
            other.close()
    message = str(refused.value)
    assert "too many clients" in message
    assert "max_connections" in message and "PgBouncer" in message
    assert waits == []
