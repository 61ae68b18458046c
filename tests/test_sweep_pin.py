"""pipeline.sweep.pin: a study pins the commit, hardware class and precision it runs at, and a
worker from another checkout refuses before it claims a trial; one let in with --allow-mixed
records its own code version, which the report keeps apart. Real workers (the sweep CLI) in
real git worktrees of this repository."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from pipeline.config import RAW_DIR_ENV
from pipeline.environment import COMMIT_ENV, hardware, hardware_class
from pipeline.errors import ConfigError
from pipeline.report.progress import study_pin
from pipeline.report.records import load_records
from pipeline.sweep import load_spec, pin
from tests.conftest import REPO_ROOT, git


def write_spec(folder: Path) -> Path:
    spec = {
        "study": f"pinned-{uuid.uuid4().hex[:8]}",
        "kind": "grid",
        "base_experiment": "smoke",
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "budget": {"train.max_steps": 2, "train.val_check_interval": 2, "eval.average": 1},
        "seeds": [1, 2],
        "variants": {"base": {}, "heads_1": {"model.heads": 1}},
    }
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def worker(
    checkout: Path, spec: Path, results: Path, *flags: str, trials: int = 0, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`python -m pipeline.sweep` with the code of `checkout`, running `trials` trials."""
    env = {**(os.environ if env is None else env), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep", str(spec), "--n-trials", str(trials),
         "--results-dir", str(results), "--work-dir", str(results.parent / "work"), *flags],
        cwd=checkout, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def study_of(spec: Path, results: Path) -> optuna.Study:
    name = yaml.safe_load(spec.read_text())["study"]
    return optuna.load_study(study_name=name, storage=f"sqlite:///{results / name / 'study.db'}")


@pytest.mark.slow
def test_a_worker_at_another_commit_or_with_changes_refuses_before_claiming(
    tmp_path, worktree, multi30k_dir, monkeypatch
):
    monkeypatch.setenv(RAW_DIR_ENV, str(multi30k_dir))  # a worktree has no corpus beside it
    spec, results = write_spec(tmp_path), tmp_path / "results"
    created = worker(worktree, spec, results)
    assert created.returncode == 0, created.stderr
    study = study_of(spec, results)
    pinned = study.user_attrs["pin"]
    assert pinned["commit"] == git(worktree, "rev-parse", "--short", "HEAD")
    assert pinned["precision"] in ("bf16-mixed", "32-true")
    assert pinned["hardware"] and "cores" not in pinned["hardware"]

    # The same clean checkout again: accepted.
    assert worker(worktree, spec, results).returncode == 0

    # Uncommitted code: a different version of the code, refused.
    (worktree / "conf" / "extra.yaml").write_text("lr: 1\n")
    dirty = worker(worktree, spec, results)
    assert dirty.returncode == 2, dirty.stderr
    assert (
        f"commit: pinned {pinned['commit']}, this worker {pinned['commit']}+dirty." in dirty.stderr
    )
    assert "Traceback" not in dirty.stderr

    # Another commit: refused, naming both and how to run at the pin.
    git(worktree, "add", "conf/extra.yaml")
    git(worktree, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "another")
    other = git(worktree, "rev-parse", "--short", "HEAD")
    refused = worker(worktree, spec, results)
    assert refused.returncode == 2, refused.stderr
    message = refused.stderr
    assert f"commit: pinned {pinned['commit']}, this worker {other}" in message
    assert f"git worktree add ../{study.study_name}-pinned {pinned['commit']}" in message
    assert "--allow-mixed" in message
    states = [t.state for t in study_of(spec, results).trials]
    assert states == [TrialState.WAITING] * 4  # nothing claimed

    mixed = worker(worktree, spec, results, "--allow-mixed")
    assert mixed.returncode == 0, mixed.stderr
    assert study_of(spec, results).user_attrs["pin"] == pinned  # the pin stays

    # Uncommitted code under --allow-mixed: the trial's record names that code, and the report
    # keeps the trial apart from the pin's.
    (worktree / "conf" / "extra.yaml").write_text("lr: 2\n")
    ran = worker(worktree, spec, results, "--allow-mixed", trials=1)
    assert ran.returncode == 0, ran.stderr
    study_dir = results / study.study_name
    (record,) = load_records(study_dir)
    pinned_conditions = study_pin(load_spec(spec), study_dir)
    assert record.run["commit"].startswith(f"{other}+dirty.")
    assert record.conditions.commit == record.run["commit"]
    assert pinned_conditions.commit == pinned["commit"]
    assert record.conditions != pinned_conditions


def test_a_worker_whose_code_names_no_commit_is_refused_before_the_storage(tmp_path):
    """Code copied without git's history names no commit: every such worker would match one
    pin, "unknown", whatever code it ran. Refused (exit 2, naming the variable to set) before
    any storage exists; with the commit named in it, the worker pins that commit."""
    tree = tmp_path / "copied"
    for folder in ("pipeline", "conf"):
        shutil.copytree(REPO_ROOT / folder, tree / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy2(REPO_ROOT / "dvc.yaml", tree)  # a repository's root, as the sweep asks
    spec, results = write_spec(tmp_path), tmp_path / "results"
    env = {key: value for key, value in os.environ.items() if key != COMMIT_ENV}
    refused = worker(tree, spec, results, env=env)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "is in no git checkout" in refused.stderr and COMMIT_ENV in refused.stderr
    assert "Traceback" not in refused.stderr and not results.exists()
    named = worker(tree, spec, results, env={**env, COMMIT_ENV: "abc1234"})
    assert named.returncode == 0, named.stderr[-3000:]
    pinned = study_of(spec, results).user_attrs[pin.PIN_ATTR]
    assert pinned["commit"] == "abc1234"
    # beside the records too, for a report that reads no storage
    assert pin.read_pin_file(results / yaml.safe_load(spec.read_text())["study"]) == pin.Pin(
        **pinned
    )


def test_differences_name_each_field():
    pinned = pin.Pin("abc1234", "AMD EPYC, avx512_bf16", "bf16-mixed")
    worker = pin.Pin("abc1234", "Intel(R) Xeon(R) Processor, amx_bf16/avx512_bf16", "32-true")
    assert pin.differences(pinned, worker) == [
        "hardware: pinned AMD EPYC, avx512_bf16, this worker Intel(R) Xeon(R) Processor, "
        "amx_bf16/avx512_bf16",
        "precision: pinned bf16-mixed, this worker 32-true",
    ]
    assert pin.differences(pinned, pinned) == []


def test_a_pin_whose_commit_is_gone_says_so_instead_of_a_worktree_that_cannot_work(tmp_path):
    """A study pinned at a commit this repository does not hold (a local commit rewritten
    since): the refusal names it and how to start over, not `git worktree add` of it; a pin
    at a commit it holds keeps the worktree advice."""
    spec = load_spec(write_spec(tmp_path))
    here = git(REPO_ROOT, "rev-parse", "--short", "HEAD")
    worker = pin.Pin(f"{here}+dirty.0badc0de", "some machine", "32-true")
    for commit, says, not_says in (
        ("0123abc", "The pinned commit 0123abc is not in this repository", "git worktree add"),
        (here, f"git worktree add ../{spec.study}-pinned {here}", "not in this repository"),
    ):
        study = optuna.create_study()
        study.set_user_attr(pin.PIN_ATTR, {"commit": commit, "hardware": "some machine",
                                            "precision": "32-true"})  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            pin.check_pin(study, spec, worker, allow_mixed=False)
        assert says in str(refused.value) and not_says not in str(refused.value)
    assert pin.commit_known(here) and not pin.commit_known("0123abc")


def test_a_worker_whose_trials_train_on_more_processes_differs_from_the_pin(tmp_path):
    """The processes a trial trains on set its global batch: `train.devices: auto` on a machine
    of more GPUs would train each trial with a larger one, on the same class of machine."""
    spec_file = write_spec(tmp_path)
    spec = load_spec(spec_file)
    one, two = (
        pin.this_worker(dataclasses.replace(spec, budget={
            **spec.budget, "train.precision": "32-true", "train.devices": devices}))
        for devices in (1, 2)
    )  # fmt: skip
    assert one.hardware == hardware_class(hardware())
    assert two.hardware == f"{one.hardware}, 2 processes"
    assert pin.differences(one, two) == [
        f"hardware: pinned {one.hardware}, this worker {two.hardware}"
    ]
    for pinned, worker, says in (
        (one, two, "train on 1 process(es), this worker's would on 2"),
        (two, one, "train on 2 process(es), this worker's would on 1"),
    ):
        study = optuna.create_study()
        study.set_user_attr(pin.PIN_ATTR, dataclasses.asdict(pinned))
        with pytest.raises(ConfigError) as refused:
            pin.check_pin(study, spec, worker, allow_mixed=False)
        assert says in str(refused.value) and "CUDA_VISIBLE_DEVICES" in str(refused.value)
        assert "git worktree add" not in str(refused.value)
        assert pin.check_pin(study, spec, worker, allow_mixed=True) == pinned
