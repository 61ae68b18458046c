"""The real DVC pipeline in a scratch copy of the repository: repro, no-op, selective re-run,
kill safety and determinism of stage outputs, and `dvc exp run` with Hydra composition."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import (
    REPO_ROOT,
    build_once,
    gzip_head,
    page_references,
    shared_build,
    shared_root,
)

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
COMMAND_TIMEOUT = 1200  # seconds: one DVC command, a smoke run's stages included


def sh(
    args: list[str], cwd: Path, check: bool = True, env: dict | None = None, **kwargs
) -> subprocess.CompletedProcess:
    kwargs.setdefault("timeout", COMMAND_TIMEOUT)
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True,
                            env={**_env(), **(env or {})}, **kwargs)  # fmt: skip
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env['PATH']}"
    env["WANDB_MODE"] = "offline"
    # A W&B service this test process started (an earlier test's run) would serve the stages
    # too, and write their runs relative to its own working directory, not the copy's.
    env.pop("WANDB_SERVICE", None)
    return env


def commit(repo: Path, message: str) -> None:
    sh(["git", "add", "-A"], repo)
    sh(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message], repo)


def copy_repository(dest: Path) -> Path:
    """A git + DVC copy of this repository's files (tracked and new, not ignored), without
    what a pipeline run leaves or records (dvc.lock, metrics/, the corpus record)."""
    files = sh(["git", "ls-files", "-co", "--exclude-standard"], REPO_ROOT).stdout.split()
    run_outputs = ("dvc.lock", "metrics/", "data/corpus.json")
    for name in files:
        source = REPO_ROOT / name
        if source.is_file() and not name.startswith(run_outputs):
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    sh(["git", "init", "-q"], dest)
    commit(dest, "copy")
    return dest


@pytest.fixture
def repo(tmp_path, multi30k_dir, monkeypatch) -> Path:
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))  # for this test only
    return copy_repository(tmp_path / "repo")


def compose_params(repo: Path, *overrides: str) -> None:
    params = sh([sys.executable, "-m", "pipeline.params", *overrides, "-o", "-"], repo).stdout
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
    assert "Running stage 'check'" in again  # it always runs: a second, nothing downstream
    assert "Running stage 'prepare'" not in again and "Running stage 'tokenize'" not in again

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
    proc.wait(timeout=60)
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
    assert first["steps"] == 40 and first["train/mean_tokens_per_sec"] > 0
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
    for key in ("train/mean_tokens_per_sec", "train/target_tokens", "wall_time_s", "val/loss"):
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


PREEMPTED_STEPS = 80  # a checkpoint every 20: the stop lands well before the end


def test_a_preempted_dvc_exp_run_resumes_when_run_again(repo):
    """`dvc exp run` checks the workspace out before it runs, which deletes the checkpoints of a
    train stage DVC never recorded (persist or not): a stopped stage keeps them beside the
    workspace's, and the same command run again puts them back and resumes."""
    values = ["experiment=smoke", f"train.max_steps={PREEMPTED_STEPS}", "train.val_check_interval=20",
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
    kept = repo / "models/train.preempted/checkpoints"
    for left in checkpoints.glob("*.ckpt"):  # what the next checkout may delete is kept linked
        assert os.path.samefile(left, kept / left.name), "kept out of the checkout's reach"
    stopped = yaml.safe_load((kept / "progress.json").read_text())["step"]
    assert 0 < stopped < PREEMPTED_STEPS
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
    assert summary["resumed_from"].endswith("last.ckpt") and summary["steps"] == PREEMPTED_STEPS, (
        again.stdout[-3000:]
    )
    # the finished run stays kept until a later command's check stage sees DVC's record
    assert (kept / "last.ckpt").exists() and not (repo / "models/train.replaced").exists()
    histories = _histories(repo)
    steps = [int(line.split("\t")[0]) for line in histories["train/loss.tsv"].splitlines()[1:]]
    assert steps == list(
        range(10, PREEMPTED_STEPS + 1, 10)
    )  # smoke logs every 10 steps: each row once

    # The recorded run's outputs deleted, the same command again: DVC restores the checkpoints
    # from its cache; the stage records the run and writes its histories again from them.
    for output_dir in ("models", "plots", "metrics", "eval", "wandb_runs"):
        shutil.rmtree(repo / output_dir, ignore_errors=True)
    sh(["dvc", "exp", "run", *overrides], repo)
    recorded = yaml.safe_load((repo / "metrics/train.json").read_text())
    assert (
        recorded["steps"] == PREEMPTED_STEPS and recorded["wall_time_s"] == summary["wall_time_s"]
    )
    assert _histories(repo) == histories


# ---- one smoke experiment, then what users do next ------------------------------------------

SMOKE = ["experiment=smoke", "train.max_steps=40", "train.val_check_interval=20",
         "train.progress_bar=false", "eval.bootstrap_samples=0"]  # fmt: skip
# README's comparison of experiments in one screen (dashboards page).
ONE_LINE_VIEW = ["dvc", "exp", "show", "--no-pager", "--drop",
                 "Created|seed|.*[./]",
                 "--keep", "^(test|val|eval)/|^train/wall_time_s$"]  # fmt: skip
VENV = Path(sys.executable).parent.parent  # for `make`, which would otherwise build .venv


def set_params(values: list[str]) -> list[str]:
    return [arg for value in values for arg in ("-S", value)]


@pytest.fixture(scope="session")
@shared_build
def smoke_run(tmp_path_factory, multi30k_dir) -> Path:
    """One `dvc exp run -S experiment=smoke` (40 steps) in a copy of the repository, once per
    test run, shared by the tests below: each works on a copy of it (`smoke`)."""
    folder = shared_root(tmp_path_factory) / "smoke_run"

    def build() -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("MULTI30K_DIR", str(multi30k_dir))
            repo = copy_repository(folder / "repo")
            sh(["dvc", "exp", "run", *set_params(SMOKE)], repo)

    return build_once(folder, build) / "repo"


@pytest.fixture
def smoke(smoke_run, tmp_path, multi30k_dir, monkeypatch) -> Path:
    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    return Path(shutil.copytree(smoke_run, tmp_path / "repo", symlinks=True))


def outputs_snapshot(repo: Path) -> dict[str, str]:
    """SHA-256 of every file the pipeline wrote into the workspace."""
    import hashlib

    return {
        str(path.relative_to(repo)): hashlib.sha256(path.read_bytes()).hexdigest()
        for folder in ("data", "models", "eval", "metrics", "plots")
        for path in sorted((repo / folder).rglob("*"))
        if path.is_file()
    }


def test_a_bad_config_is_refused_before_dvc_deletes_the_last_good_run(smoke):
    """A value the check stage refuses under `dvc exp run -S`: no output of the last good run
    touched, and the refused key put back in params.yaml as that run had it (DVC wrote it
    there before any stage ran)."""
    before = outputs_snapshot(smoke)
    values = yaml.safe_load((smoke / "params.yaml").read_text())
    assert {"metrics/train.json", "metrics/eval.json", "metrics/prepare.json"} <= set(before)
    missing = smoke / "models" / "nope.ckpt"
    for bad, named in [
        (["model.heads=3"], "config key 'model.heads'"),  # the train stage's
        # outside their domains: the tokenize stage crashed; the train stage divided by zero
        (["seed=-1"], "config key 'seed'"),
        (["train.log_every_n_steps=0"], "config key 'train.log_every_n_steps'"),
        ([f"eval.checkpoint={missing}"], "config key 'eval.checkpoint'"),  # the evaluate stage's
        (["data.download=false", "data.test_splits=[test_2016_flickr,test_2099]"],
         "test_2099.en"),  # the prepare stage's
    ]:  # fmt: skip
        result = sh(["dvc", "exp", "run", *set_params([*SMOKE, *bad])], smoke, check=False)
        output = result.stdout + result.stderr
        assert result.returncode != 0, output[-3000:]
        assert outputs_snapshot(smoke) == before, f"{bad}: the last good run was touched"
        assert named in output and "failed to reproduce 'check'" in output, output[-3000:]
        if named.startswith("config key"):
            key = named.split("'")[1]
            assert f"params.yaml: '{key}' put back to" in output, output[-3000:]
            assert yaml.safe_load((smoke / "params.yaml").read_text()) == values, bad


def test_make_repro_runs_the_default_experiment_not_a_leftover_preset(smoke):
    from pipeline import config as config_lib

    assert yaml.safe_load((smoke / "params.yaml").read_text())["experiment_name"] == "smoke"
    default = config_lib.compose([]).experiment_name
    result = sh(["make", "repro", f"VENV={VENV}", "REPRO_ARGS=--dry"], smoke, check=False)
    output = result.stdout + result.stderr
    assert f"experiment '{default}', recomposed from conf/ (the default)" in output, output
    assert "it held experiment 'smoke'" in output
    assert "up to date" not in output and "Running stage 'train'" in output
    assert yaml.safe_load((smoke / "params.yaml").read_text())["experiment_name"] == default


# A real offline W&B run where a sweep trial of ablations/smoke.yaml logs it (its own process).
TRIAL_RUN = """
from pathlib import Path
from pipeline import sweep, tracking
spec = sweep.load_spec("ablations/smoke.yaml")
record = Path("ablations/results") / spec.study / "trials" / "base-seed1"
cfg = sweep.trial_config(spec, {}, sweep.TrialPaths(work=Path("work"), record=record))
run = tracking.start_wandb_run(cfg, job_type="trial")
run.log({"val/greedy_bleu": 1.0})
run.finish()
record.mkdir(parents=True)  # a new study's results: not yet in git
(record / "run.json").write_text("{}")
print(Path(cfg.paths.wandb_dir).resolve())
"""


def test_dvc_exp_apply_keeps_a_studys_unsynced_wandb_runs(smoke):
    from pipeline import tracking

    wandb_dir = Path(sh([sys.executable, "-c", TRIAL_RUN], smoke).stdout.split()[-1])
    offline = tracking.offline_run_dirs(wandb_dir)
    assert len(offline) == 1
    files = sorted(p for p in offline[0].rglob("*") if p.is_file())
    data = {p: p.read_bytes() for p in files if p.suffix == ".wandb"}  # the run itself
    assert data

    name = sh(["dvc", "exp", "ls", "--name-only"], smoke).stdout.split()[-1]
    sh(["dvc", "exp", "apply", name], smoke)
    assert list((smoke / "ablations" / "results" / "smoke" / "trials").rglob("run.json"))
    assert [p for p in files if not p.is_file()] == [], "W&B run files lost"
    assert {p: p.read_bytes() for p in data} == data


def corpus_copy(multi30k_dir: Path, dest: Path) -> Path:
    shutil.copytree(multi30k_dir, dest)
    for path in [dest, *dest.iterdir()]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return dest


def test_another_copy_of_the_corpus_is_seen_by_dvc(smoke, tmp_path, multi30k_dir, monkeypatch):
    other = corpus_copy(multi30k_dir, tmp_path / "corpus")
    for lang in ("en", "de"):  # the same folder layout, another validation set
        gzip_head(multi30k_dir / f"val.{lang}.gz", other / f"val.{lang}.gz", 500)
    monkeypatch.setenv("MULTI30K_DIR", str(other))
    output = sh(["dvc", "repro", "prepare"], smoke).stdout
    assert "Running stage 'prepare'" in output
    stats = yaml.safe_load((smoke / "metrics" / "prepare.json").read_text())
    assert stats["splits"]["val"]["read"] == 500

    # The same files in another folder are the same corpus: nothing to run again.
    monkeypatch.setenv("MULTI30K_DIR", str(shutil.copytree(other, tmp_path / "moved")))
    output = sh(["dvc", "repro", "prepare"], smoke).stdout
    assert "Stage 'prepare' didn't change" in output


def _progress(path: Path) -> int:
    """The step a checkpoint folder's progress record names (-1: none yet)."""
    try:
        return json.loads(path.read_text())["step"]
    except (OSError, ValueError):
        return -1


@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGKILL", "SIGTERM"])
def test_a_dvc_exp_run_stopped_by_a_signal_to_its_process_group_resumes_when_run_again(
    smoke, signal_name
):
    """Ctrl-C (the terminal's SIGINT to the foreground process group: DVC ignores it while a
    stage runs), kill -9 and SIGTERM to the whole `dvc exp run`, then the same command at once
    (after a SIGTERM DVC exits before its stage has saved): the run goes on from its newest
    checkpoint, the stop step's when there was time to save one, never from step 0."""
    # another dropout than the smoke run's: a run of its own, trained anew on the same tokens
    # (another seed would tokenize again)
    values = ["experiment=smoke", "model.dropout=0.2", "train.max_steps=40",
              "train.val_check_interval=10", "train.progress_bar=false"]  # fmt: skip
    command = ["dvc", "exp", "run", "train", *set_params(values)]
    mirror = smoke / "models/train.preempted/checkpoints"
    progress = smoke / "models/train/checkpoints/progress.json"  # the smoke run's, until moved
    started = time.time()
    with open(smoke / "stopped.log", "w") as log:
        exp = subprocess.Popen(command, cwd=smoke, env=_env(), stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 300
        while not (progress.exists() and progress.stat().st_mtime > started
                   and _progress(progress) >= 10):  # fmt: skip
            assert exp.poll() is None, (smoke / "stopped.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.1)
        os.killpg(exp.pid, getattr(signal, signal_name))
        exp.wait(timeout=120)  # dvc only, not its stage
    assert exp.returncode != 0
    killed_at = _progress(mirror / "progress.json")  # out of the next checkout's reach

    again = sh(command, smoke)  # at once, as the stop message (or a scheduler's requeue) says
    output = again.stdout + again.stderr
    stopped = (smoke / "stopped.log").read_text()
    if signal_name == "SIGKILL":
        step = killed_at
    else:
        assert "Traceback" not in stopped and "KeyboardInterrupt" not in stopped, stopped[-3000:]
        found = re.search(rf"training stopped by {signal_name} at step (\d+): saved ", stopped)
        assert found, stopped[-3000:]
        step = int(found[1])
    assert 10 <= step < 40
    assert f"goes on from step {step}: moved its " in output, output[-3000:]
    summary = json.loads((smoke / "metrics/train.json").read_text())
    # a SIGKILL between a validation's step checkpoint and last.ckpt resumes from the former
    assert summary["resumed_from"].endswith(("last.ckpt", f"step-{step:07d}.ckpt"))
    assert summary["steps"] == 40
    # a finished run stays kept beside until the next command sees that DVC recorded it
    sh(command, smoke)
    assert not list(mirror.iterdir())
    history = _histories(smoke)["train/loss.tsv"].splitlines()[1:]
    assert [int(row.split("\t")[0]) for row in history] == list(range(10, 41, 10))


def test_a_new_test_split_costs_one_evaluation_never_a_retrain(
    smoke, tmp_path, multi30k_dir, monkeypatch
):
    corpus = corpus_copy(multi30k_dir, tmp_path / "corpus")
    for lang in ("en", "de"):
        gzip_head(multi30k_dir / f"test_2016_flickr.{lang}.gz", corpus / f"test_x.{lang}.gz", 100)
    monkeypatch.setenv("MULTI30K_DIR", str(corpus))
    checkpoints = _file_hashes(smoke / "models" / "train" / "checkpoints")

    values = [*SMOKE, "data.test_splits=[test_2016_flickr,test_x]"]
    result = sh(["dvc", "exp", "run", *set_params(values)], smoke)
    output = result.stdout + result.stderr
    assert "training anew" not in output and not (smoke / "models" / "train.replaced").exists()
    assert _file_hashes(smoke / "models" / "train" / "checkpoints") == checkpoints
    scores = yaml.safe_load((smoke / "metrics" / "eval.json").read_text())
    assert scores["test_x"]["sentences"] == 100  # evaluated without being named in eval.splits
    summary = yaml.safe_load((smoke / "metrics" / "summary.json").read_text())
    assert {"test/bleu_lc", "eval/test_x/bleu_lc", "eval/val/bleu_lc"} <= set(summary)


def test_exp_show_fits_a_200_column_terminal_with_bleu(smoke):
    shown = sh(ONE_LINE_VIEW, smoke, env={"COLUMNS": "200"}).stdout
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 200, shown
    header = next(line for line in lines if "Experiment" in line)
    for column in ("test/bleu_lc", "test/chrf", "test/ter", "val/loss", "experiment_name"):
        assert column in header, header
    name = sh(["dvc", "exp", "ls", "--name-only"], smoke).stdout.split()[-1]
    assert any(name in line and "smoke" in line for line in lines), shown

    # What DVC reads as metrics: the summary alone, a dozen numbers.
    rows = json.loads(sh(["dvc", "exp", "show", "--json"], smoke).stdout)
    metrics = rows[0]["data"]["metrics"]
    assert list(metrics) == ["metrics/summary.json"]
    assert len(metrics["metrics/summary.json"]["data"]) <= 12


def test_the_plots_page_works_offline(smoke):
    sh(["make", "plots", f"VENV={VENV}"], smoke)
    page = (smoke / "dvc_plots" / "index.html").read_text(encoding="utf-8")
    references = page_references(page)
    remote = [ref for ref in references if ref.startswith(("http:", "https:", "//"))]
    assert not remote, f"the page loads {remote}"
    assert all((smoke / "dvc_plots" / ref).is_file() for ref in references)
    # Vega inline, defined before the first chart asks for it; DVC's two learning-curve charts.
    assert 0 < page.index("window.vegaEmbed=") < page.index("vegaEmbed('#")
    assert page.count("vegaEmbed('#") >= 2


# README's queue line (`dvc exp run --queue -S 'model.heads=...' && dvc queue start`) on the
# smoke preset: two experiments that differ in one value.
QUEUED_HEADS = ("2", "4")
SMOKE_HEADS = "4"  # conf/experiment/smoke.yaml's


QUEUE_MINUTES = 25  # both smoke experiments, one after the other, within the test's timeout
# `dvc queue status` asks the workers what they run through the broker's message files and
# can read one a worker is still writing ("unexpected error - Expecting value"), after it has
# printed the tasks' table: such a failure is asked again, this many times in a row at most.
QUEUE_STATUS_TRIES = 5
QUEUE_POLL_S = 2


def queue_status(repo: Path, tries: int = QUEUE_STATUS_TRIES) -> str:
    """`dvc queue status`'s output, asked again while it fails, `tries` times in all; the
    last try's failure is raised."""
    command = ["dvc", "queue", "status"]
    for _ in range(tries - 1):
        result = sh(command, repo, check=False, timeout=120)
        if result.returncode == 0:
            return result.stdout
        time.sleep(QUEUE_POLL_S)
    return sh(command, repo, timeout=120).stdout


def run_queue(repo: Path, log: Path, timeout: float) -> str:
    """`dvc queue start`, then `dvc queue status` until nothing is queued or running; the last
    status. The queue worker DVC starts is a daemon that outlives the command and keeps the
    files it was given: its output goes to `log`, never to a pipe a test reads (a read would
    wait for the idle worker to exit, which it does not by itself). The workers are stopped
    at the end, whatever happened."""
    with log.open("w") as out:
        subprocess.run(["dvc", "queue", "start", "-j", "1"], cwd=repo, env=_env(),
                       stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                       timeout=120, check=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = queue_status(repo)
            if not any(word in status for word in ("Queued", "Running")):
                return status
            time.sleep(QUEUE_POLL_S)
        return status
    finally:
        with log.open("a") as out:
            subprocess.run(["dvc", "queue", "stop", "--kill"], cwd=repo, env=_env(),
                           stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                           timeout=120)  # fmt: skip
        wait_for_queue_workers(repo, QUEUE_WORKER_EXIT_S)


QUEUE_WORKER_EXIT_S = 120  # a worker told to stop finishes its clean-up within this


def wait_for_queue_workers(repo: Path, timeout: float) -> None:
    """Wait until the queue workers DVC started in `repo` have exited, killing any still there
    after `timeout`. `dvc queue stop` only asks them to stop: the first worker then deletes
    the broker's processed messages on its way out, so a copy of the repository taken before
    that races with the deletion. DVC writes each worker's pid beside the broker's folders."""
    import psutil

    workers = []
    for pid_file in (repo / ".dvc/tmp/exps/celery").glob("dvc-exp-worker-*.pid"):
        try:
            process = psutil.Process(int(pid_file.read_text()))
            if "queue-worker" in process.cmdline():  # not a later process given the same pid
                workers.append(process)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, ValueError):
            continue  # already gone
    _, alive = psutil.wait_procs(workers, timeout=timeout)
    for process in alive:
        process.kill()
    psutil.wait_procs(alive, timeout=timeout)


@pytest.fixture(scope="session")
@shared_build
def queued_run(tmp_path_factory, multi30k_dir) -> Path:
    """A copy of the repository with the corpus where conf/ looks for it, beside the
    repository (`../shared/data/multi30k`), no MULTI30K_DIR and no download allowed; README's
    queue line run there once per test run: DVC runs each experiment in its own temporary
    copy (`.dvc/tmp/exps/<copy>/`). The folder holding both."""
    root = shared_root(tmp_path_factory) / "queued"

    def build() -> None:
        (root / "shared" / "data").mkdir(parents=True)
        (root / "shared" / "data" / "multi30k").symlink_to(multi30k_dir)
        (root / "repo").mkdir()
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv("MULTI30K_DIR", raising=False)
            repo = copy_repository(root / "repo")
            heads = f"model.heads={','.join(QUEUED_HEADS)}"
            sh(["dvc", "exp", "run", "--queue",
                *set_params([*SMOKE, "data.download=false", heads])], repo)  # fmt: skip
            status = run_queue(repo, root / "queue-worker.log", QUEUE_MINUTES * 60)
        if status.count("Success") != len(QUEUED_HEADS):  # what the experiments printed
            names = sh(["dvc", "exp", "ls", "--name-only"], repo).stdout.split()
            logs = "".join(sh(["dvc", "queue", "logs", name], repo, check=False).stdout[-3000:]
                           for name in names)  # fmt: skip
            pytest.fail(f"{status}\n{logs}")

    return build_once(root, build)


@pytest.fixture
def queued(queued_run, tmp_path) -> Path:
    """A copy of `queued_run`'s repository (and the corpus beside it) for one test: DVC takes
    its lock there, and `dvc exp apply` changes it."""
    return Path(shutil.copytree(queued_run, tmp_path / "queued", symlinks=True)) / "repo"


def queued_experiments(repo: Path) -> dict[str, dict]:
    """{experiment name: its metrics and params} from `dvc exp show --json`."""
    shown = json.loads(sh(["dvc", "exp", "show", "--json"], repo).stdout)
    found = {}
    for baseline in shown:
        for experiment in baseline.get("experiments") or []:
            data = experiment["revs"][0]["data"]
            found[experiment["name"]] = {
                "metrics": data["metrics"]["metrics/summary.json"]["data"],
                "heads": str(data["params"]["params.yaml"]["data"]["model"]["heads"]),
            }
    return found


def test_readmes_queue_line_runs_offline_in_dvcs_temporary_copies(queued):
    """Each queued experiment found the corpus from its temporary copy and ran to the end."""
    experiments = queued_experiments(queued)
    assert sorted(e["heads"] for e in experiments.values()) == sorted(QUEUED_HEADS)
    # ran to the end: every update trained, and the evaluate stage scored the test split
    steps = next(int(v.split("=")[1]) for v in SMOKE if v.startswith("train.max_steps="))
    for experiment in experiments.values():
        assert experiment["metrics"]["train/steps"] == steps, experiment
        assert 0 <= experiment["metrics"]["test/bleu_lc"] <= 100, experiment


def test_the_experiments_view_fits_80_columns_with_test_bleu_lc(queued):
    """`make exps` at 80 columns: every experiment on one line with what it changed, val and
    test BLEU (lc), updates and wall time, best test BLEU (lc) first."""
    experiments = queued_experiments(queued)
    shown = sh(["make", "exps", f"VENV={VENV}"], queued, env={"COLUMNS": "80"}).stdout
    lines = [line for line in shown.splitlines() if not line.startswith(("make", ". "))]
    assert max(len(line) for line in lines) <= 80, shown
    assert "BLEU (lc)" in lines[0]
    assert lines[1].split() == ["experiment", "changed", "val", "test", "updates", "train", "min"]
    rows = {}
    for name, experiment in experiments.items():
        (line,) = [line for line in lines if line.startswith(name)]
        # what it set beyond the smoke preset (4 heads): the value that tells them apart first
        if experiment["heads"] != SMOKE_HEADS:
            assert f"experiment=smoke model.heads={experiment['heads']} " in line, line
        metrics = experiment["metrics"]
        cells = line.split()[-4:]
        assert cells == [f"{metrics['eval/val/bleu_lc']:.1f}", f"{metrics['test/bleu_lc']:.1f}",
                         "40", f"{metrics['train/wall_time_s'] / 60:.1f}"], line  # fmt: skip
        rows[lines.index(line)] = metrics["test/bleu_lc"]
    assert [rows[i] for i in sorted(rows)] == sorted(rows.values(), reverse=True)


def _curves(plots: dict, revision: str) -> list[dict]:
    """The learning curves (train and val loss by step) of `revision` in `dvc plots show/diff
    --json` output."""
    (content,) = [entry["content"] for entry in plots["data"]["learning_curves"]]
    points = [
        {key: value for key, value in point.items() if key != "rev"}
        for point in content["data"]["values"]
        if point.get("rev") == revision
    ]
    return sorted(points, key=lambda point: sorted(point.items()))


def test_plots_diff_draws_both_experiments_and_apply_shows_the_applied_one(queued):
    """`dvc plots diff <exp> <exp>` has each experiment's curves; after `dvc exp apply <exp>`
    the workspace's curves (what `make plots` draws) are that experiment's."""
    first, second = sorted(queued_experiments(queued))
    diff = json.loads(sh(["dvc", "plots", "diff", first, second, "--json"], queued).stdout)
    assert not diff.get("errors"), diff["errors"]
    curves = {name: _curves(diff, name) for name in (first, second)}
    assert all(curves.values()) and curves[first] != curves[second], curves

    for name in (first, second):
        sh(["dvc", "exp", "apply", name], queued)
        shown = json.loads(sh(["dvc", "plots", "show", "--json"], queued).stdout)
        assert _curves(shown, "workspace") == curves[name]
    sh(["make", "plots", f"VENV={VENV}"], queued)
