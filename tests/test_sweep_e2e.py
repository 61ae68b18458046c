"""The smoke study end to end through the real CLIs: `python -m pipeline.sweep` trains and
evaluates four trials on two workers (real Lightning, sacreBLEU, SQLite storage, W&B
offline), then `python -m pipeline.report` writes the table and charts."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.image
import optuna
import pytest
import yaml
from optuna.trial import TrialState

from pipeline import tracking
from pipeline.sweep.records import TRAINED, read_attempts
from tests.conftest import REPO_ROOT, frameworks_loaded_by, study_folder

pytestmark = pytest.mark.slow
CLI_TIMEOUT_S = 1500  # a study of a few smoke trials takes minutes; a hang fails here


def run_cli(*args: str) -> str:
    return run_cli_result(*args).stdout


def run_cli_result(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WANDB_MODE": "offline"}
    result = subprocess.run(
        [sys.executable, "-m", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
        timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ExperimentalWarning" not in result.stderr
    return result


def run_study(spec: dict, tmp_path) -> tuple[optuna.Study, object]:
    """Write `spec`, run its sweep CLI into tmp_path/results; the study and the results dir."""
    spec_path = tmp_path / f"{spec['study']}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    results = tmp_path / "results"
    run_cli("pipeline.sweep", str(spec_path), "--results-dir", str(results),
            "--work-dir", str(tmp_path / "work"))  # fmt: skip
    storage = f"sqlite:///{results / spec['study'] / 'study.db'}"
    return optuna.load_study(study_name=spec["study"], storage=storage), results


def test_smoke_study_and_report(tmp_path, multi30k_dir, monkeypatch):
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    results, work = tmp_path / "results", tmp_path / "work"
    done = run_cli_result("pipeline.sweep", "ablations/smoke.yaml", "--workers", "2",
                          "--results-dir", str(results), "--work-dir", str(work))  # fmt: skip
    out = done.stdout
    assert re.search(r"starting 2 sweep workers, \d+ thread\(s\) each", done.stderr), done.stderr

    storage = f"sqlite:///{results / 'smoke' / 'study.db'}"
    study = optuna.load_study(study_name="smoke", storage=storage)
    assert len(study.trials) == 4
    # Two workers really ran side by side: some trials overlapped in time.
    spans = sorted((t.datetime_start, t.datetime_complete) for t in study.trials)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:]))
    # What the workers said (one line per finished trial, the study's count when it finished:
    # two finishing at once may both count 2), and what optuna-dashboard reads: the
    # objective's name, the key each variant sets, every validation (steps 10 and 20) as an
    # intermediate value.
    finished = re.findall(r"\((?:complete|pruned)\) in [^;\n]*; (\d) of 4 finished", out)
    assert len(finished) == 4 and max(finished) == "4", out
    best = study.best_trial
    assert f"best: trial {best.number} ({best.params['variant']}-seed{best.params['seed']})" in out
    assert "trial work folders: " in out and "python -m pipeline.clean" in out
    assert study.metric_names == ["val/greedy_bleu"]
    for trial in study.trials:
        heads = {"base": 4, "heads_1": 1}[trial.params["variant"]]
        assert trial.params["model.heads"] == heads
        assert sorted(trial.intermediate_values) == [10, 20]
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    for trial in study.trials:
        attrs = trial.user_attrs
        assert {"val_greedy_bleu", "test_bleu", "test_chrf", "parameters", "checkpoint_dir"} <= set(
            attrs
        )
        record = results / "smoke" / "trials" / attrs["record"]
        assert attrs["record"] == f"{trial.params['variant']}-seed{trial.params['seed']}"
        for name in ("train.json", "eval.json", "params.yaml", "curve.json", "run.json",
                     "val.hyp", "test_2016_flickr.hyp"):  # fmt: skip
            assert (record / name).exists(), name
        assert not list(record.rglob("*.ckpt"))  # checkpoints stay in the work dir
        # kept relative to the work root, which a record never names by its absolute path
        assert attrs["checkpoint_dir"].startswith("<work-root>/smoke-")
    points = {(t.params["variant"], t.params["seed"]) for t in study.trials}
    assert points == {("base", 1), ("base", 2), ("heads_1", 1), ("heads_1", 2)}

    # One offline W&B run per trial, all in the study's group, job_type trial.
    runs = [
        tracking.read_offline_run(d)
        for d in tracking.offline_run_dirs(results.parent / "wandb" / "smoke")
    ]
    trial_runs = [r for r in runs if r["run"]["job_type"] == "trial"]
    assert len(trial_runs) == 4
    assert {r["run"]["group"] for r in trial_runs} == {"smoke"}
    assert all(any("train/loss" in row for row in r["history"]) for r in trial_runs)
    assert {r["config"]["model"]["heads"] for r in trial_runs} == {1, 4}

    # Re-running the finished study's command runs nothing new.
    run_cli("pipeline.sweep", "ablations/smoke.yaml", "--results-dir", str(results),
            "--work-dir", str(work))  # fmt: skip
    assert len(optuna.load_study(study_name="smoke", storage=storage).trials) == 4

    # The report reads records: it loads neither torch nor Lightning (seconds to load, the
    # training's).
    loaded = frameworks_loaded_by("pipeline.report", "smoke", "--results-dir", str(results))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    frameworks = loaded.stdout.splitlines()[-1]
    assert "torch" not in frameworks and "lightning" not in frameworks, loaded.stdout[-500:]
    report = (results / "smoke" / "report.md").read_text()
    assert "| base |" in report and "| heads_1 | model.heads=1 |" in report
    for chart in ("bleu_per_variant", "learning_curves"):
        assert matplotlib.image.imread(results / "smoke" / f"{chart}.png").shape[0] > 100
    summary = [
        tracking.read_offline_run(d)
        for d in tracking.offline_run_dirs(results.parent / "wandb" / "smoke")
    ]
    assert sum(r["run"]["job_type"] == "report" for r in summary) == 1


def start_worker(spec_path, results, work) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "pipeline.sweep", str(spec_path), "--results-dir",
               str(results), "--work-dir", str(work)]  # fmt: skip
    # A process group of its own: a SIGKILL to it takes the worker's W&B service too.
    return subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # fmt: skip


def write_smoke_grid(
    tmp_path, study: str, steps: int, interval: int, variants: dict, grace_period: int
) -> Path:
    """A grid study of `variants` (seed 1) on the smoke recipe: `steps` updates, validated every
    `interval`, fast heartbeats; returns the spec's path."""
    spec = {
        "study": study,
        "kind": "grid",
        "base_experiment": "smoke",
        "budget": {"train.max_steps": steps, "train.val_check_interval": interval,
                   "eval.average": 1},
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "seeds": [1],
        "variants": variants,
        "settings": {"heartbeat_interval": 1, "grace_period": grace_period, "poll_interval": 0.5},
    }  # fmt: skip
    spec_path = tmp_path / f"{study}.yaml"
    spec_path.write_text(yaml.safe_dump(spec))
    return spec_path


def still_running(worker: subprocess.Popen, deadline: float) -> None:
    """Fail with the worker's output once it has exited, or once `deadline` has passed (a worker
    still running then is killed first: its output can be read only once it has ended)."""
    if worker.poll() is None and time.monotonic() < deadline:
        return
    timed_out = worker.poll() is None
    if timed_out:
        os.killpg(worker.pid, signal.SIGKILL)  # its process group: the W&B service too
    out, _ = worker.communicate(timeout=60)
    pytest.fail(f"worker {'still running at the deadline' if timed_out else 'exited'}:\n{out}")


def wait_for_checkpoint(worker: subprocess.Popen, progress: Path, step: int) -> None:
    """Until the trial's `progress.json` shows a checkpoint at `step` or later."""
    deadline = time.monotonic() + 240
    while not (progress.exists() and json.loads(progress.read_text())["step"] >= step):
        still_running(worker, deadline)
        time.sleep(0.2)


def logged_steps(history: Path) -> list[int]:
    """The steps of a DVCLive history's rows (a row being written is left out)."""
    if not history.exists():
        return []
    rows = [line.split("\t") for line in history.read_text().splitlines()[1:]]
    return [int(row[0]) for row in rows if len(row) == 2]


def test_two_workers_a_sigterm_and_a_resume_then_the_report(tmp_path, multi30k_dir, monkeypatch):
    """The study machinery as a preemptible machine uses it: a worker is stopped by a real
    SIGTERM mid-training; the same command run again resumes that point from its checkpoint
    (not from step 0) in the point's own work dir while a second worker takes the other point,
    and is SIGKILLed after logging past its newest checkpoint; the same command once more
    finishes the point. The records (every attempt, one history row per logged step) and the
    report come out complete."""
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    steps, interval = 100, 20
    variants = {"base": {}, "heads_1": {"model.heads": 1}}
    spec_path = write_smoke_grid(tmp_path, "resume_smoke", steps, interval, variants, 3)
    results, work = tmp_path / "results", tmp_path / "work"

    first = start_worker(spec_path, results, work)
    progress = (
        study_folder(work, results, "resume_smoke")
        / "base-seed1"
        / "train"
        / "checkpoints"
        / "progress.json"
    )
    wait_for_checkpoint(first, progress, interval)
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 3, out
    assert "run the same command again to resume from it" in out
    stopped_at = json.loads(progress.read_text())["step"]
    assert interval <= stopped_at < steps

    storage = f"sqlite:///{results / 'resume_smoke' / 'study.db'}"
    study = optuna.load_study(study_name="resume_smoke", storage=storage)
    again = start_worker(spec_path, results, work)  # retries come first: the base point
    deadline = time.monotonic() + 240
    while not study.get_trials(states=(TrialState.RUNNING,)):
        still_running(again, deadline)
        time.sleep(0.2)
    second = start_worker(spec_path, results, work)  # takes the other point
    loss = progress.parents[2] / "plots" / "train" / "plots" / "metrics" / "train" / "loss.tsv"
    deadline = time.monotonic() + 240
    while max(logged_steps(loss), default=0) <= json.loads(progress.read_text())["step"]:
        still_running(again, deadline)
        time.sleep(0.05)
    os.killpg(again.pid, signal.SIGKILL)  # the worker, its W&B service: no cleanup at all
    again.communicate(timeout=60)
    killed_at = json.loads(progress.read_text())["step"]
    assert stopped_at <= killed_at < max(logged_steps(loss))

    last = start_worker(spec_path, results, work)  # takes the point once its heartbeat is stale
    for worker in (second, last):
        out, _ = worker.communicate(timeout=600)
        assert worker.returncode == 0, out

    trials = optuna.load_study(study_name="resume_smoke", storage=storage).trials
    states = sorted((t.params["variant"], t.state.name) for t in trials)
    assert states == [("base", "COMPLETE"), ("base", "FAIL"), ("base", "FAIL"),
                      ("heads_1", "COMPLETE")]  # fmt: skip
    record = results / "resume_smoke" / "trials" / "base-seed1"
    run = json.loads((record / "run.json").read_text())
    assert [(a["outcome"], a["step"]) for a in run["attempts"]] == [
        ("preempted", stopped_at), ("killed", killed_at), ("finished", steps)]  # fmt: skip
    assert run["attempts"][1]["wall_time_s"] > 0  # until the last row it logged
    assert run["train_wall_time_s"] == pytest.approx(sum(a["wall_time_s"] for a in run["attempts"]))
    log_every = 10  # the smoke recipe's train.log_every_n_steps
    assert logged_steps(loss) == list(range(log_every, steps + 1, log_every))  # each row once
    assert run["loss_average"] == "target_token"  # the report keeps its PPL unmarked
    train = json.loads((record / "train.json").read_text())
    assert train["resumed_from"] and train["steps"] == steps
    curve_steps = [p["step"] for p in json.loads((record / "curve.json").read_text())]
    assert curve_steps == list(range(interval, steps + 1, interval))  # every validation once

    written = run_cli("pipeline.report", str(spec_path), "--results-dir", str(results),
                      "--no-wandb")  # fmt: skip
    report_file = results / "resume_smoke" / "report.md"
    assert written == f"report: {report_file}\n"
    report = report_file.read_text(encoding="utf-8")
    assert "2 of 2 trials finished" in report and "| heads_1 | model.heads=1 |" in report
    assert "†" not in report
    assert (results / "resume_smoke" / "bleu_per_variant.png").exists()


def test_a_trial_whose_storage_stops_recording_heartbeats_stops_at_a_checkpoint(
    tmp_path, multi30k_dir, monkeypatch
):
    """A storage that records no heartbeat for longer than the grace period lets other workers
    count the trial dead and run its point again, in the same work directory. Here SQLite's
    write lock is held by another connection (a real lock; the worker's own writes wait on it):
    the worker stops training at a checkpoint before the grace period is out, touches the
    storage no more and exits as a preempted worker does; once the lock is gone, the same
    command resumes the point from that checkpoint."""
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    # The worker stops within the 4 s grace period of the lock, a few dozen updates after its
    # first checkpoint on a 2-core CPU: 200 leave room for a CPU several times faster.
    steps, interval = 200, 20
    spec_path = write_smoke_grid(tmp_path, "lost_heartbeat", steps, interval, {"base": {}}, 4)
    results, work = tmp_path / "results", tmp_path / "work"
    worker = start_worker(spec_path, results, work)
    progress = (
        study_folder(work, results, "lost_heartbeat")
        / "base-seed1"
        / "train"
        / "checkpoints"
        / "progress.json"
    )
    wait_for_checkpoint(worker, progress, interval)
    lock = sqlite3.connect(results / "lost_heartbeat" / "study.db", isolation_level=None)
    lock.execute("BEGIN EXCLUSIVE")
    try:
        out, _ = worker.communicate(timeout=120)
    finally:
        lock.execute("ROLLBACK")
    assert worker.returncode == 3, out
    assert "training stopped by a lost heartbeat (the study's storage recorded none for" in out
    stopped_at = json.loads(progress.read_text())["step"]
    assert interval <= stopped_at < steps

    again = start_worker(spec_path, results, work)
    out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, out
    storage = f"sqlite:///{results / 'lost_heartbeat' / 'study.db'}"
    trials = optuna.load_study(study_name="lost_heartbeat", storage=storage).trials
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "FAIL"]  # stale, then retried
    train = json.loads(
        (results / "lost_heartbeat" / "trials" / "base-seed1" / "train.json").read_text()
    )
    assert train["resumed_from"] and train["steps"] == steps


def test_search_study_reports_validation_to_the_pruner(tmp_path, multi30k_dir, monkeypatch):
    """TPE over heads/dropout with a median pruner: every trial reports val/greedy_bleu at each
    validation through optuna-integration's Lightning callback, and ends complete or pruned."""
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    spec = {
        "study": "search_smoke",
        "kind": "search",
        "base_experiment": "smoke",
        "budget": {
            "train.max_steps": 30,
            "train.val_check_interval": 10,
            "eval.splits": ["test_2016_flickr"],
            "eval.average": 1,
        },
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "n_trials": 3,
        "sampler_seed": 7,
        "space": {
            "model.heads": {"type": "categorical", "choices": [1, 4]},
            "model.dropout": {"type": "float", "low": 0.0, "high": 0.3},
        },
        "pruner": {"type": "median", "n_startup_trials": 1, "n_warmup_steps": 0},
    }
    study, _ = run_study(spec, tmp_path)
    assert len(study.trials) == 3
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    first = study.trials[0]
    assert first.state == TrialState.COMPLETE  # n_startup_trials: the first is never pruned
    assert sorted(first.intermediate_values) == [10, 20, 30]  # every validation, by step
    for trial in study.trials:
        # Every validation reported, by step, until the trial ends (a pruned one may be pruned
        # at any of them, the last included: its value there was below the median).
        steps = sorted(trial.intermediate_values)
        assert steps and steps == [10, 20, 30][: len(steps)]


def test_ddp_trials_report_by_step_and_prune_on_every_rank(tmp_path, multi30k_dir, monkeypatch):
    """Trials on 2 DDP ranks (CPU, gloo): Lightning re-runs the sweep command for rank 1, which
    joins the trial instead of claiming one; rank 0 reports each validation; a pruned trial
    stops both ranks at the pruning step; the other trial completes and is evaluated."""
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    spec = {
        "study": "ddp_smoke",
        "kind": "grid",
        "base_experiment": "smoke",
        "budget": {
            "train.max_steps": 30,
            "train.val_check_interval": 10,
            "train.accelerator": "cpu",
            "train.devices": 2,
            "train.strategy": "ddp",
            "eval.splits": ["test_2016_flickr"],
            "eval.average": 1,
        },
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "seeds": [1],
        # Every report after the warm-up is below the threshold: the 30-step trial is pruned
        # at step 20; the 10-step trial reports once, inside the warm-up, and completes.
        "variants": {"long": {}, "short": {"train.max_steps": 10}},
        "pruner": {"type": "threshold", "lower": 1.0e9, "n_warmup_steps": 15},
    }
    study, results = run_study(spec, tmp_path)
    trials = study.trials
    assert len(trials) == 2  # rank 1 claimed nothing, created nothing
    by_variant = {t.params["variant"]: t for t in trials}
    long, short = by_variant["long"], by_variant["short"]
    assert long.state == TrialState.PRUNED
    assert sorted(long.intermediate_values) == [10, 20]
    assert short.state == TrialState.COMPLETE and sorted(short.intermediate_values) == [10]
    assert short.user_attrs["test_bleu"] is not None  # evaluated after DDP training

    for trial, steps in ((long, 20), (short, 10)):
        # in the point's work dir: a pruned trial leaves no record
        point = study_folder(tmp_path / "work", results, "ddp_smoke") / (
            f"{trial.params['variant']}-seed{trial.params['seed']}"
        )
        train_json = point / "metrics" / "train.json"
        summary = json.loads(train_json.read_text())
        assert summary["world_size"] == 2
        assert summary["steps"] == steps  # the pruned trial stopped at the pruning step

    runs = [
        tracking.read_offline_run(d)
        for d in tracking.offline_run_dirs(results.parent / "wandb" / "ddp_smoke")
    ]
    assert sorted(r["run"]["job_type"] for r in runs) == ["trial", "trial"]  # rank 0's only


def stop_after_a_heartbeat(worker: subprocess.Popen, database: Path) -> None:
    """SIGSTOP `worker` just after the storage has its next heartbeat. Stopped while it writes
    one, a worker would keep SQLite's write lock, and every other worker's writes would wait on
    it: the machine suspended mid-commit, which this storage cannot get past. Just after a
    heartbeat is committed, the next write is `heartbeat_interval` away."""

    query = "SELECT MAX(heartbeat) FROM trial_heartbeats"
    with contextlib.closing(
        sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=60)
    ) as db:
        before, deadline = db.execute(query).fetchone(), time.monotonic() + 60
        while db.execute(query).fetchone() == before:  # autocommit reads: each sees new commits
            still_running(worker, deadline)
            time.sleep(0.01)
    worker.send_signal(signal.SIGSTOP)


def test_a_worker_suspended_while_it_evaluates_leaves_the_point_to_the_one_that_took_it_over(
    tmp_path, multi30k_dir, monkeypatch
):
    """A worker stopped (SIGSTOP: a suspended machine) once its training has finished: its
    heartbeat goes stale, a second worker counts the trial dead and runs the point again from
    the finished checkpoint (evaluation only) and records it. Resumed (SIGCONT), the first
    finishes its evaluation but records nothing and tells the storage nothing: the trial is no
    longer its own."""
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    steps, interval, grace = 20, 10, 4
    spec_path = write_smoke_grid(tmp_path, "suspended", steps, interval, {"base": {}}, grace)
    results, work = tmp_path / "results", tmp_path / "work"
    first = start_worker(spec_path, results, work)
    attempts = study_folder(work, results, "suspended") / "base-seed1" / "attempts.jsonl"
    deadline = time.monotonic() + 300
    while not (attempts.exists() and '"trained"' in attempts.read_text()):
        still_running(first, deadline)
        time.sleep(0.05)
    # evaluating (its training has been logged), stopped between two heartbeats
    stop_after_a_heartbeat(first, results / "suspended" / "study.db")
    try:
        time.sleep(grace + 1)  # its heartbeat is stale now
        second = start_worker(spec_path, results, work)
        out, _ = second.communicate(timeout=300)
        assert second.returncode == 0, out
    finally:
        first.send_signal(signal.SIGCONT)
    record = results / "suspended" / "trials" / "base-seed1"
    recorded = (record / "run.json").read_text()
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 3, out
    assert "evaluated but not recorded: the study's storage has it FAIL" in out
    assert (record / "run.json").read_text() == recorded  # the second worker's record, kept
    storage = f"sqlite:///{results / 'suspended' / 'study.db'}"
    trials = optuna.load_study(study_name="suspended", storage=storage).trials
    assert sorted(t.state.name for t in trials) == ["COMPLETE", "FAIL"]
    # Counted dead while it evaluated: the first attempt did not finish the point.
    assert [a["outcome"] for a in json.loads(recorded)["attempts"]] == ["killed", "finished"]


def test_a_worker_killed_while_it_evaluates_records_that_attempt_killed(
    tmp_path, multi30k_dir, monkeypatch
):
    """kill -9 of a worker whose training has finished, while it evaluates: the next worker
    evaluates the point from its finished checkpoint and records the first attempt killed (at
    the last step, for its training's time), not finished."""
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    steps, interval, grace = 20, 10, 3
    spec_path = write_smoke_grid(tmp_path, "killed_eval", steps, interval, {"base": {}}, grace)
    results, work = tmp_path / "results", tmp_path / "work"
    started = time.monotonic()
    first = start_worker(spec_path, results, work)
    point = study_folder(work, results, "killed_eval") / "base-seed1"
    deadline = started + 300
    while not any(p.name.startswith(".eval.tmp-") for p in point.glob(".*")):  # evaluating
        still_running(first, deadline)
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGKILL)
    lived_s = time.monotonic() - started
    first.communicate(timeout=60)
    (trained,) = [a for a in read_attempts(point) if a["outcome"] == TRAINED]
    time.sleep(grace + 1)  # its heartbeat is stale: the next worker takes the point over
    second = start_worker(spec_path, results, work)
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out
    run = json.loads((results / "killed_eval" / "trials" / "base-seed1" / "run.json").read_text())
    assert [(a["outcome"], a["step"]) for a in run["attempts"]] == [
        ("killed", steps), ("finished", steps)]  # fmt: skip
    # Killed while it evaluated: the time its training took, as it logged when training ended
    # (not a timing race with the second attempt, whose training resumed at the last step).
    assert run["attempts"][0]["wall_time_s"] == trained["wall_time_s"]
    assert 0 < trained["wall_time_s"] < lived_s
