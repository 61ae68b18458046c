"""What a training run says on the console: where it is of `train.max_steps`, its loss, learning
rate, tokens per second of the last logging window, the last validation's greedy BLEU
(`val/greedy_bleu`), and when it will end, in 80 columns.

In a terminal one bar, counting optimizer steps (not batches of an epoch), elapsed<ETA; the
learning rate only where the terminal is wide enough for it beside the rest:

    step 84/200  42%|████████▍     | 00:12<00:16, loss 5.812, 11,312 tok/s, greedy BLEU 1.92

Without one (`make repro > log`, nohup, CI) a plain line every `train.progress_every` steps and
after every validation, which a log keeps readable:

    step 150/200 (75%)  loss 4.912  11,205 tok/s  greedy BLEU 3.41  eta 0:00:07

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

from pipeline.metric_names import GREEDY_VAL_BLEU, WINDOW_TOKENS_PER_SEC

# Lightning metrics shown, with their label and format (short labels: an 80-column line; the
# validation's own line names each metric in full).
SHOWN = (
    ("train/loss", "loss", "{:.3f}"),
    ("lr", "lr", "{:.2e}"),
    (WINDOW_TOKENS_PER_SEC, "tok/s", "{:,.0f}"),
    (GREEDY_VAL_BLEU, "greedy BLEU", "{:.2f}"),
)
# The bar's line; `remaining` is the run's ETA. The bar itself is BAR_WIDTH wide where the
# terminal has room, narrower (down to MIN_BAR_WIDTH) so that the metrics fit beside it.
BAR_FORMAT = (
    "step {{n_fmt}}/{{total_fmt}} {{percentage:3.0f}}%|{{bar:{width}}}| "
    "{{elapsed}}<{{remaining}}{{postfix}}"
)
BAR_WIDTH, MIN_BAR_WIDTH = 20, 4
OPTIONAL = ("lr",)  # shown on the bar only where it fits; never on a log line
LOG_WIDTH = 80  # what a log line fits (a terminal's own width is read from it)
VALIDATION_SHOWN = ((GREEDY_VAL_BLEU, "{:.2f}"), ("val/loss", "{:.3f}"), ("val/ppl", "{:.2f}"))
# Messages of Lightning (and of torch inside it) that say nothing about the run.
_NOISE_LOGS = ("litlogger",)
# Warnings of Lightning (and of torch inside it) about nothing a user can act on: a deprecation
# inside Lightning's code, and a checkpoint folder that holds files, which in this pipeline
# means a resumed run (a run that does not resume moves the old files aside and says so).
_NOISE_WARNINGS = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    (r"Checkpoint directory .* exists and is not empty", UserWarning),
)


def silence_lightning_noise() -> None:
    """Drop Lightning's advertisement for its cloud logger and the warnings in _NOISE_WARNINGS
    (nothing a user of this pipeline can act on), and print each of Lightning's messages once."""
    from lightning_utilities.core import rank_zero

    if not any(isinstance(f, _DropMessages) for f in rank_zero.log.filters):
        rank_zero.log.addFilter(_DropMessages(_NOISE_LOGS))
    # Lightning prints its messages through a handler of its own; a command that also logs
    # through the root logger (a sweep worker) would print each of them a second time.
    lightning_log = logging.getLogger("lightning")
    if lightning_log.handlers and logging.getLogger().handlers:
        lightning_log.propagate = False
    for pattern, category in _NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern, category=category)


def _log_clears_bar(progress: StepProgress) -> None:
    """Lightning's messages (`Trainer.fit` stopped: ...) start on a line of their own, not
    glued to the end of a live bar, which redraws below them."""
    from lightning_utilities.core import rank_zero

    if not any(isinstance(f, _ClearBar) for f in rank_zero.log.filters):
        rank_zero.log.addFilter(_ClearBar())
    # Messages of Lightning's other modules reach its handlers without rank_zero's logger.
    for name in ("lightning", "lightning.pytorch"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _ClearBar) for f in handler.filters):
                handler.addFilter(_ClearBar())
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
            f"({trainer.precision}, {trainer.world_size} "
            f"{'process' if trainer.world_size == 1 else 'processes'})"
        )
        if self.interactive:
            _log_clears_bar(self)
            self._bar = tqdm(
                total=total, initial=trainer.global_step, unit="step", file=self.stream,
                dynamic_ncols=True, leave=True, bar_format=BAR_FORMAT.format(width=BAR_WIDTH),
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
            self._show_metrics(trainer)
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
            self._show_metrics(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _show_metrics(self, trainer) -> None:
        """The metrics beside the bar, with the widest bar (up to BAR_WIDTH) that leaves them
        room in the terminal's width; the optional ones go first where there is none."""
        bar = self._bar
        state = bar.format_dict  # the terminal's width now, read again at each call
        columns = state["ncols"] or LOG_WIDTH
        for optional in (True, False):
            text = self.metrics_text(trainer, ", ", optional=optional)
            meter = bar.format_meter(**{**state, "ncols": None, "postfix": text,
                                        "bar_format": BAR_FORMAT.format(width=0)})  # fmt: skip
            width = min(BAR_WIDTH, columns - len(meter))
            if width >= MIN_BAR_WIDTH:
                break
        bar.bar_format = BAR_FORMAT.format(width=max(width, 1))
        bar.set_postfix_str(text, refresh=True)

    def metrics_text(self, trainer, separator: str = "  ", optional: bool = False) -> str:
        metrics = trainer.callback_metrics
        return separator.join(
            f"{label} {fmt.format(float(metrics[key]))}" if label != "tok/s"
            else f"{fmt.format(float(metrics[key]))} {label}"
            for key, label, fmt in SHOWN
            if key in metrics and (optional or label not in OPTIONAL)
        )  # fmt: skip

    def line(self, trainer) -> str:
        """`step 100/200 (50%)  loss ...  greedy BLEU 3.41  eta 0:00:14`, in LOG_WIDTH columns."""
        step, total = trainer.global_step, trainer.max_steps
        elapsed = time.perf_counter() - (self._started or time.perf_counter())
        if total > 0:
            done = step - self._first_step
            eta = (total - step) * elapsed / done if done > 0 else None
            head = f"step {step}/{total} ({100 * step / total:.0f}%)"
        else:
            eta, head = None, f"step {step}"
        tail = f"eta {_clock(eta)}" if eta is not None else f"elapsed {_clock(elapsed)}"
        return "  ".join(part for part in (head, self.metrics_text(trainer), tail) if part)
