"""The Lightning callbacks a trial trains with: the pruner hears each validation, and the
worker's heartbeat and deadline stop training at a checkpoint (the preemption path). Apart from
the worker's own modules, so that a worker imports Lightning only once it trains."""

from __future__ import annotations

import logging

import optuna
from lightning.pytorch.callbacks import Callback
from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback

from pipeline.sweep.deadline import Deadline
from pipeline.sweep.heartbeat import Heartbeat
from pipeline.sweep.spec import SweepSettings
from pipeline.training.preemption import PreemptionCallback

log = logging.getLogger(__name__)


class StepPruningCallback(PyTorchLightningPruningCallback):
    """optuna-integration's Lightning pruning callback, reporting at the optimizer step.

    The integration reports at `current_epoch`, but we validate every `train.val_check_interval`
    steps, often several times within one epoch, so its values would all land on step 0. It
    also raises `TrialPruned` inside `fit` when single-process, and under DDP expects the
    ranks to be spawned from the process that holds the trial. Here rank 0 (the worker itself)
    reports and asks the pruner; the decision is broadcast; every rank stops training at that
    step; `pruned_at_step` tells the caller. Its `on_fit_start` still refuses non-RDB storages
    under DDP."""

    def __init__(self, trial: optuna.Trial, monitor: str) -> None:
        super().__init__(trial, monitor=monitor)
        self.pruned_at_step: int | None = None

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        score = trainer.callback_metrics.get(self.monitor)
        if score is None:
            log.warning("pruning: '%s' is not among the validation metrics", self.monitor)
            return
        step = trainer.global_step
        should_stop = False
        if trainer.is_global_zero:
            self._trial.report(score.item(), step=step)
            should_stop = self._trial.should_prune()
        should_stop = trainer.strategy.broadcast(should_stop)
        if should_stop:
            trainer.should_stop = True
            self.pruned_at_step = step


class HeartbeatWatchdog(Callback):
    """Stops a trial's training at a checkpoint, as a preemption does, once the storage has
    recorded none of its heartbeats for `grace_period - heartbeat_interval` seconds: past
    `grace_period` other workers count the trial dead and run its point again, in the same
    work directory, and two processes would train one run."""

    def __init__(self, beat: Heartbeat, settings: SweepSettings) -> None:
        self.beat = beat
        self.limit = settings.grace_period - settings.heartbeat_interval

    def on_train_batch_end(self, trainer, *args) -> None:
        silent = self.beat.silent_for()
        if self.beat.lost or silent < self.limit:
            return
        self.beat.lost = True
        why = self.beat.last_error or "no answer"
        (preemption,) = [cb for cb in trainer.callbacks if isinstance(cb, PreemptionCallback)]
        preemption.request_stop(
            f"a lost heartbeat (the study's storage recorded none for {silent:.0f} s: {why})"
        )


class DeadlineCallback(Callback):
    """Stops training at a checkpoint (the preemption path) once the worker's deadline is
    reached; the worker then queues the point again and exits."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.stopped = False

    def on_train_batch_end(self, trainer, *args) -> None:
        if self.stopped or not self.deadline.passed():
            return
        self.stopped = True
        (preemption,) = [cb for cb in trainer.callbacks if isinstance(cb, PreemptionCallback)]
        preemption.request_stop(f"the worker's deadline ({self.deadline.clock()})")
