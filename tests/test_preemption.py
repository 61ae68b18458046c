"""Killed and preempted training runs, with real signals to real processes: a SIGKILL mid-epoch
and a SIGTERM/SIGUSR1 (saved checkpoint, exit code 3) both resume to exactly the weights,
optimizer state and sample order of an uninterrupted run; under 2-rank DDP a signal to one
rank stops both at the same step, and a rank that fails or hangs ends the job in bounded time.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from pipeline import config as config_lib
from pipeline import config_schema
from pipeline.cli import main
from pipeline.data.datamodule import TranslationDataModule
from pipeline.training.checkpoints import LAST_NAME, PROGRESS_NAME, checkpoint_dir, read_checkpoint
from pipeline.training.precision import cpu_has_bf16_instructions
from pipeline.training.preemption import (
    EXIT_PREEMPTED,
    PREEMPTION_SIGNALS,
    Preempted,
    PreemptionCallback,
)
from pipeline.training.trainer import run
from tests.conftest import RESUMED_RUN_ATOL, build_once, redirect_paths, shared_build, shared_root

ONE_THREAD_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MAX_STEPS = 45  # with max_tokens=3000: 35 batches per epoch, so runs cross an epoch
RUN = [
    "model.d_model=32",
    "model.heads=2",
    "model.d_ff=64",
    "model.encoder_layers=1",
    "model.decoder_layers=1",
    "model.dropout=0.1",  # resuming must also continue the dropout random stream
    "train.max_tokens=3000",
    "train.warmup_steps=10",
    "train.val_check_interval=10",  # step checkpoints (and last.ckpt) every 10 steps
    "train.val_bleu=false",
    "train.log_every_n_steps=5",
    "train.save_top_k=2",
    "train.progress_bar=false",
    f"train.max_steps={MAX_STEPS}",
    # The precision the recipe trains in on this CPU class: bf16-mixed where the CPU has bf16
    # instructions, float32 where bf16 would be emulated (`auto` never picks it there, and it
    # runs these steps ~3x slower). Pinned rather than `auto`, which times bf16 against float32
    # in each process: on a busy machine the killed run and the in-process reference run could
    # decide differently (a resumed run keeps its own: test_trainer.py).
    "train.precision=" + ("bf16-mixed" if cpu_has_bf16_instructions() else "32-true"),
]
EXIT_BOUND_S = 30  # a preempted run must have saved and exited within this long

# Trains `cfg.json` with `trainer.run` behind the stage CLI helper (exit codes 2/3), appending
# [step, example ids] of every training batch, as it starts, to batches.rank<r>.jsonl; optional
# `--signal STEP:NAME:RANK` sends NAME to itself as step STEP starts, `--fail STEP:RANK:HOW`
# raises (HOW=raise) or hangs (HOW=hang) there, noting the time in `failed_at`, and
# `--kill-after-saving NAME` SIGKILLs itself as soon as checkpoint NAME is written.
SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from lightning.pytorch.callbacks import Callback
    from pipeline.cli import main
    from pipeline.config import from_dict
    from pipeline.training.trainer import run

    class Recorder(Callback):
        def __init__(self, folder, signal_at=None, fail_at=None):
            self.folder, self.signal_at, self.fail_at = folder, signal_at, fail_at
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            step, rank = trainer.global_step + 1, trainer.global_rank
            with open(os.path.join(self.folder, f"batches.rank{rank}.jsonl"), "a") as f:
                f.write(json.dumps([step, batch["ids"].tolist()]) + "\\n")
            if self.signal_at and self.signal_at[0] == step and self.signal_at[2] == rank:
                os.kill(os.getpid(), getattr(signal, self.signal_at[1]))
            if self.fail_at and self.fail_at[:2] == (step, rank):
                with open(os.path.join(self.folder, "failed_at"), "w") as f:
                    f.write(str(time.time()))
                if self.fail_at[2] == "hang":
                    time.sleep(3600)
                raise RuntimeError(f"rank {rank} fails at step {step}")

    args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
    if "--kill-after-saving" in args:  # SIGKILL right after writing the checkpoint of that name
        from pipeline.training.checkpoint_io import AtomicCheckpointIO
        save = AtomicCheckpointIO.save_checkpoint
        def save_then_die(self, checkpoint, path, storage_options=None):
            save(self, checkpoint, path, storage_options)
            if os.path.basename(path) == args["--kill-after-saving"]:
                os.kill(os.getpid(), signal.SIGKILL)
        AtomicCheckpointIO.save_checkpoint = save_then_die
    signal_at = fail_at = None
    if "--signal" in args:
        step, name, rank = args["--signal"].split(":")
        signal_at = (int(step), name, int(rank))
    if "--fail" in args:  # STEP:RANK:raise|hang
        step, rank, how = args["--fail"].split(":")
        fail_at = (int(step), int(rank), how)
    with open(sys.argv[1]) as f:
        cfg = from_dict(json.load(f))
    recorder = Recorder(os.path.dirname(os.path.abspath(sys.argv[1])), signal_at, fail_at)
    main(lambda: run(cfg, callbacks=[recorder]))
    """
)


# ---------------------------------------------------------------------- helpers


def _config(tokenized_smoke, root: Path, *overrides: str) -> config_schema.Config:
    """`RUN` on the tokenized smoke data, every output under `root`."""
    cfg = config_lib.compose([f"data.raw_dir={tokenized_smoke.data.raw_dir}", "experiment=smoke",
                              *RUN, *overrides])  # fmt: skip
    cfg = redirect_paths(cfg, root)
    cfg.paths.prepared = tokenized_smoke.paths.prepared
    cfg.paths.tokenized = tokenized_smoke.paths.tokenized
    return cfg


def _start(cfg: config_schema.Config, *args: str) -> subprocess.Popen:
    """The training script on `cfg` in a process group of its own, in `paths.train_dir`/.."""
    folder = Path(cfg.paths.train_dir).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cfg.json").write_text(json.dumps(config_lib.to_dict(cfg)))
    (folder / "train_run.py").write_text(SCRIPT)
    return subprocess.Popen(
        [sys.executable, "train_run.py", "cfg.json", *args],
        cwd=folder,
        env=ONE_THREAD_ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the W&B service and DDP ranks too
    )


def _finish(process: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
        pytest.fail(f"training did not end within {timeout} s: {stderr[-3000:]}")
    return process.returncode, stderr


def _batches(cfg: config_schema.Config, rank: int = 0) -> list[tuple[int, list[int]]]:
    """[(step, example ids)] the script recorded (a line cut by SIGKILL is ignored)."""
    path = Path(cfg.paths.train_dir).parent / f"batches.rank{rank}.jsonl"
    rows = []
    for line in path.read_text().splitlines():
        try:
            step, ids = json.loads(line)
        except ValueError:
            continue
        rows.append((step, ids))
    return rows


def _last(cfg: config_schema.Config) -> dict:
    return read_checkpoint(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)


def _progress_step(cfg: config_schema.Config) -> int:
    try:
        return json.loads((checkpoint_dir(cfg.paths.train_dir) / PROGRESS_NAME).read_text())["step"]
    except (OSError, ValueError):
        return -1


def _logged(cfg: config_schema.Config) -> dict[str, list[tuple[int, float]]]:
    """What DVCLive wrote for `dvc plots`: [(step, value)] per metric ("train/loss", "lr",
    "val/loss", ...; a row being written is left out)."""
    folder = Path(cfg.paths.plots_dir) / "train" / "plots" / "metrics"
    logged = {}
    for path in sorted(folder.rglob("*.tsv")):
        rows = [line.split("\t") for line in path.read_text().splitlines()[1:]]
        name = path.relative_to(folder).with_suffix("").as_posix()
        logged[name] = [(int(row[0]), float(row[1])) for row in rows if len(row) == 2]
    return logged


def _assert_same_logs(cfg: config_schema.Config, uninterrupted: dict) -> None:
    """Every logged metric of the resumed run equals the uninterrupted run's, one row per step
    (the value of `train/tokens_per_sec` measures this process's speed, not the run)."""
    logged, expected = _logged(cfg), uninterrupted["logged"]
    assert logged.keys() == expected.keys() and {"train/loss", "lr", "val/loss"} <= logged.keys()
    for name in logged:
        assert [step for step, _ in logged[name]] == [step for step, _ in expected[name]], name
        if name == "train/tokens_per_sec":
            continue
        # Both runs on this machine, the same operations on the same batches: equal but for
        # last-bit noise (as RESUMED_RUN_ATOL); a batch skipped or repeated moves them by far more.
        for (step, value), (_, reference) in zip(logged[name], expected[name], strict=True):
            assert value == pytest.approx(reference, rel=1e-5, abs=RESUMED_RUN_ATOL), (name, step)


def _corrupt_newest(cfg: config_schema.Config) -> int:
    """Flip a byte in the middle of last.ckpt and of every checkpoint of its step (as a failing
    disk might): resume must go back to an older one. Returns that step."""
    directory = checkpoint_dir(cfg.paths.train_dir)
    newest = _last(cfg)["global_step"]
    for path in directory.glob("*.ckpt"):
        if path.name == LAST_NAME or f"step-{newest:07d}" in path.name:
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
    return newest


def _wait_for(condition, process: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if process.poll() is not None:  # its group may still hold the pipe: read it bounded
            _, stderr = _finish(process, timeout=60)
            pytest.fail(f"training ended before {what}: {stderr[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(process.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.02)


def _assert_same_training_state(a: dict, b: dict) -> None:
    """Two checkpoints hold the same step, weights (1e-6), optimizer state and lr."""
    assert a["global_step"] == b["global_step"] and a["epoch"] == b["epoch"]
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, tensor in b["state_dict"].items():
        torch.testing.assert_close(
            a["state_dict"][key], tensor, atol=RESUMED_RUN_ATOL, rtol=0, msg=key
        )
    (opt_a,), (opt_b,) = a["optimizer_states"], b["optimizer_states"]
    assert opt_a["param_groups"] == opt_b["param_groups"]  # lr, betas, step counts
    assert opt_a["state"].keys() == opt_b["state"].keys()
    for index, state in opt_b["state"].items():
        for name, value in state.items():  # Adam: step, exp_avg, exp_avg_sq
            torch.testing.assert_close(
                opt_a["state"][index][name], value, atol=RESUMED_RUN_ATOL, rtol=0
            )
    assert a["lr_schedulers"] == b["lr_schedulers"]


class RecordBatches(Callback):
    """In-process twin of the script's recorder: (step, example ids) of each training batch,
    and the target tokens of them all."""

    def __init__(self) -> None:
        self.batches: list[tuple[int, list[int]]] = []
        self.target_tokens = 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.batches.append((trainer.global_step + 1, batch["ids"].tolist()))
        self.target_tokens += int(batch["num_tgt_tokens"])


@pytest.fixture(scope="module")
@shared_build
def uninterrupted(tokenized_smoke, tmp_path_factory):
    """`RUN` trained in one go (in-process, once per test run): its final checkpoint and its
    batches by step."""
    root = shared_root(tmp_path_factory) / "uninterrupted"
    cfg = _config(tokenized_smoke, root)
    recorded = root / "batches.json"

    def build() -> None:
        recorder = RecordBatches()
        summary = run(cfg, callbacks=[recorder])
        assert summary["train/target_tokens"] == recorder.target_tokens > 0
        recorded.write_text(json.dumps({"batches": recorder.batches,
                                        "target_tokens": recorder.target_tokens}))  # fmt: skip

    build_once(root, build)
    recorder = json.loads(recorded.read_text())
    batches = dict(recorder["batches"])
    assert sorted(batches) == list(range(1, MAX_STEPS + 1))
    datamodule = TranslationDataModule(cfg)
    datamodule.setup("fit")
    per_epoch = len(datamodule.train_dataloader())
    assert per_epoch < MAX_STEPS  # the runs cross an epoch boundary
    # MAX_STEPS is no multiple of val_check_interval: the final step validates and saves all
    # the same, so a re-run records the finished run instead of training its last steps again
    assert _last(cfg)["global_step"] == MAX_STEPS and _progress_step(cfg) == MAX_STEPS
    return {"last": _last(cfg), "batches": batches, "per_epoch": per_epoch,
            "logged": _logged(cfg), "target_tokens": recorder["target_tokens"]}  # fmt: skip


# ---------------------------------------------------------------------- fast checks


def test_preempted_exits_with_its_own_code_and_message():
    def preempted() -> None:
        raise Preempted("training stopped by SIGTERM at step 7: saved x/last.ckpt")

    with pytest.raises(SystemExit) as exited:
        main(preempted)
    assert exited.value.code == EXIT_PREEMPTED == 3


def test_handlers_are_installed_and_restored(tmp_path):
    before = {signum: signal.getsignal(signum) for signum in PREEMPTION_SIGNALS}
    callback = PreemptionCallback(tmp_path / LAST_NAME)
    callback.install()
    callback.install()  # twice (setup, then after Lightning's own handler): restores the first
    try:
        os.kill(os.getpid(), signal.SIGUSR1)  # would end this process with the default handler
        assert callback.received == signal.SIGUSR1
    finally:
        callback.restore()
    assert {signum: signal.getsignal(signum) for signum in PREEMPTION_SIGNALS} == before


# ---------------------------------------------------------------------- single process


@pytest.mark.slow
@pytest.mark.parametrize("newest_corrupt", [False, True], ids=["from_last", "newest_corrupt"])
def test_sigkill_mid_epoch_then_resume_matches_an_uninterrupted_run(
    tokenized_smoke, tmp_path, uninterrupted, newest_corrupt
):
    """newest_corrupt: last.ckpt (and the step checkpoint beside it) unreadable after the kill,
    so the run resumes from an older checkpoint, further behind the histories on disk."""
    cfg = _config(tokenized_smoke, tmp_path / "killed")
    process = _start(cfg)

    # Kill the whole process group (training, W&B service) once a mid-epoch checkpoint at
    # step >= 20 exists and training has logged a row past it (work the kill will lose, rows
    # the resumed run must take back).
    def logged_past_a_checkpoint() -> bool:
        saved = _progress_step(cfg)
        logged = [step for step, _ in _logged(cfg).get("train/loss", [])] if saved >= 20 else []
        return saved >= 20 and max(logged, default=0) > saved

    _wait_for(logged_past_a_checkpoint, process, timeout=120, what="row logged past step 20")
    os.killpg(process.pid, signal.SIGKILL)
    returncode, _ = _finish(process)
    assert returncode == -signal.SIGKILL
    resumed_from = _last(cfg)["global_step"]
    if newest_corrupt:
        resumed_from = _corrupt_newest(cfg) - cfg.train.val_check_interval
    lost = [step for step, _ in _batches(cfg) if step > resumed_from]
    assert lost and resumed_from % uninterrupted["per_epoch"] != 0  # mid-epoch, work lost
    assert max(step for step, _ in _logged(cfg)["train/loss"]) > resumed_from
    killed_log = len(_batches(cfg))

    returncode, stderr = _finish(_start(cfg))  # the same command again
    assert returncode == 0, stderr[-3000:]
    _assert_same_training_state(_last(cfg), uninterrupted["last"])
    resumed = _batches(cfg)[killed_log:]
    assert [step for step, _ in resumed] == list(range(resumed_from + 1, MAX_STEPS + 1))
    expected = uninterrupted["batches"]
    assert all(ids == expected[step] for step, ids in resumed)  # nothing skipped or repeated
    assert _last(cfg)["history"] == uninterrupted["last"]["history"]  # logs, validations
    _assert_same_logs(cfg, uninterrupted)
    summary = json.loads((Path(cfg.paths.metrics_dir) / "train.json").read_text())
    assert summary["steps"] == MAX_STEPS
    resumed_name = Path(summary["resumed_from"]).name
    assert (
        resumed_name == LAST_NAME if not newest_corrupt else f"{resumed_from:07d}" in resumed_name
    )
    # the tokens the killed process trained on after its checkpoint are not counted twice
    assert summary["train/target_tokens"] == uninterrupted["target_tokens"]


@pytest.mark.slow
def test_sigkill_between_a_step_checkpoint_and_last_resumes_from_the_newer_one(
    tokenized_smoke, tmp_path, uninterrupted
):
    """Killed after writing step-0000020.ckpt, before last.ckpt (still at step 10): the re-run
    continues from step 20 instead of training steps 11-20 again."""
    cfg = _config(tokenized_smoke, tmp_path / "killed")
    returncode, _ = _finish(_start(cfg, "--kill-after-saving", "step-0000020.ckpt"))
    assert returncode == -signal.SIGKILL
    assert _last(cfg)["global_step"] == 10
    killed_log = len(_batches(cfg))

    returncode, stderr = _finish(_start(cfg))
    assert returncode == 0, stderr[-3000:]
    assert "resuming from" in stderr and "step-0000020.ckpt (step 20): it is newer than" in stderr
    resumed = _batches(cfg)[killed_log:]
    assert [step for step, _ in resumed] == list(range(21, MAX_STEPS + 1))  # none redone
    _assert_same_training_state(_last(cfg), uninterrupted["last"])
    summary = json.loads((Path(cfg.paths.metrics_dir) / "train.json").read_text())
    assert summary["resumed_from"].endswith("step-0000020.ckpt")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("signal_name", "step"),
    # 17: between validations, inside a logging window (every 5); 20: a validation step;
    # 35: a logging step between validations, the last batch of the first epoch
    [("SIGTERM", 17), ("SIGUSR1", 20), ("SIGTERM", 35)],
)
def test_preemption_signal_saves_exits_3_and_the_rerun_resumes_exactly(
    tokenized_smoke, tmp_path, uninterrupted, signal_name, step
):
    cfg = _config(tokenized_smoke, tmp_path / "preempted")
    returncode, stderr = _finish(_start(cfg, "--signal", f"{step}:{signal_name}:0"))
    assert returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert f"error: training stopped by {signal_name} at step {step}: saved " in stderr
    assert "Traceback" not in stderr
    assert _last(cfg)["global_step"] == step
    assert _progress_step(cfg) == step
    if step % cfg.train.val_check_interval == 0:  # the step's validation ran before stopping
        assert (checkpoint_dir(cfg.paths.train_dir) / f"step-{step:07d}.ckpt").exists()
    signalled_log = len(_batches(cfg))
    assert max(s for s, _ in _batches(cfg)) == step  # stopped at the end of that step
    every = cfg.train.log_every_n_steps
    logged = [s for s, _ in _logged(cfg)["train/loss"]]
    assert logged == list(range(every, step + 1, every))  # the stopped step's row included

    returncode, stderr = _finish(_start(cfg))
    assert returncode == 0, stderr[-3000:]
    _assert_same_training_state(_last(cfg), uninterrupted["last"])
    resumed = _batches(cfg)[signalled_log:]
    assert [s for s, _ in resumed] == list(range(step + 1, MAX_STEPS + 1))
    assert all(ids == uninterrupted["batches"][s] for s, ids in resumed)
    history = _last(cfg)["history"]
    assert history == uninterrupted["last"]["history"]  # every log and validation, once
    _assert_same_logs(cfg, uninterrupted)


@pytest.mark.slow
def test_last_ckpt_is_the_newest_state_after_one_and_two_resumes(
    tokenized_smoke, tmp_path, uninterrupted
):
    """Stopped before its first validation (step 5: the checkpoint callback has not yet named
    `last.ckpt` its own) and again at step 25, then run to the end: `last.ckpt` is each time
    the newest state, the final one the uninterrupted run's, and no `last-v1.ckpt` beside it
    (what `evaluate`, `export` and `translate` read is `last.ckpt`)."""
    cfg = _config(tokenized_smoke, tmp_path / "stopped")
    directory = checkpoint_dir(cfg.paths.train_dir)
    for stop in (5, 25, None):
        returncode, stderr = _finish(_start(cfg, *(["--signal", f"{stop}:SIGTERM:0"] * bool(stop))))
        assert returncode == (EXIT_PREEMPTED if stop else 0), stderr[-3000:]
        assert _last(cfg)["global_step"] == (stop or MAX_STEPS) == _progress_step(cfg)
        assert sorted(p.name for p in directory.glob("last*")) == [LAST_NAME]
    _assert_same_training_state(_last(cfg), uninterrupted["last"])


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_train_stage_saves_and_exits_promptly_on_a_stop_signal_to_its_process_group(
    tokenized_smoke, tmp_path, signal_name
):
    """The DVC stage as a scheduler stops it (SIGTERM to every process of the job) and as
    Ctrl-C does (the terminal's SIGINT to the foreground process group): one line, a
    checkpoint at the step it stops, and the same command resumes from it."""
    cfg = _config(tokenized_smoke, tmp_path, "train.max_steps=400")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(config_lib.to_dict(cfg)))
    stage = [sys.executable, "-m", "pipeline.stages.train"]
    process = subprocess.Popen(stage, cwd=tmp_path, env=ONE_THREAD_ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    _wait_for(lambda: _progress_step(cfg) >= 10, process, timeout=120, what="first checkpoint")
    signalled = time.monotonic()
    os.killpg(process.pid, getattr(signal, signal_name))
    returncode, stderr = _finish(process, timeout=EXIT_BOUND_S + 60)
    exit_seconds = time.monotonic() - signalled
    print(f"train stage exited {exit_seconds:.2f} s after {signal_name}")
    assert returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert exit_seconds < EXIT_BOUND_S
    step = _last(cfg)["global_step"]
    assert _progress_step(cfg) == step  # the stop step's checkpoint is the newest save
    assert f"training stopped by {signal_name} at step {step}: saved " in stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr[-3000:]
    assert [line for line in stderr.splitlines() if line.startswith("error: ")] == [
        stderr.rstrip().splitlines()[-1]
    ]
    assert 10 <= step < 400
    assert "weights_only" not in stderr  # the stop's save says nothing about its arguments

    copy_cfg = copy.deepcopy(cfg)  # the re-run (shorter, to finish quickly) resumes from it
    copy_cfg.train.max_steps = step + 2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(config_lib.to_dict(copy_cfg)))
    result = subprocess.run(stage, cwd=tmp_path, env=ONE_THREAD_ENV, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((Path(cfg.paths.metrics_dir) / "train.json").read_text())
    assert summary["resumed_from"].endswith(LAST_NAME) and summary["steps"] == step + 2
    # Resuming is what the folder's checkpoints are for: no warning that they are there.
    assert "exists and is not empty" not in result.stdout + result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_a_signal_while_the_train_stage_starts_exits_3_with_the_message(
    tokenized_smoke, tmp_path, signal_name
):
    """In its first second the stage is still loading torch and Lightning: the signal must
    not kill it with status 143 and no word, nor be lost; nothing is trained."""
    cfg = _config(tokenized_smoke, tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(config_lib.to_dict(cfg)))
    process = subprocess.Popen([sys.executable, "-m", "pipeline.stages.train"], cwd=tmp_path,
                               env=ONE_THREAD_ENV, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    time.sleep(1.0)
    process.send_signal(getattr(signal, signal_name))
    returncode, stderr = _finish(process, timeout=120)
    assert returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert (
        f"error: training stopped by {signal_name} before its first step; run the same "
        "command again to resume from the start" in stderr
    )
    assert _progress_step(cfg) == -1  # no checkpoint: nothing was trained


# ---------------------------------------------------------------------- DDP, 2 CPU ranks

DDP = ["train.accelerator=cpu", "train.devices=2", "train.ddp_timeout=20", "train.max_steps=400"]


def _rank_one(process: subprocess.Popen, timeout: float = 120) -> psutil.Process:
    """Rank 1: the script again, started by rank 0 (Lightning's subprocess launcher)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in psutil.Process(process.pid).children(recursive=True):
            try:
                if "train_run.py" in " ".join(child.cmdline()):
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail("rank 1 did not start")


def _wait_job(process: subprocess.Popen, rank_one: psutil.Process) -> tuple[int, str]:
    """Wait for both ranks to be gone; rank 0's exit code and both ranks' stderr."""
    returncode, stderr = _finish(process, timeout=180)
    try:
        rank_one.wait(timeout=60)
    except psutil.TimeoutExpired:
        rank_one.kill()
        pytest.fail("rank 1 outlived rank 0 by a minute")
    return returncode, stderr


@pytest.mark.slow
def test_ddp_signal_to_one_rank_stops_both_at_the_same_step(tokenized_smoke, tmp_path):
    cfg = _config(tokenized_smoke, tmp_path, *DDP)
    process = _start(cfg)
    rank_one = _rank_one(process)
    _wait_for(lambda: _progress_step(cfg) >= 10, process, timeout=180, what="first checkpoint")
    signalled = time.monotonic()
    rank_one.send_signal(signal.SIGTERM)  # rank 1 alone, as a node-local preemption would
    returncode, stderr = _wait_job(process, rank_one)
    seconds = time.monotonic() - signalled
    print(f"DDP job ended {seconds:.2f} s after SIGTERM to rank 1")
    assert returncode == EXIT_PREEMPTED, stderr[-3000:]
    assert seconds < EXIT_BOUND_S
    step = _last(cfg)["global_step"]
    assert f"training stopped by SIGTERM at step {step}: saved " in stderr  # rank 1
    assert f"training stopped by another rank's signal at step {step}: saved " in stderr
    assert max(s for s, _ in _batches(cfg, rank=0)) == max(s for s, _ in _batches(cfg, 1)) == step


@pytest.mark.slow
@pytest.mark.parametrize(("failing_rank", "how"), [(1, "raise"), (0, "raise"), (1, "hang")])
def test_ddp_a_failing_or_hung_rank_ends_the_whole_job(
    tokenized_smoke, tmp_path, failing_rank, how
):
    cfg = _config(tokenized_smoke, tmp_path, *DDP)
    process = _start(cfg, "--fail", f"3:{failing_rank}:{how}")
    rank_one = _rank_one(process)
    returncode, stderr = _wait_job(process, rank_one)
    failed_at = float((Path(cfg.paths.train_dir).parent / "failed_at").read_text())
    seconds = time.time() - failed_at
    print(f"DDP job ended {seconds:.2f} s after rank {failing_rank} began to {how}")
    assert returncode not in (0, None), stderr[-3000:]
    if how == "hang":  # the others wait train.ddp_timeout for it, then end the job
        assert "Timed out" in stderr
        assert cfg.train.ddp_timeout <= seconds < cfg.train.ddp_timeout + EXIT_BOUND_S
    else:
        assert seconds < EXIT_BOUND_S
