"""The study's pruner, and the Lightning callback that reports each validation to it."""

from __future__ import annotations

import logging

import optuna
from optuna_integration.pytorch_lightning import PyTorchLightningPruningCallback

from pipeline.sweep.spec import PRUNERS, StudySpec

log = logging.getLogger(__name__)


def _pruner(spec: StudySpec) -> optuna.pruners.BasePruner:
    if not spec.pruner:
        return optuna.pruners.NopPruner()
    kind = spec.pruner.get("type", "median")  # load_spec checked it and the options
    options = {k: v for k, v in spec.pruner.items() if k != "type"}
    return getattr(optuna.pruners, PRUNERS[kind])(**options)


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
