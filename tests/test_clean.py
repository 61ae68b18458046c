"""pipeline.clean: what runs and sweep trials leave behind is listed with its size, and only
what nothing needs any more is removed, and only when asked."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from pipeline.disk_usage import folder_size, human_size
from tests.conftest import REPO_ROOT


def _file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * size)


@pytest.fixture
def leftovers(tmp_path):
    """A workspace with two replaced runs and a stopped one beside models/train, and a study
    whose point base-seed1 is recorded while heads_1-seed1 is not."""
    repo, work, results = tmp_path / "repo", tmp_path / "work", tmp_path / "repo" / "results"
    _file(repo / "models/train/checkpoints/last.ckpt", 100)  # the current run: not listed
    _file(repo / "models/train.replaced/20260101-000000/step-00000100.ckpt", 3000)
    _file(repo / "models/train.replaced/20260102-000000/step-00000100.ckpt", 2000)
    _file(repo / "models/train.preempted/checkpoints/last.ckpt", 1000)
    _file(work / "smoke/base-seed1/train/checkpoints/last.ckpt", 5000)
    _file(work / "smoke/heads_1-seed1/train/checkpoints/last.ckpt", 4000)
    _file(work / "smoke/data/prepared/train.en", 700)
    _file(results / "smoke/trials/base-seed1/run.json", 10)
    return repo, work, results


def run_clean(repo: Path, work: Path, results: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.clean", "--work-dir", str(work),
         "--results-dir", str(results), *args],
        cwd=repo, env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_clean_lists_sizes_and_removes_only_what_is_finished_and_recorded_when_asked(leftovers):
    repo, work, results = leftovers
    listed = run_clean(repo, work, results)
    assert listed.returncode == 0, listed.stderr
    lines = {line.split()[0]: line for line in listed.stdout.splitlines()[:-1]}
    assert "removable: a run replaced" in lines["models/train.replaced/20260101-000000"]
    assert "2.9 KB" in lines["models/train.replaced/20260101-000000"]
    assert "kept: a stopped run" in lines["models/train.preempted"]
    assert "removable: finished, recorded" in lines[str(work / "smoke/base-seed1")]
    assert "kept: not recorded" in lines[str(work / "smoke/heads_1-seed1")]
    assert "kept: the study's prepared data" in lines[str(work / "smoke/data")]
    assert "models/train" not in lines  # the current run is DVC's output
    assert listed.stdout.splitlines()[-1] == (
        "removable: 9.8 KB in 3 folder(s); run again with --yes to remove"
    )
    assert (repo / "models/train.replaced/20260101-000000").exists()  # nothing removed yet

    removed = run_clean(repo, work, results, "--yes")
    assert removed.returncode == 0, removed.stderr
    assert removed.stdout.splitlines()[-1] == "removed 9.8 KB in 3 folder(s)"
    assert not list((repo / "models/train.replaced").iterdir())
    assert not (work / "smoke/base-seed1").exists()
    for kept in ("models/train/checkpoints/last.ckpt", "models/train.preempted"):
        assert (repo / kept).exists()
    assert (work / "smoke/heads_1-seed1/train/checkpoints/last.ckpt").exists()
    assert (work / "smoke/data/prepared/train.en").exists()


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
