"""A running trial's heartbeat: recorded by a thread while the trial runs, and watched by its
training, which stops at a checkpoint before other workers could count the trial dead."""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time

from optuna.storages import RDBStorage

log = logging.getLogger(__name__)


class Heartbeat:
    """A running trial's heartbeat, recorded by `heartbeat`'s thread. A beat the storage refuses
    is logged and tried again at the next; `silent_for` tells how long the storage has recorded
    none (`HeartbeatWatchdog` stops the trial before others count it dead).
    """

    def __init__(self, storage: RDBStorage, trial_id: int) -> None:
        self.storage, self.trial_id = storage, trial_id
        self.last_recorded = time.monotonic()
        self.last_error: BaseException | None = None
        self.lost = False  # the trial was stopped because of it

    def record(self) -> None:
        try:
            self.storage.record_heartbeat(self.trial_id)
        except Exception as err:  # keep beating: a storage that comes back hears it again
            # Optuna's StorageInternalError hides the database's own message in its cause.
            self.last_error = err.__cause__ or err
            log.error("trial %d: cannot record its heartbeat: %s", self.trial_id, self.last_error)
        else:
            self.last_recorded = time.monotonic()

    def silent_for(self) -> float:
        return time.monotonic() - self.last_recorded


# The heartbeat of the trial this worker runs, for the trial's training (`HeartbeatWatchdog`).
CURRENT_HEARTBEAT: contextvars.ContextVar[Heartbeat | None] = contextvars.ContextVar(
    "current_heartbeat", default=None
)


@contextlib.contextmanager
def heartbeat(storage: RDBStorage, trial_id: int, interval: float):
    """Record the trial's heartbeat every `interval` seconds while the body runs; the first one
    before the body starts, so that a worker killed at any point of its trial leaves a heartbeat
    to go stale (Optuna never retries a RUNNING trial that has none). Yields the `Heartbeat`."""
    storage.record_heartbeat(trial_id)
    beat = Heartbeat(storage, trial_id)
    stop = threading.Event()

    def beat_until_stopped() -> None:
        while not stop.wait(interval):
            beat.record()

    thread = threading.Thread(target=beat_until_stopped, name=f"heartbeat-{trial_id}", daemon=True)
    thread.start()
    token = CURRENT_HEARTBEAT.set(beat)
    try:
        yield beat
    finally:
        CURRENT_HEARTBEAT.reset(token)
        stop.set()
        # A beat stuck on a storage out of reach (SQLite waits for its lock) is left behind.
        thread.join(timeout=0 if beat.lost else None)
