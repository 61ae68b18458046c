"""pipeline.sweep.deadline: a worker with `--deadline` starts only the trials expected to finish
in time and, at the deadline, stops its running trial at a checkpoint and exits 0. Real workers
(the sweep CLI), real training for the stop."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from optuna.trial import TrialState

from pipeline.errors import ConfigError
from pipeline.sweep import deadline as deadline_lib
from tests.conftest import REPO_ROOT, study_folder

NOW = datetime.datetime(2026, 11, 27, 16, 0, 0)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90m", 5400), ("2h30m", 9000), ("3600s", 3600), ("1.5h", 5400), ("18:40", 9600),
     ("15:00", 23 * 3600), ("16:00", 24 * 3600), ("0:30", 8.5 * 3600),
     ("2026-11-28T16:00", 86400), ("45min", 2700)],
)  # fmt: skip
def test_a_deadline_is_a_duration_or_a_clock_time(text, seconds):
    """A clock time is the next one: past today's, it is tomorrow's (an evening's `07:00`)."""
    deadline = deadline_lib.parse_deadline(text, now=NOW)
    assert deadline.at - NOW.timestamp() == pytest.approx(seconds)
    assert deadline_lib.parse_deadline(deadline.iso(), now=NOW).at == deadline.at


@pytest.mark.parametrize(
    "text", ["2026-11-27T15:59", "soon", "", "-5m", "25:00", "7:60", "0m", "0h0s"]
)
def test_a_past_or_unreadable_deadline_is_refused(text):
    with pytest.raises(ConfigError, match="--deadline"):
        deadline_lib.parse_deadline(text, now=NOW)


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(
    st.text(max_size=12),
    st.from_regex(r"\A-?\d{1,3}(\.\d)?(h|m|min|s)?(\d{1,2}(m|s))?\Z"),
    st.from_regex(r"\A\d{1,2}:\d{1,2}\Z"),
    st.datetimes(min_value=NOW - datetime.timedelta(days=2),
                 max_value=NOW + datetime.timedelta(days=2)).map(datetime.datetime.isoformat),
))  # fmt: skip
def test_any_deadline_text_is_a_time_to_come_or_refused_naming_the_flag(text):
    """Whatever a user types after `--deadline`: a moment after now, or a ConfigError (exit 2)
    naming the flag, never another exception; a clock time comes within the next 24 hours."""
    try:
        deadline = deadline_lib.parse_deadline(text, now=NOW)
    except ConfigError as refused:
        assert "--deadline" in str(refused)
        return
    assert deadline.at > NOW.timestamp()
    if re.fullmatch(r"\d{1,2}:\d{2}", text):
        assert deadline.at - NOW.timestamp() <= 24 * 3600


def _times(study, estimate_minutes=None, trial_hours=None) -> deadline_lib.TrialTimes:
    spec = SimpleNamespace(trial_hours=trial_hours or {},
                           settings=SimpleNamespace(trial_minutes_estimate=estimate_minutes))  # fmt: skip
    return deadline_lib.TrialTimes.of_study(study, spec)


def test_the_expected_time_is_the_variants_median_then_the_specs_hours_then_all_then_the_estimate():
    study = optuna.create_study()
    for variant, seconds in [("base", 100.0), ("base", 300.0), ("base", 200.0), ("wide", 900.0)]:
        study.add_trial(optuna.create_trial(
            value=1.0, params={"variant": variant},
            distributions={"variant": optuna.distributions.CategoricalDistribution(["base", "wide", "new"])},
            user_attrs={deadline_lib.WALL_TIME_ATTR: seconds}))  # fmt: skip
    assert _times(study, 50).seconds("base") == 200.0
    # an unmeasured variant without trial_hours: the median over every measured trial, which
    # was measured here, before the spec's estimate, which was not
    assert _times(study, 50).seconds("new") == 250.0
    assert _times(study, None).seconds("new") == 250.0
    assert _times(optuna.create_study(), 50).seconds("new") == 3000.0
    assert _times(optuna.create_study(), None).seconds("new") is None
    # A variant not yet measured, with the spec's trial_hours: its cost relative to the base's,
    # times the base's median measured here (200 s); the hours as given without a base time.
    hours = {"base": 1.0, "new": 2.5}
    assert _times(study, 50, hours).seconds("new") == 500.0
    assert _times(optuna.create_study(), 50, hours).seconds("new") == 2.5 * 3600
    assert _times(study, 50, {"wide": 9.0}).seconds("wide") == 900.0  # measured
    assert _times(study, 50, {"base": 1.0}).seconds("new") == 250.0


def write_spec(folder: Path, study: str, steps: int, estimate_minutes: float | None) -> Path:
    settings = {"heartbeat_interval": 1, "grace_period": 5, "poll_interval": 0.5}
    if estimate_minutes is not None:
        settings["trial_minutes_estimate"] = estimate_minutes
    spec = {
        "study": study,
        "kind": "grid",
        "base_experiment": "smoke",
        "budget": {"train.max_steps": steps, "train.val_check_interval": 10, "eval.average": 1},
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "seeds": [1],
        "variants": {"base": {}, "heads_1": {"model.heads": 1}},
        "settings": settings,
    }
    path = folder / f"{study}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run_worker(spec: Path, results: Path, deadline: str, timeout: float):
    env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", str(spec), "--deadline", deadline,
         "--results-dir", str(results), "--work-dir", str(results.parent / "work")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def trials_of(spec: Path, results: Path) -> list[optuna.trial.FrozenTrial]:
    name = yaml.safe_load(spec.read_text())["study"]
    storage = f"sqlite:///{results / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage).trials


def test_a_worker_starts_no_trial_that_cannot_finish_by_its_deadline(tmp_path):
    spec = write_spec(tmp_path, "no_fit", steps=100, estimate_minutes=30)
    results = tmp_path / "results"
    started = time.monotonic()
    done = run_worker(spec, results, "10m", timeout=300)
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"deadline \d{4}-\d\d-\d\d \d\d:\d\d \(in \d+ min \d\d s\): starting only "
        "trials expected to finish by then",
        done.stdout.splitlines()[0],
    ), done.stdout
    assert "no waiting trial fits in the 10 min left" in done.stdout
    assert "0 of 2 trials finished, 2 waiting (about 1.0 h of one worker" in done.stdout
    assert [t.state for t in trials_of(spec, results)] == [TrialState.WAITING] * 2
    assert time.monotonic() - started < 240  # it did not wait for the deadline


@pytest.mark.slow
def test_at_the_deadline_the_running_trial_stops_at_a_checkpoint(
    tmp_path, multi30k_dir, monkeypatch
):
    """A real short deadline: the trial trains until it, stops at a checkpoint (the preemption
    path), its point is queued again, and the worker exits 0 saying what is left."""
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    spec = write_spec(tmp_path, "short_deadline", steps=100000, estimate_minutes=None)
    results = tmp_path / "results"
    done = run_worker(spec, results, "75s", timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trial 0 stopped at a checkpoint and queued again" in done.stdout, done.stdout
    assert "0 of 2 trials finished, 2 waiting" in done.stdout
    progress = (
        study_folder(tmp_path / "work", results, "short_deadline")
        / "base-seed1"
        / "train"
        / "checkpoints"
    )
    step = json.loads((progress / "progress.json").read_text())["step"]
    assert 0 < step < 100000
    assert (progress / "last.ckpt").exists()
    trials = trials_of(spec, results)
    assert [(t.params.get("variant") or t.system_attrs["fixed_params"]["variant"], t.state)
            for t in trials] == [("base", TrialState.FAIL), ("heads_1", TrialState.WAITING),
                                 ("base", TrialState.WAITING)]  # fmt: skip
    assert trials[0].user_attrs["preempted"] is True
