"""What a training run says on the console: where it is of `train.max_steps`, its loss, learning
rate, tokens per second, the last validation's BLEU, and when it will end.

In a terminal one bar, counting optimizer steps (not batches of an epoch), elapsed<ETA:

    step 84/200  42%|████████▍           | 00:12<00:16, loss 5.812, lr 8.40e-03, 11,312 tok/s, val/bleu 1.92

Without one (`make repro > log`, nohup, CI) a plain line every `train.progress_every` steps and
after every validation, which a log keeps readable:

    step 150/200 (75%)  loss 4.912  lr 5.10e-03  11,205 tok/s  val/bleu 3.41  elapsed 0:00:21  eta 0:00:07

Lightning's own chatter that tells a user nothing about the run (its litlogger advertisement, a
deprecation warning from inside it, a model summary with a column of zero FLOPs, `v_num`) is
left out; the model's size is one line at the start.
"""

from __future__ import annotations

import datetime
import logging
import sys
import time
import warnings
from typing import TextIO

from lightning.pytorch.callbacks.progress.progress_bar import ProgressBar
from tqdm.auto import tqdm

# Lightning metrics shown, with their label and format.
SHOWN = (
    ("train/loss", "loss", "{:.3f}"),
    ("lr", "lr", "{:.2e}"),
    ("train/tokens_per_sec", "tok/s", "{:,.0f}"),
    ("val/bleu", "val/bleu", "{:.2f}"),
)
# A short bar, so that the metrics fit beside it; `remaining` is the run's ETA.
BAR_FORMAT = "step {n_fmt}/{total_fmt} {percentage:3.0f}%|{bar:20}| {elapsed}<{remaining}{postfix}"
VALIDATION_SHOWN = (("val/bleu", "{:.2f}"), ("val/loss", "{:.3f}"), ("val/ppl", "{:.2f}"))
# Messages of Lightning (and of torch inside it) that say nothing about the run.
_NOISE_LOGS = ("litlogger",)
_NOISE_WARNINGS = (r"`isinstance\(treespec, LeafSpec\)` is deprecated",)


def silence_lightning_noise() -> None:
    """Drop Lightning's advertisement for its cloud logger and a FutureWarning torch raises
    inside Lightning's own code (nothing a user of this pipeline can act on)."""
    from lightning_utilities.core import rank_zero

    if not any(isinstance(f, _DropMessages) for f in rank_zero.log.filters):
        rank_zero.log.addFilter(_DropMessages(_NOISE_LOGS))
    for pattern in _NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=FutureWarning)


def _log_clears_bar(progress: StepProgress) -> None:
    """Lightning's messages (`Trainer.fit` stopped: ...) start on a line of their own, not
    glued to the end of a live bar, which redraws below them."""
    from lightning_utilities.core import rank_zero

    if not any(isinstance(f, _ClearBar) for f in rank_zero.log.filters):
        rank_zero.log.addFilter(_ClearBar())
    _ClearBar.progress = progress


class _ClearBar(logging.Filter):
    progress: StepProgress | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        bar = self.progress._bar if self.progress is not None else None
        if bar is not None:
            bar.clear()
        return True


class _DropMessages(logging.Filter):
    def __init__(self, fragments: tuple[str, ...]) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


def _human_count(n: int) -> str:
    for unit, size in (("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)


class StepProgress(ProgressBar):
    """Lightning's progress bar slot, filled by optimizer steps of `train.max_steps`: a bar
    in a terminal (`interactive`), else a line every `every` steps and after each validation.
    Global rank zero only."""

    def __init__(self, every: int, interactive: bool | None = None, stream: TextIO | None = None):
        super().__init__()
        self.every = every
        self._stream = stream
        self._interactive = interactive
        self._enabled = True
        self._bar = None
        self._started: float | None = None
        self._first_step = 0
        self._last_step = -1

    # ProgressBar's interface ------------------------------------------------------------
    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    def print(self, *args, **kwargs) -> None:
        if self._bar is not None:
            self._bar.write(" ".join(map(str, args)), file=self.stream)
        else:
            print(*args, file=self.stream, flush=True, **kwargs)

    # ------------------------------------------------------------------------------------
    @property
    def stream(self) -> TextIO:
        return self._stream or sys.stdout

    @property
    def interactive(self) -> bool:
        if self._interactive is None:
            return self.stream.isatty()
        return self._interactive

    def _active(self, trainer) -> bool:
        return self._enabled and trainer.is_global_zero

    def on_train_start(self, trainer, pl_module) -> None:
        if not self._active(trainer):
            return
        self._started = time.perf_counter()
        self._first_step = self._last_step = trainer.global_step
        parameters = sum(p.numel() for p in pl_module.parameters())
        total = trainer.max_steps if trainer.max_steps > 0 else None
        start = f"from step {trainer.global_step} " if trainer.global_step else ""
        goal = f"to step {total}" if total else f"for {trainer.max_epochs} epochs"
        self.print(
            f"training {_human_count(parameters)} parameters {start}{goal} "
            f"({trainer.precision}, {trainer.world_size} process(es))"
        )
        if self.interactive:
            _log_clears_bar(self)
            self._bar = tqdm(
                total=total, initial=trainer.global_step, unit="step", file=self.stream,
                dynamic_ncols=True, leave=True, bar_format=BAR_FORMAT,
            )  # fmt: skip

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not self._active(trainer):
            return
        step = trainer.global_step
        if step == self._last_step:  # accumulating: no optimizer step yet
            return
        self._last_step = step
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            self._bar.set_postfix_str(self.metrics_text(trainer, ", "), refresh=True)
        elif step % self.every == 0 or step == trainer.max_steps:
            self.print(self.line(trainer))

    def on_validation_end(self, trainer, pl_module) -> None:
        if not self._active(trainer) or trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        parts = [
            f"{key} {fmt.format(float(metrics[key]))}"
            for key, fmt in VALIDATION_SHOWN
            if key in metrics
        ]
        if parts:
            self.print(f"validation at step {trainer.global_step}: {', '.join(parts)}")
        if self._bar is not None:  # the bar shows this validation's BLEU, not the last one's
            self._bar.set_postfix_str(self.metrics_text(trainer, ", "), refresh=True)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def metrics_text(self, trainer, separator: str = "  ") -> str:
        metrics = trainer.callback_metrics
        return separator.join(
            f"{label} {fmt.format(float(metrics[key]))}" if label != "tok/s"
            else f"{fmt.format(float(metrics[key]))} {label}"
            for key, label, fmt in SHOWN
            if key in metrics
        )  # fmt: skip

    def line(self, trainer) -> str:
        """`step 100/200 (50%)  loss ...  elapsed 0:00:14  eta 0:00:14`."""
        step, total = trainer.global_step, trainer.max_steps
        elapsed = time.perf_counter() - (self._started or time.perf_counter())
        if total > 0:
            done = step - self._first_step
            eta = (total - step) * elapsed / done if done > 0 else None
            head = f"step {step}/{total} ({100 * step / total:.0f}%)"
        else:
            eta, head = None, f"step {step}"
        tail = f"elapsed {_clock(elapsed)}" + (f"  eta {_clock(eta)}" if eta is not None else "")
        return "  ".join(part for part in (head, self.metrics_text(trainer), tail) if part)
