"""pipeline.sweep's command line: it runs from the root of the repository that holds the spec,
whose relative paths (results folder, corpus) are the study's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO_ROOT


def sweep(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.sweep", *args, "--n-trials", "0"],
                          cwd=cwd, capture_output=True, text=True, timeout=300)  # fmt: skip


def checkout(root: Path) -> Path:
    """A folder that is a repository checkout as the sweep sees one (dvc.yaml, conf/), with
    the smoke study's spec in ablations/."""
    (root / "ablations").mkdir(parents=True)
    shutil.copyfile(REPO_ROOT / "dvc.yaml", root / "dvc.yaml")
    shutil.copytree(REPO_ROOT / "conf", root / "conf")
    shutil.copyfile(REPO_ROOT / "ablations" / "smoke.yaml", root / "ablations" / "smoke.yaml")
    return root


def test_from_a_subfolder_it_names_the_command_to_run_and_creates_nothing(tmp_path):
    """`cd ablations && python -m pipeline.sweep smoke.yaml`: exit 2 with the command that
    works, no second study under ablations/ablations/results, no corpus fetched."""
    root = checkout(tmp_path / "repo")
    before = sorted(root.rglob("*"))
    result = sweep("smoke.yaml", cwd=root / "ablations")
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.rstrip().endswith(
        f"cd {root.resolve()} && python -m pipeline.sweep ablations/smoke.yaml"
    )
    assert sorted(root.rglob("*")) == before


def test_a_spec_of_one_checkout_run_from_another_folder_is_refused(tmp_path):
    root = checkout(tmp_path / "repo")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = sweep(str(root / "ablations" / "smoke.yaml"), cwd=elsewhere)
    assert result.returncode == 2, result.stderr[-3000:]
    assert f"root of the repository {root.resolve()}, not {elsewhere.resolve()}" in result.stderr
    assert list(elsewhere.iterdir()) == []


def test_a_spec_outside_any_checkout_runs_from_a_checkouts_root_only(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("study: outside\n")  # read only where the folder is right
    outside = sweep(str(spec), cwd=tmp_path)
    assert outside.returncode == 2
    assert "neither the spec nor the current folder" in outside.stderr
    from_root = sweep(str(spec), cwd=REPO_ROOT)
    assert from_root.returncode == 2  # the spec's own error: past the folder check
    assert "neither" not in from_root.stderr and f"{spec}:" in from_root.stderr
