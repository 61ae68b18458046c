"""Train the Transformer: one `run(cfg)` for the DVC train stage and for sweep trials.

    cfg.train --> Lightning Trainer (accelerator, devices, DDP, precision, steps, clipping,
                                      accumulation, validation cadence)
              --> callbacks: checkpoints (last + last-k by step + best-k by val/bleu),
                             optional early stopping, the caller's own (e.g. Optuna pruning)
              --> loggers:   W&B (`pipeline.tracking`, rank zero) and DVCLive (dvc plots)
    outputs:  <train_dir>/checkpoints/ (see `pipeline.training.checkpoints`),
              <plots_dir>/train/ (DVCLive: plots/metrics/<key>.tsv, metrics.json) and
              <plots_dir>/train/learning_curve.png, <metrics_dir>/train.json.

With `train.resume` a run that finds its own checkpoint continues from it: step, epoch,
optimizer, schedule, random streams, the position in the epoch's batch order and DVCLive's
histories as they were at that step (`pipeline.training.live`).
SIGTERM/SIGUSR1 save `last.ckpt` at the end of the current step and raise `Preempted` (exit
code 3; `pipeline.training.preemption`); under DDP a failing rank 0 takes its ranks down, and
collectives give up after `train.ddp_timeout` seconds, so a dead or hung rank ends the job.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from lightning.fabric.plugins.environments import (
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from pipeline.atomic import remove_stale_temps, write_json_atomic
from pipeline.config import leaves, subtree, to_dict, with_runtime_section
from pipeline.config_schema import Config
from pipeline.data.datamodule import TranslationDataModule
from pipeline.errors import ConfigError, PipelineError, Preempted
from pipeline.tracking import PipelineWandbLogger, wandb_logger
from pipeline.training import early_signals
from pipeline.training.checkpoints import (
    BEST_TEMPLATES,
    LAST_NAME,
    STEP_TEMPLATE,
    AtomicCheckpointIO,
    checkpoint_dir,
    code_version,
    find_resume_checkpoint,
    move_checkpoints,
    read_checkpoint,
)
from pipeline.training.cpu_memory import configure_cpu_memory
from pipeline.training.live import LiveHistory, SafeDVCLiveLogger
from pipeline.training.module import PRECISION_KEY, TranslationModule
from pipeline.training.precision import resolve_precision
from pipeline.training.preemption import PreemptionCallback, under_dvc_exp_run
from pipeline.training.progress import StepProgress, silence_lightning_noise

log = logging.getLogger(__name__)

METRICS_FILE = "train.json"
DVCLIVE_SUBDIR = "train"  # under paths.plots_dir
LEARNING_CURVE_FILE = "learning_curve.png"
# A resumed run must compute what an uninterrupted one would: every key of these sections must
# match the checkpoint's, except RESUME_FREE_KEYS.
RESUME_FIXED_KEYS = ("seed", "model", "data", "train", "runtime")
# Keys that cannot change the weights a run ends with (where the corpus is read from, how
# often it validates and logs, on which devices and how fast it runs, how many checkpoints it
# keeps). `train.max_steps` may grow (extending a run) unless a cool-down depends on it.
RESUME_FREE_KEYS = (
    "data.raw_dir",
    "data.test_splits",  # never read by training: a new test set costs an evaluation only
    "data.download",
    "data.url",
    "train.max_steps",
    "train.val_check_interval",
    "train.val_bleu",
    "train.val_bleu_max_sentences",
    "train.accelerator",
    "train.devices",
    "train.num_nodes",
    "train.strategy",
    "train.ddp_timeout",
    "train.float32_matmul_precision",  # GPU numerics, like the device itself
    "train.num_workers",
    "train.save_top_k",
    "train.early_stopping_patience",
    "train.resume",
    "train.compile",
    "train.log_every_n_steps",
    "train.progress_bar",
    "train.progress_every",
    "train.deterministic",
    "runtime.bf16_min_speedup",
    "runtime.compile_loss",
    "runtime.cpu_mmap_threshold_mb",
    "runtime.onednn_primitive_cache",
)
GPU_ACCELERATORS = ("gpu", "cuda")
REPLACED_SUFFIX = ".replaced"  # <train_dir>.replaced/<time>/: runs a fresh run moved aside
# <train_dir>.preempted/: a run stopped under `dvc exp run`, out of reach of its next checkout
PREEMPTED_SUFFIX = ".preempted"


# ---------------------------------------------------------------------- hardware


def resolve_accelerator(requested: str) -> str:
    if requested != "auto":
        return requested
    if torch.cuda.is_available():
        return "gpu"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def device_count(devices, accelerator: str) -> int:
    """How many devices `Trainer(devices=...)` will use on this node."""
    if isinstance(devices, (list, tuple)):
        return len(devices)
    if isinstance(devices, str) and devices != "auto":
        devices = [d for d in devices.split(",") if d.strip()] if "," in devices else int(devices)
        return len(devices) if isinstance(devices, list) else device_count(devices, accelerator)
    if devices == "auto" or devices == -1:
        return torch.cuda.device_count() if accelerator in ("gpu", "cuda") else 1
    return int(devices)


def resolve_strategy(requested: str, num_devices: int, num_nodes: int) -> str:
    """`auto`: DDP whenever more than one process trains (gloo on CPU, NCCL on GPU)."""
    if requested != "auto":
        return requested
    return "ddp" if num_devices * num_nodes > 1 else "auto"


# ---------------------------------------------------------------------- callbacks


def monitored_metric(cfg: Config) -> tuple[str, str]:
    """The metric that ranks checkpoints (and stops early): val/bleu, or val/loss without it."""
    return ("val/bleu", "max") if cfg.train.val_bleu else ("val/loss", "min")


def build_callbacks(cfg: Config) -> list[Callback]:
    directory = checkpoint_dir(cfg.paths.train_dir)
    monitor, mode = monitored_metric(cfg)
    callbacks: list[Callback] = [
        # last.ckpt (resume) + the newest save_top_k validations (averaging the last N)
        ModelCheckpoint(
            dirpath=directory,
            filename=STEP_TEMPLATE,
            monitor="step",
            mode="max",
            save_top_k=cfg.train.save_top_k,
            save_last=True,
            auto_insert_metric_name=False,
        ),
        # the best save_top_k validations (averaging the best N)
        ModelCheckpoint(
            dirpath=directory,
            filename=BEST_TEMPLATES[monitor],
            monitor=monitor,
            mode=mode,
            save_top_k=cfg.train.save_top_k,
            auto_insert_metric_name=False,
        ),
    ]
    if cfg.train.early_stopping_patience is not None:
        callbacks.append(
            EarlyStopping(
                monitor=monitor,
                mode=mode,
                patience=cfg.train.early_stopping_patience,
                check_on_train_epoch_end=False,
            )
        )
    return callbacks


def check_cluster_launch(num_nodes: int, devices_per_node: int) -> None:
    """Several machines train together only when a cluster launcher started every process:
    torchrun (its TORCHELASTIC_RUN_ID, RANK, WORLD_SIZE, ...), SLURM's srun (SLURM_NTASKS,
    SLURM_PROCID, ...) or hand-set MASTER_ADDR/NODE_RANK/LOCAL_RANK, which Lightning's cluster
    environments read. Started plainly, rank 0 would wait for the other machines until
    `train.ddp_timeout`: refused before any compute, naming the key and the launchers."""
    if num_nodes == 1:
        return
    launched = (
        TorchElasticEnvironment.detect()
        or SLURMEnvironment.detect()
        or LightningEnvironment().creates_processes_externally
    )
    if not launched:
        raise ConfigError(
            f"config key 'train.num_nodes': {num_nodes} machines need a cluster launcher to "
            "start one process per device on each: `torchrun --nnodes N --nproc-per-node D "
            "--node-rank R --master-addr HOST --master-port PORT -m pipeline.stages.train` "
            "on every machine, or `srun` in a SLURM job (see the training docs); or set "
            "train.num_nodes=1"
        )
    expected = num_nodes * devices_per_node
    world_size = os.environ.get("WORLD_SIZE") or os.environ.get("SLURM_NTASKS")
    if world_size is not None and int(world_size) != expected:
        raise ConfigError(
            f"config key 'train.num_nodes': {num_nodes} machines x {devices_per_node} "
            f"device(s) (train.devices) make {expected} processes, but the launcher started "
            f"{world_size}; make train.num_nodes x train.devices equal the launcher's world size"
        )


def build_strategy(cfg: Config, accelerator: str) -> str | Strategy:
    """`train.strategy` resolved; plain DDP gets `train.ddp_timeout` for its collectives, so a
    rank that died or hangs ends the job after that long instead of stalling the others."""
    t = cfg.train
    strategy = resolve_strategy(t.strategy, device_count(t.devices, accelerator), t.num_nodes)
    if strategy == "ddp":
        return DDPStrategy(timeout=timedelta(seconds=t.ddp_timeout))
    return strategy


def build_trainer(
    cfg: Config,
    loggers: Sequence,
    callbacks: Sequence[Callback] = (),
    trained_in: str | None = None,
) -> tuple[L.Trainer, str]:
    """The Lightning Trainer for `cfg.train`; returns it with the precision it resolved.

    `trained_in`: the precision a resumed run was trained in. `train.precision: auto` keeps
    it rather than deciding anew: the timing behind `auto` can come out otherwise on a busy
    or another machine, and a run that changed precision midway is not the run it resumes.
    """
    t = cfg.train
    accelerator = resolve_accelerator(t.accelerator)
    if t.precision == "auto" and trained_in is not None:
        precision = trained_in
    else:
        precision = resolve_precision(
            t.precision, accelerator, d_model=cfg.model.d_model, d_ff=cfg.model.d_ff,
            min_speedup=cfg.runtime.bf16_min_speedup,
        )  # fmt: skip
    strategy = build_strategy(cfg, accelerator)
    silence_lightning_noise()
    progress = [StepProgress(t.progress_every)] if t.progress_bar else []
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=strategy,
        precision=precision,
        max_steps=t.max_steps,
        max_epochs=t.max_epochs,
        # Lightning counts validation in batches; the config counts optimizer steps. Exact:
        # the batch sampler makes every epoch a whole number of updates of that many batches.
        val_check_interval=t.val_check_interval * t.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=1,  # one validation batch (loss + decode) before the first step
        accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=t.gradient_clip_val or None,
        log_every_n_steps=t.log_every_n_steps,
        enable_progress_bar=t.progress_bar,
        # StepProgress says the model's size; Lightning's table adds a column of zero FLOPs
        enable_model_summary=False,
        deterministic=t.deterministic,
        # The token batch sampler shards by rank itself.
        use_distributed_sampler=False,
        logger=list(loggers),
        callbacks=[*build_callbacks(cfg), *callbacks, *progress],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=cfg.paths.train_dir,
    )
    return trainer, precision


# ---------------------------------------------------------------------- resume


def config_differences(saved: dict, cfg: Config) -> tuple[list[str], list[str]]:
    """(fixed, free): the keys whose values differ between a checkpoint's config and `cfg`,
    split into those that change what the run computes and those that cannot."""
    saved = with_runtime_section(saved)  # a checkpoint of the older layout compares as today's
    current, defaults = to_dict(cfg), to_dict(Config())
    fixed, free = [], []
    for section in RESUME_FIXED_KEYS:
        # A key the checkpoint's config lacks is newer than it: its default is what ran.
        before = {**leaves(subtree(defaults, section), section),
                  **leaves(subtree(saved, section), section)}  # fmt: skip
        now = leaves(subtree(current, section), section)
        for key in sorted(set(before) | set(now)):
            if before.get(key) == now.get(key):
                continue
            if key.startswith("data.sha256"):
                free.append(key)
            elif key == "train.max_steps":
                cooldown = subtree(current, "train.cooldown_steps")
                (fixed if cooldown else free).append(key)  # the cool-down starts from it
            else:
                (free if key in RESUME_FREE_KEYS else fixed).append(key)
    return fixed, free


def _describe(key: str, saved: dict, cfg: Config) -> str:
    return f"'{key}' is {subtree(to_dict(cfg), key)!r} (the checkpoint's: {subtree(saved, key)!r})"


def check_same_run(
    checkpoint_path: Path, cfg: Config, refusal: str, saved: dict | None = None
) -> list[str]:
    """Raise a ConfigError naming the key(s), followed by `refusal`, if `cfg` differs from the
    checkpoint's config in a key that changes what the run computes; return the keys that
    differ but cannot change it (RESUME_FREE_KEYS) as descriptions. `saved`: the checkpoint's
    config when the caller has already read it (else it is read from `checkpoint_path`)."""
    if saved is None:
        saved = read_checkpoint(checkpoint_path)["hyper_parameters"]["config"]
    saved = with_runtime_section(saved, str(checkpoint_path))
    fixed, free = config_differences(saved, cfg)
    if fixed:
        details = "; ".join(_describe(key, saved, cfg) for key in fixed)
        raise ConfigError(
            f"config key '{fixed[0]}' differs from {checkpoint_path}'s: {details}. {refusal}"
        )
    return [_describe(key, saved, cfg) for key in free]


def check_resumable(checkpoint_path: Path, cfg: Config, saved: dict | None = None) -> None:
    """A checkpoint may only be continued by a config that computes the same run; anything
    else is a ConfigError naming the key(s). Differences in keys that cannot change the result
    (RESUME_FREE_KEYS) are listed in a warning. `saved` as in `check_same_run`."""
    free = check_same_run(
        checkpoint_path,
        cfg,
        "A resumed run must keep every setting that changes its result. Restore the value(s), "
        "or start over with train.resume=false (the run is moved aside, not deleted) or "
        "another paths.train_dir.",
        saved,
    )
    if free:
        warnings.warn(
            f"resuming {checkpoint_path} with other values of keys that do not change the "
            f"result: {'; '.join(free)}",
            stacklevel=2,
        )


def resume_checkpoint(cfg: Config, keep_finished: bool = False) -> Path | None:
    """The checkpoint to continue from, or None to train anew (see `resume_point`)."""
    return resume_point(cfg, keep_finished)[0]


def resume_point(cfg: Config, keep_finished: bool = False) -> tuple[Path | None, str | None]:
    """The checkpoint to continue from (None: train anew) and the precision it was trained in
    (None where not recorded).

    With `train.resume`:
    - an interrupted run (short of its own `max_steps`) continues when the config computes the
      same run (`check_resumable`); otherwise a ConfigError names the key, since its
      checkpoints exist nowhere else. A `train.max_steps` below its progress is refused too;
    - a finished run of the same config and the same code is done: it is returned, and
      training restores it and stops at once (a `dvc repro` whose lock was never written
      records it instead of retraining it). With a larger `train.max_steps` it is extended.
      `keep_finished` (sweeps) keeps it whatever the code version;
    - a finished run of another config or other code (`dvc repro` after a code change, `dvc exp
      run -S model.heads=8`) is moved aside to `<train_dir>.replaced/` and trained anew.
    `train.resume=false` also moves the previous run aside: nothing is deleted.
    """
    train_dir = Path(cfg.paths.train_dir)
    if rank_zero_only.rank == 0:  # half-written files of a writer that was killed
        remove_stale_temps(checkpoint_dir(train_dir))
    restore_preempted_run(cfg)
    if not cfg.train.resume:
        _move_aside(train_dir, "train.resume=false")
        return None, None
    path = find_resume_checkpoint(train_dir)
    if path is None:
        return None, None
    checkpoint = read_checkpoint(path)
    trained_in = checkpoint.get(PRECISION_KEY)
    step = int(checkpoint["global_step"])
    saved = checkpoint["hyper_parameters"]["config"]
    trained_to = subtree(saved, "train.max_steps")
    if step < trained_to:  # an interrupted run: refuse to discard it silently
        if cfg.train.max_steps < step:
            raise ConfigError(
                f"train.max_steps={cfg.train.max_steps} is below step {step}, which the "
                f"interrupted run in {path.parent} already reached: raise it (to at least "
                f"{step}), or start over with train.resume=false"
            )
        check_resumable(path, cfg, saved)
        return path, trained_in
    fixed, _ = config_differences(saved, cfg)
    same_code = keep_finished or checkpoint.get("code_version") == code_version()
    if fixed and fixed != ["train.max_steps"] or not same_code:
        why = "its code differs" if not fixed else f"its config differs in {', '.join(fixed)}"
        _move_aside(train_dir, f"the finished run there is another experiment ({why})")
        return None, None
    if cfg.train.max_steps < step:
        _move_aside(train_dir, f"its run reached step {step}, beyond train.max_steps")
        return None, None
    return path, trained_in  # done (nothing to train) or, with a larger max_steps, extended


def _move_aside(train_dir: Path, why: str) -> None:
    """Move a previous run's checkpoints to `<train_dir>.replaced/<time>/` (never delete)."""
    if rank_zero_only.rank != 0:
        return
    stamp = time.strftime("%Y%m%d-%H%M%S")
    destination = _beside(train_dir, REPLACED_SUFFIX) / stamp
    moved = move_checkpoints(train_dir, destination)
    if moved:
        from pipeline.disk_usage import leftovers_message

        warnings.warn(
            f"training anew in {checkpoint_dir(train_dir)}: {why}; moved the previous run's "
            f"{len(moved)} checkpoint files to {destination}. Runs moved aside: "
            f"{leftovers_message([destination.parent])}",
            stacklevel=3,
        )


# ---------------------------------------------------------------------- the run


def run(
    cfg: Config,
    *,
    callbacks: Sequence[Callback] = (),
    job_type: str = "train",
    run_name: str | None = None,
    group: str | None = None,
    wandb_run=None,
    keep_finished: bool = False,
) -> dict:
    """Train per `cfg` (resuming its own checkpoint when `train.resume`), write
    `<metrics_dir>/train.json` and the learning curves, and return the summary metrics.

    `callbacks` are added to the Trainer's (an Optuna pruning callback, for instance);
    `job_type`, `run_name` and `group` label the W&B run this starts, unless `wandb_run` is
    given: then training logs into that run and its owner finishes it. `keep_finished`: a
    finished run of this config is done even if the code changed since (see
    `resume_checkpoint`).
    """
    restored = restore_preempted_run(cfg)
    try:
        return _run(cfg, callbacks, job_type, run_name, group, wandb_run, keep_finished)
    except BaseException as failed:
        # Under `dvc exp run`, a stopped run's checkpoints left in the stage's output are
        # deleted by the next run's checkout: any failure after they were put back (a
        # refused config, say) keeps them out of its reach again.
        stopped = isinstance(failed, Preempted)
        if not under_dvc_exp_run() or not (stopped or restored):
            raise
        if not (kept := stash_preempted_run(cfg)):
            raise
        where = (
            f"its checkpoints wait in {kept}, where the workspace checkout of the next "
            "`dvc exp run` does not delete them"
        )
        if stopped:
            raise Preempted(f"{failed} ({where})") from None
        if isinstance(failed, PipelineError):
            failed.args = (f"{failed} (the stopped run is not lost: {where})",)
        else:
            log.warning("the stopped run is not lost: %s", where)
        raise


def _beside(train_dir: str | Path, suffix: str) -> Path:
    """`<train_dir><suffix>`: a folder beside the train stage's output, not part of it."""
    train_dir = Path(train_dir)
    return train_dir.with_name(train_dir.name + suffix)


def stash_preempted_run(cfg: Config) -> Path | None:
    """Move a stopped run's checkpoints out of the train stage's output, which the next `dvc
    exp run` deletes before it runs (DVC never recorded it); `resume_point` moves them back.
    Returns where they went (None: there were none, or another rank moves them)."""
    kept = checkpoint_dir(_beside(cfg.paths.train_dir, PREEMPTED_SUFFIX))
    if rank_zero_only.rank == 0 and move_checkpoints(cfg.paths.train_dir, kept):
        return kept
    return None


def restore_preempted_run(cfg: Config) -> bool:
    """Put a run stopped under `dvc exp run` back in place (a run found there instead, which
    that checkout restored from DVC's cache, is moved aside: nothing is deleted). Returns
    whether there was one."""
    kept = _beside(cfg.paths.train_dir, PREEMPTED_SUFFIX)
    stash = checkpoint_dir(kept)
    if rank_zero_only.rank != 0 or not stash.is_dir() or not any(stash.iterdir()):
        return False
    _move_aside(Path(cfg.paths.train_dir), "the run stopped under `dvc exp run` goes on there")
    moved = move_checkpoints(kept, checkpoint_dir(cfg.paths.train_dir))
    log.info("moved the %d checkpoint files of the stopped run back from %s", len(moved), stash)
    return True


def _run(cfg, callbacks, job_type, run_name, group, wandb_run, keep_finished) -> dict:
    started = time.perf_counter()
    accelerator = resolve_accelerator(cfg.train.accelerator)
    check_cluster_launch(cfg.train.num_nodes, device_count(cfg.train.devices, accelerator))
    if accelerator == "cpu" and cfg.runtime.cpu_speed_paths:
        configure_cpu_memory(cfg.runtime.cpu_mmap_threshold_mb, cfg.runtime.onednn_primitive_cache)
    on_gpu = accelerator in GPU_ACCELERATORS
    if on_gpu:  # TF32 tensor cores for float32 matmuls (32-true); bf16-mixed is unaffected
        torch.set_float32_matmul_precision(cfg.train.float32_matmul_precision)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    ckpt_path, trained_in = resume_point(cfg, keep_finished=keep_finished)
    _stop_if_signalled(ckpt_path)

    datamodule = TranslationDataModule(cfg, pin_memory=on_gpu)
    datamodule.setup("fit")
    datamodule.check_max_positions([cfg.data.train_split, cfg.data.val_split])  # before training
    module = TranslationModule(cfg, datamodule.vocab_size)
    module.code_version = code_version()
    module.process_started = started
    module.attach_references(datamodule.tokenizer, datamodule.split(cfg.data.val_split).tgt_text)

    wandb = wandb_logger(cfg, job_type, name=run_name, group=group, run=wandb_run)
    dvclive = SafeDVCLiveLogger(
        dir=str(Path(cfg.paths.plots_dir) / DVCLIVE_SUBDIR),
        resume=ckpt_path is not None,
        save_dvc_exp=False,  # the DVC stage (or the sweep) owns experiments
        dvcyaml=None,  # dvc.yaml is written by hand
        report=None,
    )
    preemption = PreemptionCallback(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)
    module.preemption = preemption
    trainer, precision = build_trainer(
        cfg, [wandb, dvclive], [*callbacks, preemption, LiveHistory(dvclive)], trained_in=trained_in
    )
    _stop_if_signalled(ckpt_path)
    try:
        # weights_only: the resumed file loads as every checkpoint does (no code in it runs).
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:  # Lightning's handler, in the moment before ours took over
        raise _stopped_before_training(signal.SIGTERM, ckpt_path) from None
    except Preempted:
        raise  # every rank saved and stopped at the same step
    except BaseException:
        # Rank 0 takes the ranks it launched down with it: the others fail on their own when
        # a peer's connection closes or train.ddp_timeout passes, but a hung rank never would.
        if trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signal.SIGKILL)
        raise
    finally:
        preemption.restore()

    summary = summarize(cfg, trainer, module, precision, ckpt_path, time.perf_counter() - started)
    if trainer.is_global_zero:
        write_outputs(cfg, summary, module.history)
        _finish_wandb(wandb, summary)
    return summary


def _stopped_before_training(signum: int, ckpt_path: Path | None) -> Preempted:
    return Preempted(
        f"training stopped by {signal.Signals(signum).name} before its first step; run the "
        f"same command again to resume from {ckpt_path or 'the start'}"
    )


def _stop_if_signalled(ckpt_path: Path | None) -> None:
    """A preemption signal that came while the stage was starting (`early_signals`) stops it
    before it spends compute."""
    if (signum := early_signals.received()) is not None:
        raise _stopped_before_training(signum, ckpt_path)


def summarize(
    cfg: Config,
    trainer: L.Trainer,
    module: TranslationModule,
    precision: str,
    resumed_from: Path | None,
    wall_time: float,
) -> dict:
    """The run's headline numbers: best validation (what sweeps optimise), the last one,
    model size and throughput."""
    best = module.best_val() or {}
    records = module.val_records()
    last_train = [r for r in module.history if "train/loss" in r]
    metrics_of = ("val/bleu", "val/loss", "val/ppl")
    return {
        **{key: best.get(key) for key in metrics_of},
        "best_step": best.get("step"),
        "last": {
            **{key: records[-1].get(key) for key in metrics_of if records},
            "train/loss": last_train[-1]["train/loss"] if last_train else None,
            "step": trainer.global_step,
        },
        "num_parameters": module.model.num_parameters(),
        "train/tokens_per_sec": module.throughput,
        "train/target_tokens": int(module.target_tokens),
        "steps": trainer.global_step,
        "epochs": trainer.current_epoch,
        # The whole run's, across resumes, to its final checkpoint (work lost to a kill
        # excluded: a finished run that is only recorded keeps its own); this process's too.
        "wall_time_s": module.final_totals["wall_seconds"],
        "process_wall_time_s": wall_time,
        "precision": precision,
        "world_size": trainer.world_size,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "checkpoint_dir": str(checkpoint_dir(cfg.paths.train_dir)),
    }


def write_outputs(cfg: Config, summary: dict, history: list[dict]) -> None:
    from pipeline.evaluation.plots import plot_learning_curves

    write_json_atomic(Path(cfg.paths.metrics_dir) / METRICS_FILE, summary)
    if history:
        curve = Path(cfg.paths.plots_dir) / DVCLIVE_SUBDIR / LEARNING_CURVE_FILE
        plot_learning_curves(history, curve, title=cfg.experiment_name)


def _finish_wandb(logger: PipelineWandbLogger, summary: dict) -> None:
    run = logger.experiment
    for key, value in summary.items():
        if key != "last" and value is not None:
            run.summary[f"best/{key}" if key.startswith("val/") else key] = value
    logger.finish()
