"""What the commands print besides their results: progress of the long phases and warnings.

In a terminal a phase (encoding a split, saving the dataset, decoding a split, a download)
draws a progress bar on stderr. Without one (`make repro > log`, nohup, CI) bars would land in
the log as frames joined by carriage returns, so the phase prints one line when it ends
instead:

    encode train: 2,000 sent in 0:00:01

Warnings print as `warning: <message>`, without Python's category, source path and code line
(`install_warning_format`).
"""

from __future__ import annotations

import contextlib
import datetime
import sys
import time
import warnings
from collections.abc import Iterable, Iterator
from typing import TextIO


def interactive(stream: TextIO | None = None) -> bool:
    """Whether `stream` (stderr by default: where bars are drawn) is a terminal."""
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by a non-file, or closed
        return False


def clock(seconds: float) -> str:
    """`0:01:23`: a duration to the second."""
    return str(datetime.timedelta(seconds=round(seconds)))


class Phase:
    """A bar in a terminal, else one line at the end: `<desc>: <n> <unit> in <time>`."""

    def __init__(self, desc: str, total: int | None = None, unit: str | None = "it",
                 **tqdm_args):  # fmt: skip
        self.desc, self.unit, self.count = desc, unit, 0
        self._started = time.perf_counter()
        self._bar = None
        if interactive():
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit=unit or "it", file=sys.stderr,
                             **tqdm_args)  # fmt: skip

    def update(self, n: int = 1) -> None:
        self.count += n
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._started is not None:
            print(self.summary(), file=sys.stderr, flush=True)
        self._started = None

    def summary(self) -> str:
        elapsed = time.perf_counter() - (self._started or time.perf_counter())
        done = f"{self.count:,} {self.unit}" if self.unit else "done"
        return f"{self.desc}: {done} in {clock(elapsed)}"

    def __enter__(self) -> Phase:
        return self

    def __exit__(self, kind, *_) -> None:
        if kind is None:
            self.close()
        elif self._bar is not None:  # a failure: its message, not a summary, comes next
            self._bar.close()


def track(items: Iterable, desc: str, unit: str = "it", total: int | None = None,
          **tqdm_args) -> Iterator:  # fmt: skip
    """Iterate over `items` as a `Phase`."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Phase(desc, total=total, unit=unit, **tqdm_args) as phase:
        for item in items:
            yield item
            phase.update()


@contextlib.contextmanager
def library_bars(desc: str):
    """Hugging Face datasets' own bars (`Saving the dataset`, `Map`) inside this block: drawn
    in a terminal, else off and the block is one line."""
    import datasets

    if interactive():
        yield
        return
    datasets.disable_progress_bars()
    try:
        with Phase(desc, unit=None):
            yield
    finally:
        datasets.enable_progress_bars()


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    stream = file or sys.stderr
    bars = sys.modules.get("tqdm")  # live bars step aside and redraw below the warning
    writing = bars.tqdm.external_write_mode(file=stream) if bars else contextlib.nullcontext()
    try:
        with writing:
            stream.write(f"warning: {message}\n")
            stream.flush()
    except (AttributeError, OSError):  # no stderr to write to: the warning is lost, as Python's
        pass


def install_warning_format() -> None:
    """Show warnings as `warning: <message>` (the text says what to do; the source line of the
    `warnings.warn` call does not)."""
    warnings.showwarning = _one_line_warning
