"""The real DVC pipeline in a scratch copy of the repository: repro, no-op, selective re-run,
kill safety and determinism of stage outputs, and `dvc exp run` with Hydra composition."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def sh(args: list[str], cwd: Path, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, env=_env(), **kwargs)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env["WANDB_MODE"] = "offline"
    return env


@pytest.fixture
def repo(tmp_path, multi30k_dir) -> Path:
    """A git + DVC copy of this repository's files (tracked and new, not ignored)."""
    files = sh(["git", "ls-files", "-co", "--exclude-standard"], REPO_ROOT).stdout.split()
    dest = tmp_path / "repo"
    for name in files:
        source = REPO_ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    os.environ["MULTI30K_DIR"] = str(multi30k_dir)
    sh(["git", "init", "-q"], dest)
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A"], dest)
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"], dest)
    return dest


def compose_params(repo: Path, *overrides: str) -> None:
    params = sh([sys.executable, "-m", "pipeline.config", *overrides], repo).stdout
    (repo / "params.yaml").write_text(params)


def lock_outs(repo: Path, stage: str) -> dict[str, str]:
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for out in lock["stages"][stage]["outs"]}


def test_repro_noop_and_selective_rerun(repo):
    compose_params(repo, "experiment=smoke")
    first = sh(["dvc", "repro", "tokenize"], repo).stdout
    assert "Running stage 'prepare'" in first and "Running stage 'tokenize'" in first
    assert (repo / "data/tokenized/spm.model").exists()
    stats = yaml.safe_load((repo / "metrics/prepare.json").read_text())
    assert stats  # DVC metrics written

    again = sh(["dvc", "repro", "tokenize"], repo).stdout
    assert "Running stage" not in again

    compose_params(repo, "experiment=smoke", "data.tokenizer.vocab_size=800")
    changed = sh(["dvc", "repro", "tokenize"], repo).stdout
    assert "Running stage 'tokenize'" in changed
    assert "Running stage 'prepare'" not in changed


def test_killed_stage_leaves_lock_and_reruns_to_same_hash(repo):
    compose_params(repo, "experiment=smoke")
    sh(["dvc", "repro", "tokenize"], repo)
    clean = {**lock_outs(repo, "prepare"), **lock_outs(repo, "tokenize")}
    lock_before = (repo / "dvc.lock").read_bytes()

    # Force tokenize again and SIGKILL it mid-run.
    proc = subprocess.Popen(
        ["dvc", "repro", "-f", "-s", "tokenize"],
        cwd=repo,
        env=_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(4)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert (repo / "dvc.lock").read_bytes() == lock_before

    sh(["dvc", "repro", "tokenize"], repo)
    rerun = {**lock_outs(repo, "prepare"), **lock_outs(repo, "tokenize")}
    assert rerun == clean

    # Deterministic stages: a forced re-run produces identical output hashes.
    sh(["dvc", "repro", "-f", "tokenize"], repo)
    assert {**lock_outs(repo, "prepare"), **lock_outs(repo, "tokenize")} == clean
