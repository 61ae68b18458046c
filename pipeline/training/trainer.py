"""Train the Transformer: one `run(cfg)` for the DVC train stage and for sweep trials.

    cfg.train --> Lightning Trainer (accelerator, devices and DDP: `pipeline.training.hardware`;
                                      precision, steps, clipping, accumulation, validation
                                      cadence)
              --> callbacks: throughput and wall time (`pipeline.training.throughput`),
                             checkpoints (last + last-k by step + best-k by val/greedy_bleu),
                             optional early stopping, the caller's own (e.g. Optuna pruning)
              --> loggers:   W&B (`pipeline.tracking`, rank zero) and DVCLive (dvc plots)
    outputs:  <train_dir>/checkpoints/ (see `pipeline.training.checkpoints`),
              <plots_dir>/train/ (DVCLive: plots/metrics/<key>.tsv, metrics.json) and
              <plots_dir>/train/learning_curve.png, <metrics_dir>/train.json.

With `train.resume` a run that finds its own checkpoint continues from it
(`pipeline.training.resume` decides whether it may): step, epoch, optimizer, schedule, random
streams, the position in the epoch's batch order and DVCLive's histories as they were at that
step (`pipeline.training.live`).
SIGTERM/SIGUSR1/SIGINT save `last.ckpt` at the end of the current step and raise `Preempted` (exit
code 3; `pipeline.training.preemption`); under DDP a failing rank 0 takes its ranks down, and
collectives give up after `train.ddp_timeout` seconds, so a dead or hung rank ends the job.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Sequence
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping
from lightning.pytorch.utilities.exceptions import SIGTERMException

from pipeline.atomic import write_json_atomic
from pipeline.config_schema import Config
from pipeline.data.datamodule import TranslationDataModule
from pipeline.errors import PipelineError, Preempted
from pipeline.metric_names import GREEDY_VAL_BLEU, MEAN_TOKENS_PER_SEC, VAL_METRICS
from pipeline.training import early_signals
from pipeline.training.checkpoint_io import AtomicCheckpointIO, PortableModelCheckpoint
from pipeline.training.checkpoints import (
    BEST_TEMPLATES,
    LAST_NAME,
    STEP_TEMPLATE,
    checkpoint_dir,
    source_hash,
)
from pipeline.training.cpu_memory import configure_cpu_memory
from pipeline.training.hardware import (
    GPU_ACCELERATORS,
    build_strategy,
    check_cluster_launch,
    device_count,
    resolve_accelerator,
)
from pipeline.training.kept_runs import under_dvc
from pipeline.training.live import LiveHistory, SafeDVCLiveLogger
from pipeline.training.module import TranslationModule
from pipeline.training.precision import resolve_precision
from pipeline.training.preemption import PreemptionCallback
from pipeline.training.progress import StepProgress, silence_lightning_noise
from pipeline.training.resume import (
    keep_until_recorded,
    note_kept_run,
    preempted_checkpoints,
    restore_preempted_run,
    resume_point,
    stash_preempted_run,
    training_lock,
)
from pipeline.training.throughput import Throughput
from pipeline.training.wandb_logger import PipelineWandbLogger, wandb_logger

log = logging.getLogger(__name__)

METRICS_FILE = "train.json"
DVCLIVE_SUBDIR = "train"  # under paths.plots_dir
LEARNING_CURVE_FILE = "learning_curve.png"


# ---------------------------------------------------------------------- callbacks


def monitored_metric(cfg: Config) -> tuple[str, str]:
    """The metric that ranks checkpoints (and stops early): val/greedy_bleu, or val/loss without it."""
    return (GREEDY_VAL_BLEU, "max") if cfg.train.val_bleu else ("val/loss", "min")


def build_callbacks(cfg: Config, process_started: float | None = None) -> list[Callback]:
    """The run's own callbacks: its throughput and wall time (`Throughput`, the wall time
    counted from `process_started`), its checkpoints and, if configured, early stopping."""
    directory = checkpoint_dir(cfg.paths.train_dir)
    monitor, mode = monitored_metric(cfg)
    callbacks: list[Callback] = [
        Throughput(process_started),
        # last.ckpt (resume) + the newest save_top_k validations (averaging the last N)
        PortableModelCheckpoint(
            dirpath=directory,
            filename=STEP_TEMPLATE,
            monitor="step",
            mode="max",
            save_top_k=cfg.train.save_top_k,
            save_last=True,
            auto_insert_metric_name=False,
        ),
        # the best save_top_k validations (averaging the best N)
        PortableModelCheckpoint(
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


def build_trainer(
    cfg: Config,
    loggers: Sequence,
    callbacks: Sequence[Callback] = (),
    trained_in: str | None = None,
    process_started: float | None = None,
    max_steps: int | None = None,
) -> tuple[L.Trainer, str]:
    """The Lightning Trainer for `cfg.train`; returns it with the precision it resolved.

    `trained_in`: the precision a resumed run was trained in. `train.precision: auto` keeps
    it rather than deciding anew: the timing behind `auto` can come out otherwise on a busy
    or another machine, and a run that changed precision midway is not the run it resumes.
    `process_started`: where the run's wall time of this process starts (`Throughput`).
    `max_steps`: where training ends, instead of `train.max_steps` (a run early stopping ended).
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
        max_steps=t.max_steps if max_steps is None else max_steps,
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
        callbacks=[*build_callbacks(cfg, process_started), *callbacks, *progress],
        # Under DVC every checkpoint is also linked out of the next checkout's reach, and stays
        # there until DVC has recorded it (`pipeline.training.kept_runs`).
        plugins=[AtomicCheckpointIO(mirror=preempted_checkpoints(cfg) if under_dvc() else None)],
        default_root_dir=cfg.paths.train_dir,
    )
    return trainer, precision


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
    with training_lock(cfg):
        return _run_locked(cfg, callbacks, job_type, run_name, group, wandb_run, keep_finished)


def _run_locked(cfg, callbacks, job_type, run_name, group, wandb_run, keep_finished) -> dict:
    restored = restore_preempted_run(cfg)
    try:
        summary = _run(cfg, callbacks, job_type, run_name, group, wandb_run, keep_finished)
    except BaseException as failed:
        # Under DVC, a stopped run's checkpoints left in the stage's output are deleted by
        # the checkout of the next `dvc exp run`: any failure after they were put back (a
        # refused config, say) keeps them out of its reach again.
        stopped = isinstance(failed, Preempted)
        if not under_dvc() or not (stopped or restored):
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
    return summary


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
    resume = resume_point(cfg, keep_finished=keep_finished)
    ckpt_path = resume.checkpoint
    note_kept_run(cfg)
    keep_until_recorded(cfg)
    _stop_if_signalled(ckpt_path)

    datamodule = TranslationDataModule(cfg, pin_memory=on_gpu)
    datamodule.setup("fit")
    # before training: what it reads, and the sources evaluation will decode
    datamodule.check_max_positions(
        [cfg.data.train_split, cfg.data.val_split], sources=cfg.eval.splits
    )
    module = TranslationModule(cfg, datamodule.vocab_size)
    module.source_hash = source_hash()
    module.attach_references(datamodule.tokenizer, datamodule.split(cfg.data.val_split).tgt_text)

    # A finished run of this config and code (`dvc exp run -f`, a lock never written) is
    # recorded again without training: no W&B run of its own for zero steps.
    finished = ckpt_path is not None and (
        resume.step >= cfg.train.max_steps or resume.stopped_early
    )
    if finished and wandb_run is None:
        log.info(
            "%s holds a finished run of this config and code: nothing to train, its records "
            "are written again (train.resume=false trains it anew)",
            ckpt_path.parent,
        )
        wandb = None
    else:
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
        cfg,
        [logger for logger in (wandb, dvclive) if logger is not None],
        [*callbacks, preemption, LiveHistory(dvclive)],
        trained_in=resume.trained_in,
        process_started=started,
        # it ended there: restored, it trains no more
        max_steps=resume.step if resume.stopped_early else None,
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

    (throughput,) = [c for c in trainer.callbacks if isinstance(c, Throughput)]
    summary = summarize(
        cfg, trainer, module, throughput, precision, ckpt_path, time.perf_counter() - started
    )
    if trainer.is_global_zero:
        write_outputs(cfg, summary, module.history)
        if wandb is not None:
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
    throughput: Throughput,
    precision: str,
    resumed_from: Path | None,
    wall_time: float,
) -> dict:
    """The run's headline numbers: best validation (what sweeps optimise), the last one,
    model size and throughput."""
    best = module.best_val() or {}
    records = module.val_records()
    last_train = [r for r in module.history if "train/loss" in r]
    return {
        **{key: best.get(key) for key in VAL_METRICS},
        "best_step": best.get("step"),
        "last": {
            **{key: records[-1].get(key) for key in VAL_METRICS if records},
            "train/loss": last_train[-1]["train/loss"] if last_train else None,
            "step": trainer.global_step,
        },
        "num_parameters": module.model.num_parameters(),
        MEAN_TOKENS_PER_SEC: throughput.tokens_per_sec,
        "train/target_tokens": int(throughput.target_tokens),
        "steps": trainer.global_step,
        # Epochs training went into: the last, cut by max_steps, counts. Not current_epoch,
        # which a finished run restored from its last checkpoint (saved within that epoch)
        # has one lower: recording the run again would change it.
        "epochs": trainer.fit_loop.epoch_progress.current.started,
        # The whole run's, across resumes, to its final checkpoint (work lost to a kill
        # excluded: a finished run that is only recorded keeps its own); this process's too.
        "wall_time_s": throughput.wall_seconds,
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
