"""Preemption signals that arrive before training starts.

The train stage calls `defer()` first thing, before torch and Lightning load (seconds): a
SIGTERM, SIGUSR1 or SIGINT (Ctrl-C) in that time is kept instead of killing the process (status
143, or a KeyboardInterrupt traceback), and
`pipeline.training.trainer` then stops with exit code 3 and the usual message before spending
any compute; once training runs, `pipeline.training.preemption` takes over (and picks up a
signal kept here). Light on purpose: this module imports nothing heavy.
"""

from __future__ import annotations

import signal
import threading

# SIGINT too: Ctrl-C is a stop like any other (the terminal sends it to the whole foreground
# process group, so `dvc exp run`, which ignores it while a stage runs, waits for the stage).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)

_received: int | None = None


def _remember(signum: int, frame) -> None:
    global _received
    if _received is None:
        _received = signum


def defer() -> None:
    """Keep the first preemption signal from now on (only the main thread may set handlers)."""
    if threading.current_thread() is threading.main_thread():
        for signum in PREEMPTION_SIGNALS:
            signal.signal(signum, _remember)


def received() -> int | None:
    """The first preemption signal kept by `defer`'s handler, or None."""
    return _received
