"""Preemption: a scheduler's notice ends training with a checkpoint, not with lost work.

    SIGTERM (Kubernetes, SLURM, `kill`), SIGUSR1 (SLURM's requeue signal, `--signal=USR1@90`),
    SIGINT (Ctrl-C: a KeyboardInterrupt would lose the steps since the last validation)
      --> the handler only sets a flag (it runs between two bytecodes, possibly in the middle
          of a collective: no I/O and no communication there)
      --> at the end of the current optimizer step every rank learns whether any rank was
          signalled (one all-reduce per step under DDP), so all ranks stop at the same step
          and none is left waiting in a collective for a rank that is gone
      --> the step is finished first (its logging, also the rows of a logging step written to
          the loggers; its validation and step checkpoints when it validates), then
          `last.ckpt` is saved atomically and `Preempted` is raised
      --> the stage exits with EXIT_PREEMPTED (3); running it again resumes from that
          checkpoint exactly (`train.resume`; see `pipeline.training.trainer`)

A signal in the run's final step lets the run finish: its outputs are then complete. The final
step always validates and so saves `last.ckpt` (also when `train.max_steps` is not a multiple of
`train.val_check_interval`): a finished run's newest checkpoint is its end, which a re-run
records instead of training its last steps again.

Lightning registers its own SIGTERM handler when `fit` starts; it is replaced here while
training runs, because it exits with status 0 and no checkpoint, and under DDP it broadcasts
from inside the signal handler, where the collective can pair with an unrelated one of another
rank. A SIGKILL cannot be caught: the run resumes from its newest checkpoint instead.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from pipeline.errors import Preempted
from pipeline.training import early_signals
from pipeline.training.early_signals import PREEMPTION_SIGNALS

EXIT_PREEMPTED = Preempted.exit_code  # 3


def validation_follows(trainer: L.Trainer) -> bool:
    """Whether Lightning validates after the current training batch: every `val_check_batch`
    batches counted across epochs (`check_val_every_n_epoch=None`, as `build_trainer` sets)."""
    every = trainer.val_check_batch
    if not isinstance(every, int) or every <= 0:
        return False
    return (trainer.fit_loop.epoch_loop.total_batch_idx + 1) % every == 0


def final_step(trainer: L.Trainer) -> bool:
    """The batch just trained ends the run (max_steps, or the last batch of max_epochs)."""
    if trainer.max_steps != -1 and trainer.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    return (
        max_epochs is not None
        and max_epochs != -1
        and trainer.current_epoch + 1 >= max_epochs
        and trainer.is_last_batch
    )


class PreemptionCallback(Callback):
    """Turns SIGTERM/SIGUSR1/SIGINT into a checkpoint at `checkpoint_path` and `Preempted`.

    The LightningModule calls `at_step_end` after each optimizer step's bookkeeping and
    `after_validation` after a validation's checkpoints (module hooks run after every
    callback's, so the saved state is the state of a finished step).
    """

    def __init__(self, checkpoint_path: str | Path, signals=PREEMPTION_SIGNALS) -> None:
        self.checkpoint_path = Path(checkpoint_path)
        self.signals = tuple(signals)
        self.received: int | None = None  # the first preemption signal this process got
        self.stop_reason: str | None = None  # `request_stop`'s, if no signal came first
        self._stopping = False  # every rank agreed to stop after the current step
        self._original_handlers: dict[int, object] = {}

    # ------------------------------------------------------------------ signal handlers

    def _on_signal(self, signum: int, frame) -> None:
        if self.received is None:
            self.received = signum

    def request_stop(self, reason: str) -> None:
        """Stop as a preemption signal would (end of the step, checkpoint, `Preempted`), for
        `reason` (what the message says stopped training). Main thread only."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def install(self) -> None:
        """Handle the preemption signals here (only the main thread may set handlers)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if self.received is None:  # one that came while the stage was starting
            self.received = early_signals.received()
        for signum in self.signals:
            previous = signal.signal(signum, self._on_signal)
            self._original_handlers.setdefault(signum, previous)

    def restore(self) -> None:
        """Put back the handlers that were there before `install` (safe to call twice)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, handler in self._original_handlers.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._original_handlers = {}

    def _take_over_from_lightning(self, trainer: L.Trainer) -> None:
        # Lightning installed its SIGTERM handler just before this hook; ours replaces it.
        if trainer.received_sigterm and self.received is None:
            self.received = signal.SIGTERM
        self.install()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self.install()

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_over_from_lightning(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._take_over_from_lightning(trainer)

    # ------------------------------------------------------------------ stopping

    def _any_rank_signalled(self, trainer: L.Trainer) -> bool:
        asked = self.received is not None or self.stop_reason is not None
        flag = torch.tensor(float(asked), device=trainer.strategy.root_device)
        if trainer.world_size > 1:
            flag = trainer.strategy.reduce(flag, reduce_op="sum")
        return bool(flag.item() > 0)

    def at_step_end(self, trainer: L.Trainer) -> None:
        """After an optimizer step: stop here (or after this step's validation) if any rank
        was signalled. Every rank must call this at every step (it may communicate)."""
        if final_step(trainer):
            trainer.should_stop = True  # Lightning validates (and checkpoints) this step
            return
        if not self._any_rank_signalled(trainer):
            return
        self._stopping = True
        if not validation_follows(trainer):
            self._stop(trainer)
        # else: after_validation stops, once the step's validation and checkpoints are done

    def after_validation(self, trainer: L.Trainer) -> None:
        if self._stopping and not trainer.sanity_checking:
            self._stop(trainer)

    def _stop(self, trainer: L.Trainer) -> None:
        if not trainer.validating:
            # Lightning hands a step's logged metrics to the loggers only after the step's
            # hooks, where this raises: a logging step's row would be lost, and the checkpoint
            # would not hold it (`pipeline.training.live`).
            trainer._logger_connector.update_train_step_metrics()
        # The whole state (optimizer, loops, callbacks) to resume from; rank zero writes, all
        # ranks wait.
        trainer.save_checkpoint(self.checkpoint_path, weights_only=False)
        if self.received:
            got = signal.Signals(self.received).name
        else:
            got = self.stop_reason or "another rank's signal"
        raise Preempted(
            f"training stopped by {got} at step {trainer.global_step}: saved "
            f"{self.checkpoint_path}; run the same command again to resume from it"
        )
