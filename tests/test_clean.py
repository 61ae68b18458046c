"""pipeline.clean: what runs and sweep trials leave behind is listed with its size, and only
what nothing needs any more is removed, and only when asked."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pipeline.disk_usage import folder_size, human_size
from pipeline.sweep.work_dirs import claim_study_work_dir
from tests.conftest import REPO_ROOT


def _file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)


def study_folder(work: Path, results: Path, study: str = "smoke") -> Path:
    """The work folder a sweep claims for `study` in its SQLite storage under `results`."""
    storage = f"sqlite:///{(results / study / 'study.db').resolve()}"
    return claim_study_work_dir(work, study, storage, 1)


@pytest.fixture
def leftovers(tmp_path):
    """A workspace with two replaced runs and a stopped one beside models/train, and a study
    whose point base-seed1 is recorded while heads_1-seed1 is not."""
    repo, work, results = tmp_path / "repo", tmp_path / "work", tmp_path / "repo" / "results"
    _file(repo / "models/train/checkpoints/last.ckpt", 100)  # the current run: not listed
    _file(repo / "models/train.replaced/20260101-000000/step-00000100.ckpt", 3000)
    _file(repo / "models/train.replaced/20260102-000000/step-00000100.ckpt", 2000)
    _file(repo / "models/train.preempted/checkpoints/last.ckpt", 1000)
    study = study_folder(work, results)
    _file(study / "base-seed1/train/checkpoints/last.ckpt", 5000)
    _file(study / "heads_1-seed1/train/checkpoints/last.ckpt", 4000)
    _file(study / "data/prepared/train.en", 700)
    _file(results / "smoke/trials/base-seed1/run.json", 10)
    return repo, study, results


def run_clean(repo: Path, work: Path, results: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.clean", "--work-dir", str(work),
         "--results-dir", str(results), *args],
        cwd=repo, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_clean_lists_sizes_and_removes_only_what_is_finished_and_recorded_when_asked(leftovers):
    repo, study, results = leftovers
    work = study.parent
    listed = run_clean(repo, work, results)
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[:-1]}
    assert "removable: a run replaced" in lines["models/train.replaced/20260101-000000"]
    assert "2.9 KB" in lines["models/train.replaced/20260101-000000"]
    assert "kept: a stopped run" in lines["models/train.preempted"]
    assert "removable: finished, recorded" in lines[str(study / "base-seed1")]
    assert "kept: not recorded" in lines[str(study / "heads_1-seed1")]
    assert "kept: the study's prepared data" in lines[str(study / "data")]
    assert "models/train" not in lines  # the current run is DVC's output
    assert listed.stdout.splitlines()[-1] == (
        "removable: 9.8 KB in 3 folder(s); run again with --yes to remove"
    )
    assert (repo / "models/train.replaced/20260101-000000").exists()  # nothing removed yet

    removed = run_clean(repo, work, results, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines()[-1] == "removed 9.8 KB in 3 folder(s)"
    assert not list((repo / "models/train.replaced").iterdir())
    assert not (study / "base-seed1").exists()
    for kept in ("models/train/checkpoints/last.ckpt", "models/train.preempted"):
        assert (repo / kept).exists()
    assert (study / "heads_1-seed1/train/checkpoints/last.ckpt").exists()
    assert (study / "data/prepared/train.en").exists()


def test_a_run_moved_aside_says_how_much_is_there_and_how_to_clean_it(tmp_path):
    from pipeline.training.resume import _move_aside

    train_dir = tmp_path / "models/train"
    _file(tmp_path / "models/train.replaced/20260101-000000/step-00000100.ckpt", 3000)
    _file(train_dir / "checkpoints/step-00000200.ckpt", 2000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _move_aside(train_dir, "its config differs in model.heads")
    (message,) = [str(w.message) for w in caught]
    replaced = folder_size(tmp_path / "models/train.replaced")  # the two runs and a record
    assert 5000 < replaced < 6000 and f"Runs moved aside: {human_size(replaced)} in " in message
    assert "`python -m pipeline.clean` lists what may go" in message


def test_only_this_clones_study_folders_are_removable_and_each_folder_counts_once(leftovers):
    """In the work folder beside this clone's study: another clone's study of the same name
    (its points recorded here too), another tool's folder (a venv) and a link to this clone's
    study. Each is named and kept; the link is not counted again; --yes removes this clone's
    recorded point alone."""
    repo, study, results = leftovers
    work = study.parent
    other = study_folder(work, repo.parent / "other-clone" / "results")
    _file(other / "base-seed1/train/checkpoints/last.ckpt", 6000)
    _file(work / "fairseq-venv/lib/python3.11/site-packages/torch/lib.so", 8000)
    (work / "smoke-link").symlink_to(study, target_is_directory=True)
    listed = run_clean(repo, work, results)
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[:-1]}
    assert "kept: study 'smoke' in sqlite:///" in lines[str(other)]
    assert "not this clone's" in lines[str(other)]
    assert human_size(folder_size(other)) in lines[str(other)]
    assert str(other / "base-seed1") not in lines
    assert "kept: not a sweep study's work folder" in lines[str(work / "fairseq-venv")]
    assert str(work / "fairseq-venv" / "lib") not in lines
    assert f"kept: a link to {study}" in lines[str(work / "smoke-link")]
    assert not any(path.startswith(str(work / "smoke-link") + "/") for path in lines)
    assert listed.stdout.splitlines()[-1] == (
        "removable: 9.8 KB in 3 folder(s); run again with --yes to remove"
    )
    removed = run_clean(repo, work, results, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert not (study / "base-seed1").exists()
    assert (other / "base-seed1/train/checkpoints/last.ckpt").exists()
    assert (work / "fairseq-venv/lib/python3.11/site-packages/torch/lib.so").exists()
    assert (work / "smoke-link").is_symlink()


def test_a_folder_from_before_studies_named_their_storage_is_kept(tmp_path):
    """A work folder without .study.json, its point recorded in this clone: whose study it
    was cannot be told, so it is kept."""
    repo, work, results = tmp_path / "repo", tmp_path / "work", tmp_path / "repo" / "results"
    _file(work / "smoke/base-seed1/train/checkpoints/last.ckpt", 5000)
    _file(results / "smoke/trials/base-seed1/run.json", 10)
    repo.mkdir(exist_ok=True)
    listed = run_clean(repo, work, results, "--yes")
    assert listed.returncode == 0, listed.stderr
    assert "kept: not a sweep study's work folder (no .study.json)" in listed.stdout
    assert listed.stdout.splitlines()[-1] == "nothing removable"
    assert (work / "smoke/base-seed1/train/checkpoints/last.ckpt").exists()
