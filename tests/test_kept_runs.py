"""pipeline.training.kept_runs: what the check stage says of a run DVC has not recorded, and
when it forgets it (a real DVC repository and cache)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from pipeline.dvc_env import DVC_ROOT
from pipeline.training import kept_runs

DVC = str(Path(sys.executable).parent / "dvc")


def _kept_run(train_dir: Path, step: int, max_steps: int) -> Path:
    stash = kept_runs.kept_checkpoints(train_dir)
    stash.mkdir(parents=True)
    (stash / kept_runs.LAST).write_bytes(f"the state at step {step}".encode())
    (stash / kept_runs.PROGRESS).write_text(json.dumps({"step": step}))
    kept_runs.note_run(train_dir, "smoke", max_steps)
    return stash


def test_a_kept_run_is_described_until_dvcs_cache_holds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DVC_ROOT, raising=False)
    subprocess.run([DVC, "init", "--no-scm", "-q"], check=True, timeout=300)
    train_dir = Path("models/train")
    assert kept_runs.review(train_dir) is None  # nothing kept

    stash = _kept_run(train_dir, 5, 10)
    said = kept_runs.review(train_dir)
    assert said.startswith(f"{stash} keeps a run DVC has not recorded (experiment 'smoke', "
                           "stopped at step 5 of 10): the train stage of a command with its "
                           "values resumes it from step 5; other values are refused")  # fmt: skip
    assert (stash / kept_runs.LAST).exists()

    shutil.rmtree(kept_runs.kept_folder(train_dir))
    stash = _kept_run(train_dir, 10, 10)
    said = kept_runs.review(train_dir)
    assert "(experiment 'smoke', finished at step 10)" in said
    assert "records it without training; other values move it to models/train.replaced/" in said

    shutil.copy(stash / kept_runs.LAST, "recorded.ckpt")  # DVC caches what it records
    subprocess.run([DVC, "add", "-q", "recorded.ckpt"], check=True, timeout=300)
    assert kept_runs.review(train_dir) is None
    assert not list(stash.iterdir())
    assert not (kept_runs.kept_folder(train_dir) / kept_runs.RUN_RECORD).exists()
