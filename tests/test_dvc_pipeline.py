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
def repo(tmp_path, multi30k_dir, monkeypatch) -> Path:
    """A git + DVC copy of this repository's files (tracked and new, not ignored), without
    what a `dvc repro` in the checkout left there (its dvc.lock and metrics)."""
    files = sh(["git", "ls-files", "-co", "--exclude-standard"], REPO_ROOT).stdout.split()
    tracked = set(sh(["git", "ls-files"], REPO_ROOT).stdout.split())
    run_outputs = {"dvc.lock", "metrics"}
    files = [f for f in files if f in tracked or f.split("/")[0] not in run_outputs]
    dest = tmp_path / "repo"
    for name in files:
        source = REPO_ROOT / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))  # for this test only
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

    compose_params(repo, "experiment=smoke", "data.tokenizer.pretokenizer=moses")
    moses = sh(["dvc", "repro", "tokenize"], repo).stdout
    assert "Running stage 'tokenize'" in moses and "Running stage 'prepare'" not in moses
    assert (repo / "data/tokenized/spm.pretokenizer.json").exists()


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


def _file_hashes(directory: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def _histories(repo: Path) -> dict[str, str]:
    """DVCLive's metric histories of the train stage (what `dvc plots` reads), by file."""
    folder = repo / "plots/train/plots/metrics"
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*.tsv"))}


def _train_stage(pid: int) -> list:
    """The train stage's Python process under `pid`: DVC starts it through a shell whose one
    argument also names the module, and a signal to that shell would leave Python training on."""
    import psutil

    return [p for p in psutil.Process(pid).children(recursive=True)
            if "pipeline.stages.train" in p.cmdline()]  # fmt: skip


def test_a_run_finished_after_dvc_died_is_recorded_by_the_next_repro_not_retrained(repo):
    """SIGTERM to the `dvc repro` process alone: its train stage runs on to the end but DVC
    never records it. The next `dvc repro` must keep that run (same config, same code) and let
    DVC record it, not train it again."""
    import psutil

    compose_params(repo, "experiment=smoke", "train.max_steps=40", "train.val_check_interval=20",
                   "train.progress_bar=false")  # fmt: skip
    sh(["dvc", "repro", "tokenize"], repo)
    checkpoints = repo / "models/train/checkpoints"
    with open(repo / "first.log", "w") as log:
        dvc = subprocess.Popen(["dvc", "repro", "train"], cwd=repo, env=_env(), stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while not (checkpoints / "progress.json").exists():  # training is under way
            assert dvc.poll() is None, (repo / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
        stage = _train_stage(dvc.pid)
        assert stage, "the train stage is not a child of dvc"
        dvc.send_signal(signal.SIGTERM)  # the dvc process only, not its group
        dvc.wait(timeout=60)
        _, alive = psutil.wait_procs(stage, timeout=600)  # it trains on to the end
        assert not alive, "the train stage did not finish"
    assert "train" not in yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    finished = _file_hashes(checkpoints)
    first = yaml.safe_load((repo / "metrics/train.json").read_text())
    assert first["steps"] == 40 and first["train/tokens_per_sec"] > 0
    histories = _histories(repo)
    assert "train/loss.tsv" in histories

    again = sh(["dvc", "repro", "train"], repo)
    output = again.stdout + again.stderr
    assert "training anew" not in output and not (repo / "models/train.replaced").exists()
    assert _file_hashes(checkpoints) == finished  # the run kept as it was: nothing retrained
    assert lock_outs(repo, "train")  # and DVC recorded it
    summary = yaml.safe_load((repo / "metrics/train.json").read_text())
    assert summary["resumed_from"].endswith("last.ckpt") and summary["steps"] == 40
    # The figures and curves are the run's own (as of its final checkpoint), not those of a
    # process that trained nothing.
    for key in ("train/tokens_per_sec", "train/target_tokens", "wall_time_s", "val/loss"):
        assert summary[key] == first[key], key
    assert _histories(repo) == histories


def test_params_changed_under_a_running_stage_are_refused_not_recorded(repo):
    """What `dvc exp run -S ...` in the same workspace does to a running `dvc repro`: it
    rewrites params.yaml. The running train stage must not report success (DVC would record
    its checkpoints under the new values); its checkpoints stay."""
    overrides = ["experiment=smoke", "train.max_steps=40", "train.val_check_interval=20",
                 "train.progress_bar=false"]  # fmt: skip
    compose_params(repo, *overrides)
    sh(["dvc", "repro", "tokenize"], repo)
    checkpoints = repo / "models/train/checkpoints"
    dvc = subprocess.Popen(["dvc", "repro", "train"], cwd=repo, env=_env(), text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    deadline = time.monotonic() + 300
    while not (checkpoints / "progress.json").exists():  # training is under way
        assert dvc.poll() is None and time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)
    compose_params(repo, *overrides, "train.lr_factor=0.25")
    output, _ = dvc.communicate(timeout=600)
    assert dvc.returncode != 0, output[-3000:]
    assert (
        "error: params.yaml changed while the train stage ran: 'train.lr_factor' was 0.5, now 0.25"
        in output
    )
    assert "train" not in yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert (checkpoints / "last.ckpt").exists()  # the run is kept for the next repro to judge


def test_a_preempted_dvc_exp_run_resumes_when_run_again(repo):
    """`dvc exp run` checks the workspace out before it runs, which deletes the checkpoints of a
    train stage DVC never recorded (persist or not): a stopped stage keeps them beside the
    workspace's, and the same command run again puts them back and resumes."""
    values = ["experiment=smoke", "train.max_steps=400", "train.val_check_interval=20",
              "train.progress_bar=false"]  # fmt: skip
    compose_params(repo, *values)
    sh(["dvc", "repro", "tokenize"], repo)
    sh(["git", "add", "-A"], repo)
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "data"], repo)
    overrides = [arg for value in values for arg in ("-S", value)]
    checkpoints = repo / "models/train/checkpoints"
    exp = subprocess.Popen(["dvc", "exp", "run", *overrides], cwd=repo, env=_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 300
    while not (checkpoints / "progress.json").exists():
        assert exp.poll() is None and time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.2)
    stage = _train_stage(exp.pid)
    assert len(stage) == 1, "one train stage under dvc exp run"
    stage[0].send_signal(signal.SIGTERM)  # a preemption of the stage
    out, _ = exp.communicate(timeout=300)
    assert exp.returncode != 0
    assert "run the same command again to resume from it" in out
    assert "its checkpoints wait in models/train.preempted/checkpoints" in out
    assert not list(checkpoints.glob("*.ckpt")), "moved out of the checkout's reach"
    kept = repo / "models/train.preempted/checkpoints"
    stopped = yaml.safe_load((kept / "progress.json").read_text())["step"]
    assert 0 < stopped < 400
    kept_files = _file_hashes(kept)

    # Run again with a value that changes the run: refused, naming the key, and the stopped
    # run's checkpoints are out of the next checkout's reach again, unchanged.
    refused = sh(["dvc", "exp", "run", *overrides, "-S", "train.lr_factor=1.0"], repo, check=False)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0
    assert "error: config key 'train.lr_factor' differs from" in output, output[-3000:]
    assert "the stopped run is not lost: its checkpoints wait in models/train.preempted" in output
    assert _file_hashes(kept) == kept_files and not list(checkpoints.glob("*.ckpt"))

    again = sh(["dvc", "exp", "run", *overrides], repo)  # as the message says
    summary = yaml.safe_load((repo / "metrics/train.json").read_text())
    assert summary["resumed_from"].endswith("last.ckpt") and summary["steps"] == 400, again.stdout[
        -3000:
    ]
    assert not list(kept.iterdir()) and not (repo / "models/train.replaced").exists()
    histories = _histories(repo)
    steps = [int(line.split("\t")[0]) for line in histories["train/loss.tsv"].splitlines()[1:]]
    assert steps == list(range(10, 401, 10))  # smoke logs every 10 steps: each row once

    # The recorded run's outputs deleted, the same command again: DVC restores the checkpoints
    # from its cache; the stage records the run and writes its histories again from them.
    for output_dir in ("models", "plots", "metrics", "eval", "wandb_runs"):
        shutil.rmtree(repo / output_dir, ignore_errors=True)
    sh(["dvc", "exp", "run", *overrides], repo)
    recorded = yaml.safe_load((repo / "metrics/train.json").read_text())
    assert recorded["steps"] == 400 and recorded["wall_time_s"] == summary["wall_time_s"]
    assert _histories(repo) == histories
