"""How much a run trained and how fast: target tokens, training seconds (validation excluded)
and wall seconds, for the logged `train/tokens_per_sec` of each logging window and for the
whole run's totals that `train.json` reports.

The totals span resumes: every checkpoint carries the run's totals up to its step
(`run_totals`), a resumed run adds its own to them, and a run that ends on a checkpoint reports
that checkpoint's totals, so a re-run that only records a finished run reports the same figures.
Measuring this is not the model's job, so it is a callback beside the `TranslationModule`.
"""

from __future__ import annotations

import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

TOTALS_KEY = "run_totals"  # in checkpoints: the whole run's totals up to the checkpoint's step
TOTALS = ("train_tokens", "train_seconds", "wall_seconds")


def _zero_totals() -> dict[str, float]:
    return dict.fromkeys(TOTALS, 0.0)


def tokens_per_second(totals: dict[str, float]) -> float:
    """Target tokens per second of training (validation excluded), all ranks together."""
    seconds = totals["train_seconds"]
    return totals["train_tokens"] / seconds if seconds else 0.0


class Throughput(Callback):
    """Counts the target tokens each rank trains on and times training, logs
    `train/tokens_per_sec` (all ranks together) at every train log, and keeps the whole run's
    totals in checkpoints. `process_started`: when this process started (its wall time)."""

    def __init__(self, process_started: float | None = None) -> None:
        self.process_started = time.perf_counter() if process_started is None else process_started
        self._window_tokens = 0  # target tokens since the last train log (this rank)
        self._window_seconds = 0.0
        self._window_start: float | None = None
        self._last_step = 0
        self.total_train_tokens = 0  # this rank, this process
        self.total_train_seconds = 0.0
        # The run's totals before this process (all ranks; from the checkpoint it resumed),
        # so that a resumed or already finished run reports the throughput of the whole run.
        self.resumed_totals = _zero_totals()
        # The whole run's `run_totals` once training ends (or a finished run is loaded).
        self.final_totals = _zero_totals()
        # (step, run_totals) of the newest checkpoint: every file saved at one step holds the
        # same totals, and a run that ends with a checkpoint reports that checkpoint's, which a
        # re-run that only records the finished run reports again.
        self._saved_totals: tuple[int, dict[str, float]] | None = None

    # ------------------------------------------------------------------ the run's figures

    @property
    def tokens_per_sec(self) -> float:
        """Target tokens per second of the whole run's training, all ranks together."""
        return tokens_per_second(self.final_totals)

    @property
    def target_tokens(self) -> float:
        """The whole run's target tokens, all ranks: what equal-compute comparisons count."""
        return self.final_totals["train_tokens"]

    @property
    def wall_seconds(self) -> float:
        """The whole run's wall time, across resumes, to its final checkpoint."""
        return self.final_totals["wall_seconds"]

    def _train_seconds(self, trainer: L.Trainer) -> float:
        """This process's training time so far (validation excluded)."""
        seconds = self.total_train_seconds + self._window_seconds
        if self._window_start is not None and not trainer.validating:
            seconds += time.perf_counter() - self._window_start
        return seconds

    def run_totals(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Target tokens (all ranks), training seconds and wall seconds of the whole run so
        far: those before this process (`resumed_totals`) and this process's. Every rank must
        call it (it reduces over ranks)."""
        tokens = torch.tensor(float(self.total_train_tokens), device=pl_module.device)
        tokens = float(trainer.strategy.reduce(tokens, reduce_op="sum"))
        before = self.resumed_totals
        return {
            "train_tokens": before["train_tokens"] + tokens,
            "train_seconds": before["train_seconds"] + self._train_seconds(trainer),
            "wall_seconds": before["wall_seconds"] + time.perf_counter() - self.process_started,
        }

    # ------------------------------------------------------------------ training

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._window_start = time.perf_counter()
        self._last_step = trainer.global_step

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        num_tokens = int(batch["num_tgt_tokens"])
        self._window_tokens += num_tokens
        self.total_train_tokens += num_tokens
        step = trainer.global_step
        stepped, self._last_step = step != self._last_step, step  # not while accumulating
        if stepped and step % trainer.log_every_n_steps == 0:
            self._log_window(pl_module)

    def _log_window(self, pl_module: L.LightningModule) -> None:
        now = time.perf_counter()
        seconds = self._window_seconds + now - self._window_start
        tokens_per_sec = torch.tensor(
            self._window_tokens / max(seconds, 1e-9), device=pl_module.device
        )
        # Tokens per second of every rank together.
        pl_module.log("train/tokens_per_sec", tokens_per_sec, on_step=True, on_epoch=False,
                      sync_dist=True, reduce_fx="sum")  # fmt: skip
        self.total_train_seconds += seconds
        self._window_tokens, self._window_seconds, self._window_start = 0, 0.0, now

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        saved = self._saved_totals
        ended_saved = saved is not None and saved[0] == trainer.global_step
        self.final_totals = dict(saved[1]) if ended_saved else self.run_totals(trainer, pl_module)
        self._window_start = None

    # ------------------------------------------------------------------ validation

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._window_start is not None:  # validation time is not training time
            self._window_seconds += time.perf_counter() - self._window_start

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._window_start is not None:
            self._window_start = time.perf_counter()

    # ------------------------------------------------------------------ checkpoints

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict
    ) -> None:
        step = trainer.global_step
        if self._saved_totals is None or self._saved_totals[0] != step:
            self._saved_totals = (step, self.run_totals(trainer, pl_module))
        checkpoint[TOTALS_KEY] = dict(self._saved_totals[1])

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict
    ) -> None:
        self.resumed_totals = {**self.resumed_totals, **checkpoint.get(TOTALS_KEY, {})}
        self.final_totals = dict(self.resumed_totals)  # a finished run trains no more
