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
optimizer, schedule, random streams and the position in the epoch's batch order.
SIGTERM/SIGUSR1 save `last.ckpt` at the end of the current step and raise `Preempted` (exit
code 3; `pipeline.training.preemption`); under DDP a failing rank 0 takes its ranks down, and
collectives give up after `train.ddp_timeout` seconds, so a dead or hung rank ends the job.
"""

from __future__ import annotations

import json
import signal
import time
import warnings
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import lightning as L
import torch
from dvclive.lightning import DVCLiveLogger
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.utilities.exceptions import SIGTERMException

from pipeline.config import Config, to_dict
from pipeline.data.datamodule import TranslationDataModule
from pipeline.errors import ConfigError, Preempted
from pipeline.tracking import PipelineWandbLogger, wandb_logger
from pipeline.training.checkpoints import (
    BEST_TEMPLATES,
    LAST_NAME,
    STEP_TEMPLATE,
    AtomicCheckpointIO,
    checkpoint_dir,
    find_resume_checkpoint,
    read_checkpoint,
    remove_checkpoints,
)
from pipeline.training.cpu_memory import configure_cpu_memory
from pipeline.training.module import TranslationModule
from pipeline.training.precision import resolve_precision
from pipeline.training.preemption import PreemptionCallback

METRICS_FILE = "train.json"
DVCLIVE_SUBDIR = "train"  # under paths.plots_dir
LEARNING_CURVE_FILE = "learning_curve.png"
# A resumed run must train the same model on the same data order.
RESUME_FIXED_KEYS = (
    "seed",
    "model",
    "data.src_lang",
    "data.tgt_lang",
    "data.max_train_pairs",
    "data.filter",
    "data.tokenizer",
    "train.max_tokens",
    "train.accumulate_grad_batches",
)


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


def build_strategy(cfg: Config, accelerator: str) -> str | Strategy:
    """`train.strategy` resolved; plain DDP gets `train.ddp_timeout` for its collectives, so a
    rank that died or hangs ends the job after that long instead of stalling the others."""
    t = cfg.train
    strategy = resolve_strategy(t.strategy, device_count(t.devices, accelerator), t.num_nodes)
    if strategy == "ddp":
        return DDPStrategy(timeout=timedelta(seconds=t.ddp_timeout))
    return strategy


def build_trainer(
    cfg: Config, loggers: Sequence, callbacks: Sequence[Callback] = ()
) -> tuple[L.Trainer, str]:
    """The Lightning Trainer for `cfg.train`; returns it with the precision it resolved."""
    t = cfg.train
    accelerator = resolve_accelerator(t.accelerator)
    precision = resolve_precision(
        t.precision, accelerator, d_model=cfg.model.d_model, d_ff=cfg.model.d_ff,
        min_speedup=t.bf16_min_speedup,
    )  # fmt: skip
    strategy = build_strategy(cfg, accelerator)
    trainer = L.Trainer(
        accelerator=accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=strategy,
        precision=precision,
        max_steps=t.max_steps,
        max_epochs=t.max_epochs,
        # Lightning counts validation in batches; the config counts optimizer steps.
        val_check_interval=t.val_check_interval * t.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=1,  # one validation batch (loss + decode) before the first step
        accumulate_grad_batches=t.accumulate_grad_batches,
        gradient_clip_val=t.gradient_clip_val or None,
        log_every_n_steps=t.log_every_n_steps,
        enable_progress_bar=t.progress_bar,
        deterministic=t.deterministic,
        # The token batch sampler shards by rank itself.
        use_distributed_sampler=False,
        logger=list(loggers),
        callbacks=[*build_callbacks(cfg), *callbacks],
        plugins=[AtomicCheckpointIO()],
        default_root_dir=cfg.paths.train_dir,
    )
    return trainer, precision


# ---------------------------------------------------------------------- resume


def _leaves(tree, prefix: str) -> dict:
    """{"model.heads": 4, ...} for the subtree at `prefix`."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    leaves = {}
    for key, value in tree.items():
        leaves.update(_leaves(value, f"{prefix}.{key}"))
    return leaves


def _subtree(tree: dict, dotted: str):
    for key in dotted.split("."):
        tree = tree.get(key) if isinstance(tree, dict) else None
    return tree


def check_resumable(checkpoint_path: Path, cfg: Config) -> None:
    """A checkpoint may only be continued by a config that trains the same model on the
    same data order; anything else is a ConfigError naming the key."""
    saved = read_checkpoint(checkpoint_path)["hyper_parameters"]["config"]
    current = to_dict(cfg)
    for section in RESUME_FIXED_KEYS:
        before = _leaves(_subtree(saved, section), section)
        now = _leaves(_subtree(current, section), section)
        for key in sorted(set(before) | set(now)):
            if before.get(key) != now.get(key):
                raise ConfigError(
                    f"config key '{key}' is {now.get(key)!r} but {checkpoint_path} was trained "
                    f"with {before.get(key)!r}: a resumed run must keep it. Restore the value, "
                    "or start over with train.resume=false (or another paths.train_dir)."
                )


def resume_checkpoint(cfg: Config) -> Path | None:
    """The checkpoint to continue from, or None to train anew (clearing a finished run).

    With `train.resume`, a run continues its own checkpoint when that checkpoint is short of
    `train.max_steps` and was trained with the same model, data and batching (an interrupted
    run, or a longer run extending a finished one). A finished run (trained to its own
    `max_steps`; DVC has cached its outputs) is cleared and trained anew, as `dvc repro` after a
    code change or `dvc exp run -S model.heads=8` expect. A different config over an
    *unfinished* run is a ConfigError naming the key: its checkpoints exist nowhere else.
    """
    train_dir = Path(cfg.paths.train_dir)
    if not cfg.train.resume:
        _start_over(train_dir, "train.resume=false")
        return None
    path = find_resume_checkpoint(train_dir)
    if path is None:
        return None
    checkpoint = read_checkpoint(path)
    step = int(checkpoint["global_step"])
    trained_to = _subtree(checkpoint["hyper_parameters"]["config"], "train.max_steps")
    finished = step >= trained_to
    if finished:
        try:
            check_resumable(path, cfg)
        except ConfigError as err:
            _start_over(train_dir, f"the finished run there differs: {err}")
            return None
        if step >= cfg.train.max_steps:
            _start_over(train_dir, f"its run already reached step {step} (train.max_steps)")
            return None
        return path  # a longer run extends the finished one
    check_resumable(path, cfg)  # an interrupted run: refuse to discard it silently
    return path


def _start_over(train_dir: Path, why: str) -> None:
    if rank_zero_only.rank != 0:
        return
    removed = remove_checkpoints(train_dir)
    if removed:
        warnings.warn(
            f"training anew in {checkpoint_dir(train_dir)}: {why}; removed {len(removed)} "
            "checkpoint files of the previous run (`dvc checkout` restores a run DVC recorded)",
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
) -> dict:
    """Train per `cfg` (resuming its own checkpoint when `train.resume`), write
    `<metrics_dir>/train.json` and the learning curves, and return the summary metrics.

    `callbacks` are added to the Trainer's (an Optuna pruning callback, for instance);
    `job_type`, `run_name` and `group` label the W&B run this starts, unless `wandb_run` is
    given: then training logs into that run and its owner finishes it.
    """
    started = time.perf_counter()
    if resolve_accelerator(cfg.train.accelerator) == "cpu":
        configure_cpu_memory(cfg.train.cpu_mmap_threshold_mb, cfg.train.onednn_primitive_cache)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    ckpt_path = resume_checkpoint(cfg)

    datamodule = TranslationDataModule(cfg)
    datamodule.setup("fit")
    datamodule.check_max_positions([cfg.data.train_split, cfg.data.val_split])  # before training
    module = TranslationModule(cfg, datamodule.vocab_size)
    module.attach_references(datamodule.tokenizer, datamodule.split(cfg.data.val_split).tgt_text)

    wandb = wandb_logger(cfg, job_type, name=run_name, group=group, run=wandb_run)
    dvclive = DVCLiveLogger(
        dir=str(Path(cfg.paths.plots_dir) / DVCLIVE_SUBDIR),
        resume=ckpt_path is not None,
        save_dvc_exp=False,  # the DVC stage (or the sweep) owns experiments
        dvcyaml=None,  # dvc.yaml is written by hand
        report=None,
    )
    preemption = PreemptionCallback(checkpoint_dir(cfg.paths.train_dir) / LAST_NAME)
    module.preemption = preemption
    trainer, precision = build_trainer(cfg, [wandb, dvclive], [*callbacks, preemption])
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    except SIGTERMException:  # Lightning's handler, in the moment before ours took over
        raise Preempted(
            "training stopped by SIGTERM before its first step; run the same command again "
            f"to resume from {ckpt_path or 'the start'}"
        ) from None
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
        "steps": trainer.global_step,
        "epochs": trainer.current_epoch,
        "wall_time_s": wall_time,
        "precision": precision,
        "world_size": trainer.world_size,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "checkpoint_dir": str(checkpoint_dir(cfg.paths.train_dir)),
    }


def write_outputs(cfg: Config, summary: dict, history: list[dict]) -> None:
    from pipeline.evaluation.plots import plot_learning_curves

    metrics_path = Path(cfg.paths.metrics_dir) / METRICS_FILE
    metrics_path.parent.mkdir(parents=True, exist_ok=True)
    metrics_path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if history:
        curve = Path(cfg.paths.plots_dir) / DVCLIVE_SUBDIR / LEARNING_CURVE_FILE
        plot_learning_curves(history, curve, title=cfg.experiment_name)


def _finish_wandb(logger: PipelineWandbLogger, summary: dict) -> None:
    run = logger.experiment
    for key, value in summary.items():
        if key != "last" and value is not None:
            run.summary[f"best/{key}" if key.startswith("val/") else key] = value
    logger.finish()
