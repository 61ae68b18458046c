"""pipeline.sweep: specs, and workers cooperating on real SQLite and PostgreSQL storages.

The storage tests run real worker processes (the sweep's own `run_worker`) with a cheap
objective in place of training, so that races and SIGKILLs can be exercised in seconds; the
end-to-end smoke study with real training is in test_sweep_e2e.py.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import optuna
import pytest
import sqlalchemy
import yaml
from optuna.trial import TrialState

from pipeline import sweep
from pipeline.errors import ConfigError
from pipeline.sweep.cli import cli
from pipeline.sweep.deadline import WALL_TIME_ATTR
from pipeline.sweep.heartbeat import heartbeat
from tests.conftest import REPO_ROOT, frameworks_loaded_by

POSTGRES_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")

# The slow point's first attempt: long enough to be killed mid-trial, and to beat (every 1 s)
# for well over BEATS_AFTER_REPLACEMENT_S after its storage file was replaced under it.
BEATS_AFTER_REPLACEMENT_S = 10
SLOW_POINT_S = 25

WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from pipeline import sweep
    from pipeline.errors import Preempted

    spec_path, storage, log_path, results, slow_point = sys.argv[1:6]

    def trial_fn(spec, trial, root):
        params = sweep.suggest_params(spec, trial)
        point = f"{params['seed']}-{trial.params['variant']}"
        with open(log_path, "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "number": trial.number, "point": point}) + "\\n")
        retry = trial.study._storage.get_trial(trial._trial_id).system_attrs.get("failed_trial")
        if point == slow_point and retry is None and os.environ.get("PREEMPT_SLOW_POINT"):
            raise Preempted("training stopped by SIGTERM at step 3: saved last.ckpt")
        time.sleep(SLOW_POINT_S if point == slow_point and retry is None else 0.3)
        return float(params["seed"])

    sweep.run_worker(sweep.load_spec(spec_path), storage, Path(results), trial_fn=trial_fn)
    """
)


def grid_point(params: dict) -> dict:
    """The grid point of a trial's params (a trial that ran also records the config keys its
    variant sets, for the dashboard)."""
    return {key: params[key] for key in ("variant", "seed")}


def write_spec(tmp_path: Path, name: str, variants: int = 3, seeds: int = 2) -> Path:
    spec = {
        "study": name,
        "kind": "grid",
        "base_experiment": "smoke",
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "seeds": list(range(1, seeds + 1)),
        "variants": {f"heads_{h}": {"model.heads": h} for h in [1, 2, 4, 8][:variants]},
        "settings": {"heartbeat_interval": 1, "grace_period": 3, "poll_interval": 0.5},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start_worker(
    tmp_path: Path, spec: Path, storage: str, slow_point: str = "", env: dict | None = None
) -> subprocess.Popen:
    script = tmp_path / "worker.py"
    script.write_text(f"SLOW_POINT_S = {SLOW_POINT_S}\n{WORKER}")
    log = tmp_path / "trials.jsonl"
    return subprocess.Popen(
        [
            sys.executable,
            str(script),
            str(spec),
            storage,
            str(log),
            str(tmp_path / "results"),
            slow_point,
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so a SIGKILL takes the whole worker
        env=env,
    )


def start_slow_point(tmp_path: Path, spec: Path, storage: str) -> subprocess.Popen:
    """A worker on whose point 1-heads_1 a first attempt takes SLOW_POINT_S, once that point runs."""
    worker = start_worker(tmp_path, spec, storage, slow_point="1-heads_1")
    deadline = time.monotonic() + 60
    while not any(e["point"] == "1-heads_1" for e in started_points(tmp_path)):
        assert time.monotonic() < deadline and worker.poll() is None
        time.sleep(0.2)
    return worker


def started_points(tmp_path: Path) -> list[dict]:
    log = tmp_path / "trials.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def wait_all(workers: list[subprocess.Popen], timeout: float = 240) -> None:
    for worker in workers:
        out, _ = worker.communicate(timeout=timeout)
        assert worker.returncode == 0, out
        assert "database is locked" not in out


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path):
    """A fresh study location on each real storage."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'study.db'}"
        return
    yield POSTGRES_URL


def load(spec_path: Path, url: str) -> optuna.Study:
    spec = sweep.load_spec(spec_path)
    return optuna.load_study(study_name=spec.study, storage=url)


def test_grid_is_the_gridsampler_space():
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    sampler = optuna.samplers.GridSampler(spec.grid_space())
    expected = [dict(zip(sampler._param_names, values)) for values in sampler._all_grids]
    key = lambda point: (point["variant"], point["seed"])  # noqa: E731
    assert sorted(spec.grid(), key=key) == sorted(expected, key=key)
    assert len(spec.grid()) == 4


def test_specs_in_repo_are_valid():
    table3 = sweep.load_spec(REPO_ROOT / "ablations/table3.yaml")
    heads = {v.get("model.heads") for v in table3.variants.values()} - {None}
    assert heads == {1, 2, 8, 16}  # plus the base recipe's 4 heads
    assert len(table3.seeds) >= 2
    smoothing = sweep.load_spec(REPO_ROOT / "ablations/table3_label_smoothing.yaml")
    assert smoothing.study != table3.study and smoothing.budget == table3.budget
    assert smoothing.variants == {
        name: table3.variants[name]
        for name in ("base", "label_smoothing_0.0", "label_smoothing_0.2")
    }
    search = sweep.load_spec(REPO_ROOT / "ablations/search.yaml")
    assert set(search.space) == {
        "model.heads",
        "model.positional",
        "model.dropout",
        "train.label_smoothing",
    }
    assert search.pruner


def test_a_spec_extending_another_reruns_the_chosen_variants_under_its_own_study(tmp_path):
    parent = yaml.safe_load(write_spec(tmp_path, "parent").read_text())
    parent["paper"] = {
        "heads_2": {"bleu": -0.6, "rows": "(A)"},
        "heads_4": {"bleu": 0.1, "rows": "(A)"},
    }
    (tmp_path / "parent.yaml").write_text(yaml.safe_dump(parent))
    child = tmp_path / "child.yaml"
    child.write_text(yaml.safe_dump({"extends": "parent.yaml", "study": "child",
                                     "variants": ["heads_1", "heads_2"], "seeds": [7]}))  # fmt: skip
    spec = sweep.load_spec(child)
    assert spec.study == "child" and spec.seeds == [7]
    assert spec.variants == {"heads_1": {"model.heads": 1}, "heads_2": {"model.heads": 2}}
    assert spec.paper == {"heads_2": parent["paper"]["heads_2"]}
    assert (spec.base_experiment, spec.settings) == (parent["base_experiment"], sweep.load_spec(
        tmp_path / "parent.yaml").settings)  # fmt: skip


@pytest.mark.parametrize(
    ("child", "message"),
    [
        ({"variants": ["heads_3"]}, r"child\.yaml: variants \['heads_3'\] are not variants of"),
        ({"study": "parent"}, r"child\.yaml: key 'study' must name a study of its own"),
        ({"extends": "nowhere.yaml"}, r"child\.yaml: extends: .*nowhere\.yaml not found"),
        (
            {"extends": None, "variants": ["heads_1"]},
            r"child\.yaml: key 'variants': a list of names is for a spec that 'extends'",
        ),
    ],
)
def test_a_bad_extending_spec_is_named(tmp_path, child, message):
    write_spec(tmp_path, "parent")
    path = tmp_path / "child.yaml"
    raw = {"extends": "parent.yaml", "study": "child", **child}
    if raw["extends"] is None:
        raw = {**yaml.safe_load((tmp_path / "parent.yaml").read_text()), "study": "child",
               "variants": child["variants"]}  # fmt: skip
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=message):
        sweep.load_spec(path)


def test_bad_variant_is_refused_before_compute(tmp_path):
    spec = yaml.safe_load(write_spec(tmp_path, "bad").read_text())
    spec["variants"]["heads_3"] = {"model.heads": 3}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=r"variant 'heads_3'.*model\.heads"):
        sweep.load_spec(path)


def test_unknown_spec_key_is_named(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump({"study": "x", "kind": "grid", "seedz": [1]}))
    with pytest.raises(ConfigError, match="seedz"):
        sweep.load_spec(path)


def test_a_paper_entry_with_an_unknown_key_is_named(tmp_path):
    spec = yaml.safe_load(write_spec(tmp_path, "paper").read_text())
    variant = next(iter(spec["variants"]))
    spec["paper"] = {variant: {"bleu": -0.1, "rows": "(E)", "no_diference": "nearly identical"}}
    path = tmp_path / "paper.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=rf"paper\.{variant}.*no_diference"):
        sweep.load_spec(path)


@pytest.mark.parametrize("url", ["journal.log", "inmemory"])
def test_storage_other_than_an_rdb_url_is_refused_saying_why(url):
    with pytest.raises(ConfigError, match="need an RDB storage") as error:
        sweep.open_storage(url, sweep.SweepSettings())
    assert url in str(error.value)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_sqlite_storage_is_refused_saying_why(url):
    with pytest.raises(ConfigError, match="in-memory SQLite database") as error:
        sweep.open_storage(url, sweep.SweepSettings())
    assert repr(url) in str(error.value)


def test_concurrent_claims_never_hand_one_waiting_trial_to_two_workers(storage_url):
    # Threads with their own storages (own connections) race for 60 enqueued trials; without
    # BEGIN IMMEDIATE on SQLite, ~20 of them were claimed twice per run.
    name = f"claims-{uuid.uuid4().hex[:8]}"
    settings = sweep.SweepSettings()
    study = optuna.create_study(study_name=name, storage=sweep.open_storage(storage_url, settings))
    for x in range(60):
        study.enqueue_trial({"x": x})
    claims: Counter[int] = Counter()
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def claim_until_none() -> None:
        try:
            storage = sweep.open_storage(storage_url, settings)
            mine = optuna.load_study(study_name=name, storage=storage)
            start.wait(timeout=120)
            while (trial := sweep.claim_waiting_trial(mine)) is not None:
                claims[trial._trial_id] += 1
        except BaseException as error:  # reported by the test, not lost in the thread
            errors.append(error)
            start.abort()

    workers = [threading.Thread(target=claim_until_none, daemon=True) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=300)
    assert not any(worker.is_alive() for worker in workers), "a claiming thread hangs"
    assert not errors, errors
    assert len(claims) == 60 and set(claims.values()) == {1}, claims.most_common(3)


def test_a_retried_point_is_claimed_before_fresh_ones(tmp_path):
    """An interrupted point resumes from its checkpoint: it goes first, not after the grid."""
    storage = sweep.open_storage(f"sqlite:///{tmp_path / 'study.db'}", sweep.SweepSettings())
    study = optuna.create_study(study_name="order", storage=storage)
    for x in range(3):
        study.enqueue_trial({"x": x})
    first = sweep.claim_waiting_trial(study)
    assert first.number == 0
    study.tell(first, state=TrialState.FAIL)
    sweep.RetryInterruptedTrial(max_retries=3)(study, study.trials[0], preempted=True)
    retry = sweep.claim_waiting_trial(study)
    assert retry.number == 3 and study.trials[3].system_attrs["failed_trial"] == 0
    assert [sweep.claim_waiting_trial(study).number for _ in range(2)] == [1, 2]
    assert sweep.claim_waiting_trial(study) is None


def test_retry_failed_queues_each_point_that_failed_with_an_error_once(tmp_path, capsys):
    """A trial that raised (a bug, fixed since) is never retried by itself; `--retry-failed`
    queues its point again, first in line, and leaves finished, waiting and retried points
    alone."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    spec_path = write_spec(tmp_path, "retry", variants=2, seeds=2)
    spec = sweep.load_spec(spec_path)
    study = sweep.open_study(spec, sweep.open_storage(url, spec.settings))
    failed, finished, preempted = (sweep.claim_waiting_trial(study) for _ in range(3))
    study.tell(failed, state=TrialState.FAIL)
    study.tell(finished, 30.0)
    study.tell(preempted, state=TrialState.FAIL)  # ... and queued again, as a worker does
    sweep.RetryInterruptedTrial(max_retries=3)(study, study.trials[preempted.number], True)

    cli([str(spec_path), "--storage", url, "--retry-failed"])
    assert capsys.readouterr().out.endswith("1 failed point(s) of study 'retry' queued again\n")
    study = load(spec_path, url)
    queued = [t for t in study.trials if t.system_attrs.get("failed_trial") == failed.number]
    assert len(queued) == 1 and queued[0].state == TrialState.WAITING
    assert queued[0].params == study.trials[failed.number].params
    assert queued[0].system_attrs["deaths"] == 0
    cli([str(spec_path), "--storage", url, "--retry-failed"])  # again: nothing new
    assert capsys.readouterr().out.startswith("0 failed point(s)")
    assert len(load(spec_path, url).trials) == len(study.trials)
    # the retried points go before the point never started
    resumed = [sweep.claim_waiting_trial(study).number for _ in range(2)]
    assert sorted(resumed) == sorted(
        t.number for t in study.trials if "failed_trial" in t.system_attrs
    )


@pytest.mark.slow
def test_workers_started_at_once_run_each_point_once(tmp_path, storage_url):
    spec_path = write_spec(tmp_path, f"race-{uuid.uuid4().hex[:8]}")
    workers = [start_worker(tmp_path, spec_path, storage_url) for _ in range(3)]
    wait_all(workers)
    study = load(spec_path, storage_url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 6 and len(study.trials) == 6
    points = Counter(entry["point"] for entry in started_points(tmp_path))
    assert len(points) == 6 and set(points.values()) == {1}, points
    assert len({entry["pid"] for entry in started_points(tmp_path)}) >= 2  # real sharing

    # Re-running the finished study's command runs nothing new.
    wait_all([start_worker(tmp_path, spec_path, storage_url)])
    assert len(load(spec_path, storage_url).trials) == 6
    assert len(started_points(tmp_path)) == 6


def test_a_one_point_grid_runs_and_finishes(tmp_path):
    """GridSampler, the grid's sampler once, failed to tell the only trial of a one-point
    grid (KeyError: 'grid_id': our claimed trials never pass through its `ask`)."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    spec_path = write_spec(tmp_path, f"one-{uuid.uuid4().hex[:8]}", variants=1, seeds=1)
    wait_all([start_worker(tmp_path, spec_path, url)], timeout=120)
    (trial,) = load(spec_path, url).trials
    assert trial.state == TrialState.COMPLETE
    assert trial.params == {"variant": "heads_1", "seed": 1, "model.heads": 1}


@pytest.mark.slow
def test_killed_worker_trial_is_rerun_by_another(tmp_path, storage_url):
    spec_path = write_spec(tmp_path, f"kill-{uuid.uuid4().hex[:8]}", variants=2)
    victim = start_slow_point(tmp_path, spec_path, storage_url)
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)

    survivor = start_worker(tmp_path, spec_path, storage_url, slow_point="1-heads_1")
    wait_all([survivor], timeout=120)
    study = load(spec_path, storage_url)
    states = Counter(t.state for t in study.trials)
    assert states[TrialState.COMPLETE] == 4
    assert states[TrialState.RUNNING] == 0 and states[TrialState.WAITING] == 0
    assert states[TrialState.FAIL] == 1  # the killed attempt, retried once
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") is not None]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert grid_point(retried[0].params) == {"variant": "heads_1", "seed": 1}


@pytest.mark.slow
def test_a_study_db_replaced_under_a_running_worker_is_the_one_it_goes_on_with(tmp_path):
    """`git pull` or `git checkout` of a committed study.db writes a new file under the running
    workers (seen in this repository: a `git stash` of the live storage). A worker that kept its
    connection to the old, deleted file could record nothing more there (SQLite: "attempt to
    write a readonly database"): its heartbeats stopped and its trial went unfinished."""
    db = tmp_path / "study.db"
    url = f"sqlite:///{db}"
    spec_path = write_spec(tmp_path, f"replaced-{uuid.uuid4().hex[:8]}", variants=2)
    worker = start_slow_point(tmp_path, spec_path, url)
    replacement = tmp_path / "study.db.new"
    shutil.copy2(db, replacement)
    os.replace(replacement, db)  # a new file (inode) at the same path, as git writes it
    replaced_at = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    out, _ = worker.communicate(timeout=240)
    assert worker.returncode == 0 and "readonly database" not in out, out
    study = load(spec_path, url)
    assert Counter(t.state for t in study.trials) == {TrialState.COMPLETE: 4}
    slow = next(
        t for t in study.trials if grid_point(t.params) == {"variant": "heads_1", "seed": 1}
    )
    with sqlite3.connect(db) as connection:  # Optuna stamps heartbeats with SQLite's UTC time
        (last_beat,) = connection.execute(
            "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = ?", (slow._trial_id,)
        ).fetchone()
    # The slow trial ran on, beating into the new file.
    beating = datetime.timedelta(seconds=BEATS_AFTER_REPLACEMENT_S)
    assert datetime.datetime.fromisoformat(last_beat) > replaced_at + beating


def test_a_heartbeat_the_storage_refuses_is_logged_and_beats_again(tmp_path, caplog):
    """A storage that refuses a heartbeat for a while (here SQLite's write lock, held by another
    connection) must not end the heartbeat thread: it used to die at the first error, and the
    trial ran on with no heartbeat, for the next worker to take over as dead."""
    db = tmp_path / "study.db"
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{db}", engine_kwargs={"connect_args": {"timeout": 0.05}}
    )
    trial_id = optuna.create_study(storage=storage).ask()._trial_id
    locker = sqlite3.connect(db, isolation_level=None)
    with heartbeat(storage, trial_id, interval=0.2):
        locker.execute("BEGIN EXCLUSIVE")
        time.sleep(1.0)  # every beat in this second: "database is locked"
        locker.execute("ROLLBACK")
        unlocked = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None, microsecond=0)
        time.sleep(1.5)
    assert "cannot record its heartbeat: " in caplog.text and "database is locked" in caplog.text
    (last_beat,) = locker.execute(
        "SELECT heartbeat FROM trial_heartbeats WHERE trial_id = ?", (trial_id,)
    ).fetchone()
    assert datetime.datetime.fromisoformat(last_beat) >= unlocked


CLAIM_AND_DIE = textwrap.dedent(
    """
    import os, signal, sys
    from pipeline import sweep

    spec = sweep.load_spec(sys.argv[1])
    study = sweep.open_study(spec, sweep.open_storage(sys.argv[2], spec.settings))
    print(sweep.claim_waiting_trial(study).number, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # dead before the trial's body ran
    """
)


@pytest.mark.slow
def test_a_worker_killed_right_after_claiming_leaves_a_trial_that_is_retried(tmp_path, storage_url):
    """The window between claiming a trial and its heartbeat thread's first beat: Optuna never
    counts a RUNNING trial without a heartbeat as stale, so a worker SIGKILLed there used to
    leave the study unfinishable (the other workers waited for ever)."""
    spec_path = write_spec(tmp_path, f"claim-{uuid.uuid4().hex[:8]}", variants=2)
    script = tmp_path / "claim_and_die.py"
    script.write_text(CLAIM_AND_DIE)
    died = subprocess.run([sys.executable, str(script), str(spec_path), storage_url],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert died.returncode == -signal.SIGKILL, died.stderr
    claimed = int(died.stdout)
    assert load(spec_path, storage_url).trials[claimed].state == TrialState.RUNNING

    wait_all([start_worker(tmp_path, spec_path, storage_url)], timeout=120)
    study = load(spec_path, storage_url)
    states = Counter(t.state for t in study.trials)
    assert states[TrialState.COMPLETE] == 4 and states[TrialState.RUNNING] == 0
    assert study.trials[claimed].state == TrialState.FAIL
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") is not None]
    assert len(retried) == 1
    assert grid_point(retried[0].params) == study.trials[claimed].system_attrs["fixed_params"]


@pytest.mark.slow
def test_preempted_trial_is_queued_again_at_once(tmp_path):
    """A trial whose training was preempted (checkpoint saved, `Preempted` raised): the worker
    stops, the attempt is closed as preempted and its point is queued again at once (no wait
    for a stale heartbeat), not counted as a death."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    spec_path = write_spec(tmp_path, f"preempt-{uuid.uuid4().hex[:8]}", variants=2)
    env = {**os.environ, "PREEMPT_SLOW_POINT": "1"}
    victim = start_worker(tmp_path, spec_path, url, slow_point="1-heads_1", env=env)
    out, _ = victim.communicate(timeout=120)
    assert victim.returncode != 0 and "Preempted: training stopped by SIGTERM" in out
    preempted = [t for t in load(spec_path, url).trials if t.params.get("variant") == "heads_1"
                 and t.params.get("seed") == 1]  # fmt: skip
    assert [t.state for t in preempted] == [TrialState.FAIL, TrialState.WAITING]
    assert preempted[0].user_attrs["preempted"] is True
    assert preempted[1].system_attrs["deaths"] == 0  # a preemption is not a death

    wait_all([start_worker(tmp_path, spec_path, url, slow_point="1-heads_1")], timeout=120)
    study = load(spec_path, url)
    states = Counter(t.state for t in study.trials)
    assert states[TrialState.COMPLETE] == 4 and states[TrialState.RUNNING] == 0
    retried = [t for t in study.trials if t.system_attrs.get("failed_trial") is not None]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert grid_point(retried[0].params) == {"variant": "heads_1", "seed": 1}


def refused_by_the_cli(spec: Path, root: Path) -> subprocess.CompletedProcess:
    """`python -m pipeline.sweep spec` (results and work dirs under `root`), asserting that it
    exits 2 with a message and no traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", str(spec), "--n-trials", "0",
         "--results-dir", str(root / "results"), "--work-dir", str(root / "work")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    return result


def confined_spec(root: Path, key: str, name: str) -> Path:
    """A valid spec but for `name` as its study (key 'study') or as its one variant."""
    spec = yaml.safe_load(write_spec(root, "confined", variants=1, seeds=1).read_text())
    if key == "study":
        spec["study"] = name
    else:
        spec["variants"] = {name: spec["variants"]["heads_1"]}
    path = root / "confined.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("key", "name"),
    [("study", "../../../escaped_study"),
     ("variants.../../../../escaped_variant", "../../../../escaped_variant")],
)  # fmt: skip
def test_names_that_would_escape_their_folders_are_refused_before_any_write(tmp_path, key, name):
    root = tmp_path / "a" / "b" / "c" / "d"  # deep enough for every '..' to stay in tmp_path
    root.mkdir(parents=True)
    path = confined_spec(root, key, name)
    before = sorted(tmp_path.rglob("*"))
    result = refused_by_the_cli(path, root)
    assert result.stderr.startswith(f"error: {path}: key '{key}': {name!r} is not a folder name")
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, inside or out


@pytest.mark.parametrize(
    ("key", "name"),
    [("study", "/tmp/absolute_study"), ("study", ".."), ("study", ""), ("study", None),
     ("variants.a\\b", "a\\b"), ("variants.nested/name", "nested/name")],
)  # fmt: skip
def test_a_study_or_variant_name_must_be_one_folder_name(tmp_path, key, name):
    path = confined_spec(tmp_path, key, name)
    with pytest.raises(ConfigError, match=re.escape(f"key '{key}': {name!r} is not a folder")):
        sweep.load_spec(path)


@pytest.mark.parametrize(
    "parent", ["/etc/passwd", "../../../../etc/passwd", "notes.txt", "list.yaml"]
)
def test_extends_names_only_a_spec_in_the_spec_folder(tmp_path, parent):
    folder = tmp_path / "a" / "b" / "c" / "d" / "specs"
    folder.mkdir(parents=True)
    write_spec(folder, "parent")
    (folder / "notes.txt").write_text("root:x:0:0:hidden-content:/root:/bin/bash\n")
    (folder / "list.yaml").write_text("- hidden-content\n")
    child = folder / "child.yaml"
    child.write_text(yaml.safe_dump({"extends": parent, "study": "child"}))
    result = refused_by_the_cli(child, tmp_path)
    assert result.stderr.startswith(f"error: {child}: key 'extends': ")
    assert ":0:0:" not in result.stderr and "hidden-content" not in result.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "work").exists()


def secret_url(database: str) -> str:
    """The test PostgreSQL (trust authentication: any password is accepted) with a password."""
    url = sqlalchemy.engine.make_url(POSTGRES_URL).set(password="s3cret-pw", database=database)
    return url.render_as_string(hide_password=False)


def files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def test_a_storage_password_is_masked_in_a_connection_error(tmp_path):
    """A database that does not exist: said at once (no retries: another try cannot help),
    with the server's own words and the password masked."""
    spec = write_spec(tmp_path, f"masked_{uuid.uuid4().hex[:8]}", variants=1, seeds=1)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", str(spec), "--n-trials", "0",
         "--storage", secret_url("nonexistent_db"), "--results-dir", str(tmp_path / "results"),
         "--work-dir", str(tmp_path / "work")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "cannot open Optuna storage postgresql://postgres:***@" in result.stderr
    assert "nonexistent_db" in result.stderr  # the real error, told
    assert "s3cret-pw" not in result.stdout + result.stderr
    assert not files_holding(tmp_path, "s3cret-pw")


def test_a_worker_that_trains_nothing_loads_no_lightning(tmp_path):
    """A worker refused, out of time or with nothing left to claim answers without loading
    Lightning (seconds in each process): that waits for a trial to train."""
    spec = write_spec(tmp_path, f"idle_{uuid.uuid4().hex[:8]}", variants=1, seeds=1)
    args = [str(spec), "--n-trials", "0", "--results-dir", str(tmp_path / "results"),
            "--work-dir", str(tmp_path / "work")]  # fmt: skip
    result = frameworks_loaded_by("pipeline.sweep", *args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "0 finished trials in sqlite:///" in result.stdout, result.stdout
    assert "lightning" not in result.stdout.splitlines()[-1], result.stdout


def test_a_database_that_does_not_exist_is_not_asked_again(monkeypatch):
    """Opening the storage retries the races of workers creating its schema, not an error
    that a retry cannot remove (before: ten tries over ~50 s)."""
    from pipeline.errors import PipelineError
    from pipeline.sweep import storage

    waits = []
    monkeypatch.setattr(storage.time, "sleep", waits.append)
    with pytest.raises(PipelineError, match='database "nonexistent_db" does not exist'):
        sweep.open_storage(secret_url("nonexistent_db"), sweep.SweepSettings())
    assert waits == []


@pytest.mark.parametrize("kind", ["a user's tables", "not a database"])
def test_a_file_that_is_not_a_studys_storage_is_refused_and_left_as_it_was(tmp_path, kind):
    """A database of the user's own (or any other file) given as --storage: exit 2 naming it,
    before Optuna adds its tables; the file unchanged byte for byte."""
    database = tmp_path / "customers.db"
    if kind == "not a database":
        database.write_bytes(b"name,city\nAda,London\n" * 100)
    else:
        with sqlite3.connect(database) as connection:
            connection.execute("CREATE TABLE customers (name TEXT, city TEXT)")
            connection.execute("INSERT INTO customers VALUES ('Ada', 'London')")
        connection.close()
    before = database.read_bytes()
    spec = write_spec(tmp_path, "foreign", variants=1, seeds=1)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", str(spec), "--n-trials", "0",
         "--storage", f"sqlite:///{database}", "--results-dir", str(tmp_path / "results"),
         "--work-dir", str(tmp_path / "work")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    expected = "not an SQLite database" if kind == "not a database" else "customers): a study"
    assert f"--storage {database}" in result.stderr and expected in result.stderr
    assert "Traceback" not in result.stderr
    assert database.read_bytes() == before


def test_a_storage_password_is_masked_in_the_workers_closing_line(tmp_path):
    spec = write_spec(tmp_path, f"masked_{uuid.uuid4().hex[:8]}", variants=1, seeds=1)
    url = secret_url(sqlalchemy.engine.make_url(POSTGRES_URL).database)
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", str(spec), "--n-trials", "0", "--storage", url,
         "--results-dir", str(tmp_path / "results"), "--work-dir", str(tmp_path / "work")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "0 finished trials in postgresql://postgres:***@127.0.0.1" in result.stdout
    assert "s3cret-pw" not in result.stdout + result.stderr
    assert not files_holding(tmp_path, "s3cret-pw")


def test_a_grid_trial_names_its_objective_and_records_the_keys_its_variant_sets(tmp_path, capsys):
    """What optuna-dashboard reads: the objective's name, and per trial the config keys the
    grid changes (base experiment's value where a variant leaves a key alone) as params with
    a distribution over the grid's values; the worker says `trial k/N` and ends with the best.
    No ExperimentalWarning on the way."""
    spec_path = tmp_path / "dash.yaml"
    spec_path.write_text(yaml.safe_dump({
        "study": "dash", "kind": "grid", "base_experiment": "smoke",
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"}, "seeds": [1],
        "variants": {"base": {}, "heads_2": {"model.heads": 2},
                     "learned": {"model.positional": "learned", "model.dropout": 0.3}},
    }))  # fmt: skip
    spec = sweep.load_spec(spec_path)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    objective = {"base": 3.0, "heads_2": 5.0, "learned": 4.0}

    def trial_fn(spec, trial, root):
        sweep.suggest_params(spec, trial)
        return objective[trial.params["variant"]]

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", optuna.exceptions.ExperimentalWarning)
        study = sweep.run_worker(spec, url, tmp_path / "results", trial_fn=trial_fn)
    assert optuna.load_study(study_name="dash", storage=url).metric_names == ["val/greedy_bleu"]
    params = {t.params["variant"]: t.params for t in study.trials}
    assert params["base"] == {"variant": "base", "seed": 1, "model.heads": 4,
                              "model.positional": "sinusoidal", "model.dropout": 0.1}  # fmt: skip
    assert params["heads_2"]["model.heads"] == 2
    assert params["learned"]["model.positional"] == "learned"
    assert params["learned"]["model.dropout"] == 0.3
    distributions = study.trials[0].distributions
    assert distributions["model.heads"] == optuna.distributions.IntDistribution(2, 4)
    assert distributions["model.dropout"] == optuna.distributions.FloatDistribution(0.1, 0.3)
    assert distributions["model.positional"].choices == ("sinusoidal", "learned")

    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("trial ")]
    # each trial's line when it starts (no time measured to say how long), then when it ends
    starts, lines = lines[0::2], lines[1::2]
    assert starts == [f"trial {k} {point}-seed1: started; {k} of 3 finished"
                      for k, point in enumerate(["base", "heads_2", "learned"])]  # fmt: skip
    assert [line.endswith(f"; {k} of 3 finished") for k, line in enumerate(lines, 1)] == [True] * 3
    assert lines[-1].startswith("trial 2 learned-seed1: val/greedy_bleu 4.00 (complete) in ")
    summary = sweep.study_summary(study, spec)
    assert summary.splitlines()[1].split()[:3] == ["1", "heads_2-seed1", "5.00"]
    # a trial's line and the summary give it one number
    assert [line for line in lines if " heads_2-seed1: " in line][0].startswith("trial 1 ")
    # the dashboard page's note: where the study stands, and no verdict from a worker
    from optuna_dashboard import get_note

    note = get_note(study)
    assert note.startswith("**dash**: 3 of 3 planned trials finished."), note
    assert "the verdicts are the report's" in note and '"Best Trial" is the highest' in note
    assert summary.splitlines()[-1] == "best: trial 1 (heads_2-seed1), val/greedy_bleu 5.00"


def test_a_trials_start_line_says_how_long_its_variants_trials_have_taken_here(tmp_path, capsys):
    """The worker's line when a trial starts gives the time a trial of its variant took in this
    study (the median of those finished; before any, the median over every finished trial)."""
    spec_path = tmp_path / "timed.yaml"
    spec_path.write_text(yaml.safe_dump({
        "study": "timed", "kind": "grid", "base_experiment": "smoke", "seeds": [1, 2],
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "variants": {"base": {}, "heads_2": {"model.heads": 2}},
    }))  # fmt: skip
    spec = sweep.load_spec(spec_path)
    took = {("base", 1): 3480.0, ("base", 2): 3960.0, ("heads_2", 1): 7500.0, ("heads_2", 2): 1.0}

    def trial_fn(spec, trial, root):
        sweep.suggest_params(spec, trial)
        point = (trial.params["variant"], trial.params["seed"])
        trial.set_user_attr(WALL_TIME_ATTR, took[point])
        return 1.0

    sweep.run_worker(spec, f"sqlite:///{tmp_path / 'study.db'}", tmp_path / "results",
                     trial_fn=trial_fn)  # fmt: skip
    starts = [line for line in capsys.readouterr().out.splitlines() if ": started" in line]
    assert starts == [
        "trial 0 base-seed1: started; 0 of 4 finished",
        "trial 1 base-seed2: started (about 58 min); 1 of 4 finished",
        "trial 2 heads_2-seed1: started (about 1 h 02 min); 2 of 4 finished",  # both bases'
        "trial 3 heads_2-seed2: started (about 2 h 05 min); 3 of 4 finished",  # its own
    ]


def test_studies_of_one_name_in_two_storages_get_work_folders_of_their_own(tmp_path):
    """Two clones of the repository, each with its own `table3` study: their trials' work
    folders differ (keyed by storage and study id), a password in the URL does not count.
    `pipeline.clean` reads the study from the folder's identity file."""
    from pipeline.clean import recorded_study
    from pipeline.sweep.work_dirs import STUDY_FILE, claim_study_work_dir, study_work_dir

    work = tmp_path / "work"
    folders = []
    for clone in ("clone_a", "clone_b"):
        url = f"sqlite:///{tmp_path / clone / 'study.db'}"
        (tmp_path / clone).mkdir()
        study = optuna.create_study(study_name="table3", storage=url)
        folders.append(claim_study_work_dir(work, "table3", url, study._study_id))
        assert study_work_dir(work, "table3", url, study._study_id) == folders[-1]
    assert folders[0] != folders[1]
    assert all(folder.parent == work and folder.name.startswith("table3-") for folder in folders)
    assert recorded_study(folders[0])["study"] == "table3" and recorded_study(work / "x") is None
    identity = json.loads((folders[0] / STUDY_FILE).read_text())
    assert identity == {"study": "table3", "storage": f"sqlite:///{tmp_path / 'clone_a/study.db'}",
                        "study_id": 1}  # fmt: skip

    secret, other = "postgresql://u:one@db/x", "postgresql://u:two@db/x"
    assert study_work_dir(work, "s", secret, 1) == study_work_dir(work, "s", other, 1)
    assert study_work_dir(work, "s", secret, 1) != study_work_dir(work, "s", secret, 2)


def test_a_point_folder_a_live_worker_trains_in_is_refused_naming_it(tmp_path):
    """A real second process holds the point's folder (as a worker does while it trains): this
    one refuses it, naming the folder and the holder; once the holder is SIGKILLed the kernel
    lets the lock go and the folder is taken."""
    from pipeline.errors import PipelineError
    from pipeline.sweep.trial import owned_folder

    work = tmp_path / "base-seed1"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "from pathlib import Path\n"
         "from pipeline.sweep.trial import owned_folder\n"
         "with owned_folder(Path(sys.argv[1]), 0):\n"
         "    print('held', flush=True)\n"
         "    time.sleep(600)\n", str(work)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(PipelineError, match=re.escape(f"trial 0: its folder {work} is in use "
                                                          f"by process {holder.pid} on")):  # fmt: skip
            with owned_folder(work, 0):
                pass
    finally:
        holder.kill()
        holder.wait(timeout=60)
    with owned_folder(work, 0):
        assert f"process {os.getpid()} on" in (work / ".lock").read_text()
