"""A train stage's run DVC has not recorded is kept, whatever DVC does next, and the next command
says what it kept; a command DVC or the check stage refuses leaves params.yaml as it was. Real
DVC, real signals, on a copy of the smoke experiment (`tests.test_dvc_pipeline.smoke`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests import test_dvc_pipeline
from tests.test_dvc_pipeline import (
    SMOKE,
    _env,
    _file_hashes,
    _progress,
    _train_stage,
    compose_params,
    lock_outs,
    set_params,
    sh,
)

smoke_run, smoke = test_dvc_pipeline.smoke_run, test_dvc_pipeline.smoke  # the fixtures

pytestmark = pytest.mark.slow

CHECKPOINTS = Path("models/train/checkpoints")
KEPT = Path("models/train.preempted/checkpoints")
# Another run than the smoke experiment's (a value of the train stage alone): it trains.
OTHER_RUN = [*SMOKE, "train.lr_factor=0.25"]
WAIT_S = 900  # for a checkpoint, for a process to end (on a loaded 2-core machine)
FINISH_S = 1200  # for a train stage to train to the end


@pytest.fixture
def start():
    """Starts a command in its own process group, its output in a file of the repository
    (never a pipe); the groups still running when the test ends are killed."""
    groups: list[subprocess.Popen] = []

    def launch(repo: Path, command: list[str], log: str) -> subprocess.Popen:
        with open(repo / log, "w") as out:
            proc = subprocess.Popen(command, cwd=repo, env=_env(), stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        groups.append(proc)
        return proc

    yield launch
    for proc in groups:
        with contextlib.suppress(ProcessLookupError):  # the whole group has ended
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=WAIT_S)


def wait_for_a_checkpoint(repo: Path, proc: subprocess.Popen, log: str, step: int = 20) -> None:
    """Until the run `proc` started has saved a checkpoint at `step` or later."""
    progress = repo / CHECKPOINTS / "progress.json"
    started, deadline = time.time(), time.monotonic() + WAIT_S
    while not (progress.exists() and progress.stat().st_mtime > started - 1
               and _progress(progress) >= step):  # fmt: skip
        assert proc.poll() is None, (repo / log).read_text()[-3000:]
        assert time.monotonic() < deadline, f"no checkpoint within {WAIT_S} s"
        time.sleep(0.1)


def kept_as_links(repo: Path) -> None:
    """Every checkpoint of the stage's output is also linked where no checkout deletes it."""
    files = list((repo / CHECKPOINTS).glob("*.ckpt"))
    assert files
    for path in files:
        assert os.path.samefile(path, repo / KEPT / path.name), path.name


def assert_recorded_not_retrained(repo: Path, command: list[str], finished: dict, first: dict):
    """`command` records the finished run DVC has not recorded, byte for byte, training
    nothing; returns its output."""
    result = sh(command, repo)
    output = result.stdout + result.stderr
    assert "the finished run DVC has not recorded (step 40) is put back" in output, output[-3000:]
    assert "training anew" not in output
    assert _file_hashes(repo / CHECKPOINTS) == finished
    summary = yaml.safe_load((repo / "metrics/train.json").read_text())
    assert summary["resumed_from"].endswith("last.ckpt") and summary["steps"] == first["steps"]
    for key in ("train/mean_tokens_per_sec", "wall_time_s", "val/loss"):
        assert summary[key] == first[key], key
    return output


def test_a_run_finished_after_dvc_exp_run_was_stopped_is_recorded_by_the_same_command(smoke, start):
    """SIGTERM to the `dvc exp run` process alone: DVC exits, its train stage trains on to the
    end unrecorded. The same command again checks the workspace out (which deletes that
    output), then records the run from its kept links instead of training it again; once DVC
    has recorded it, the next command's check stage forgets the links."""
    import psutil

    command = ["dvc", "exp", "run", "train", *set_params(OTHER_RUN)]
    dvc = start(smoke, command, "first.log")
    wait_for_a_checkpoint(smoke, dvc, "first.log")
    stage = _train_stage(dvc.pid)
    assert len(stage) == 1, "one train stage under dvc exp run"
    dvc.send_signal(signal.SIGTERM)  # the dvc process only, not its group
    assert dvc.wait(timeout=WAIT_S) != 0
    _, alive = psutil.wait_procs(stage, timeout=FINISH_S)  # it trains on to the end
    assert not alive, "the train stage did not finish"
    first = yaml.safe_load((smoke / "metrics/train.json").read_text())
    assert first["steps"] == 40 and not first.get("resumed_from"), first
    finished = _file_hashes(smoke / CHECKPOINTS)
    kept_as_links(smoke)
    recorded = lock_outs(smoke, "train")["models/train"]

    output = assert_recorded_not_retrained(smoke, command, finished, first)
    assert "keeps a run DVC has not recorded (experiment 'smoke', finished at step 40)" in output
    assert lock_outs(smoke, "train")["models/train"] != recorded  # DVC recorded this run
    # kept (DVC may have replaced the output's files by its cache's) until the next command
    # sees DVC's record
    assert _file_hashes(smoke / KEPT)["last.ckpt"] == finished["last.ckpt"]

    sh(command, smoke)  # nothing to run: its check stage finds the run recorded
    assert not list((smoke / KEPT).iterdir())


def test_a_stopped_dvc_repro_survives_the_next_dvc_exp_run_and_resumes(smoke, start):
    """Ctrl-C under `dvc repro` (SIGINT to its process group) stops the train stage at a
    checkpoint; README's next command, `dvc exp run -S experiment=smoke`, checks the workspace
    out, which deletes an output DVC has not recorded: the stopped run is kept, that command
    says so, and the stopped run's own values resume it from the stop step."""
    stopped_values = [*OTHER_RUN, "train.max_steps=80"]
    compose_params(smoke, *stopped_values)
    repro = start(smoke, ["dvc", "repro", "train"], "repro.log")
    wait_for_a_checkpoint(smoke, repro, "repro.log")
    os.killpg(repro.pid, signal.SIGINT)
    assert repro.wait(timeout=WAIT_S) != 0
    log = (smoke / "repro.log").read_text()
    assert "run the same command again to resume from it" in log, log[-3000:]
    step = _progress(smoke / KEPT / "progress.json")
    assert 20 <= step < 80, log[-3000:]
    kept = _file_hashes(smoke / KEPT)

    smoke_again = sh(["dvc", "exp", "run", *set_params(SMOKE)], smoke)
    output = smoke_again.stdout + smoke_again.stderr
    assert (
        f"{KEPT} keeps a run DVC has not recorded (experiment 'smoke', stopped at step {step} "
        "of 80): the train stage of a command with its values resumes it" in output
    ), output[-3000:]
    assert _file_hashes(smoke / KEPT) == kept

    resumed = sh(["dvc", "exp", "run", "train", *set_params(stopped_values)], smoke)
    output = resumed.stdout + resumed.stderr
    assert f"the stopped run goes on from step {step}: moved its " in output, output[-3000:]
    summary = yaml.safe_load((smoke / "metrics/train.json").read_text())
    assert summary["resumed_from"].endswith("last.ckpt") and summary["steps"] == 80


def test_a_second_dvc_exp_run_refused_as_busy_costs_the_first_nothing(smoke, start):
    """A second `dvc exp run` while the first trains: DVC rewrites params.yaml and checks the
    workspace out (the running stage's checkpoints replaced by its cache's) before it refuses
    to run a stage the first holds. The first, trained to the end, refuses to report success,
    says where its run is kept and that its own values record it; what is kept is that run's
    own checkpoints, and the first command again records it without training. The first's
    train stage is held still (SIGSTOP) while the second runs, so the second always comes
    mid-run, however fast the machine."""
    from pipeline.training.checkpoints import read_checkpoint

    command = ["dvc", "exp", "run", "train", *set_params(OTHER_RUN)]
    first_run = start(smoke, command, "first.log")
    wait_for_a_checkpoint(smoke, first_run, "first.log")
    stage = _train_stage(first_run.pid)
    assert len(stage) == 1, "one train stage under dvc exp run"
    stage[0].suspend()
    try:
        second = sh(["dvc", "exp", "run", "train", *set_params([*SMOKE, "train.lr_factor=0.125"])],
                    smoke, check=False)  # fmt: skip
    finally:
        stage[0].resume()
    assert second.returncode != 0 and "is busy" in second.stderr, second.stderr[-3000:]
    params = yaml.safe_load((smoke / "params.yaml").read_text())
    assert params["train"]["lr_factor"] == 0.125  # DVC's doing, before it refused
    assert first_run.wait(timeout=FINISH_S) != 0
    log = (smoke / "first.log").read_text()
    changed = "params.yaml changed while the train stage ran: 'train.lr_factor' was 0.25, now 0.125"
    assert changed in log, log[-3000:]
    assert (
        f"{KEPT} keeps a run DVC has not recorded (experiment 'smoke', finished at step 40): "
        "the train stage of a command with its values records it without training" in log
    ), log[-3000:]
    first = yaml.safe_load((smoke / "metrics/train.json").read_text())
    finished = _file_hashes(smoke / KEPT)
    kept = sorted((smoke / KEPT).glob("*.ckpt"))
    assert {"last.ckpt", "step-0000020.ckpt", "step-0000040.ckpt"} <= {p.name for p in kept}
    for path in kept:  # the first run's own, none of DVC's checkout
        assert read_checkpoint(path)["hyper_parameters"]["config"]["train"]["lr_factor"] == 0.25

    assert_recorded_not_retrained(smoke, command, finished, first)


def test_a_value_the_check_stage_refuses_leaves_params_yaml_byte_for_byte(smoke):
    """`dvc exp run -S seed=-1` without the experiment: DVC recomposes params.yaml from the
    default recipe before the check stage refuses the value; the file is put back byte for
    byte, so the next `dvc repro` has nothing to run (not the default experiment's hours)."""
    before = (smoke / "params.yaml").read_bytes()
    refused = sh(["dvc", "exp", "run", "-S", "seed=-1"], smoke, check=False)
    output = refused.stdout + refused.stderr
    assert refused.returncode != 0 and "config key 'seed'" in output, output[-3000:]
    seed = yaml.safe_load(before)["seed"]
    assert f"params.yaml: 'seed' put back to {seed!r} and every other value as it was" in output
    assert (smoke / "params.yaml").read_bytes() == before
    dry = sh(["dvc", "repro", "--dry"], smoke).stdout
    assert "Running stage 'train'" not in dry and "Running stage 'prepare'" not in dry, dry
