"""DVCLive's Lightning logger (what `dvc plots` and `dvc metrics` read), made safe on a full disk
and across resumes.

DVCLive writes `metrics.json` with a plain `open(..., "w")` and appends each row of a metric's
history to `plots/metrics/<name>.tsv`: out of space, the first is left empty and the second
with half a row. Here the summary goes through `pipeline.atomic`, a row that did not fit is
taken back, and both raise DiskFullError naming the file.

A resumed run continues from a checkpoint, but the histories hold whatever the stopped process
wrote after it (a SIGKILL keeps every row up to the kill; an older checkpoint is chosen when the
newest is unreadable; the files may be gone altogether). Every checkpoint therefore carries the
rows written up to its step (`LiveHistory`), and resuming rewrites the histories and the
summary to exactly those rows: the logged history of a resumed run is the uninterrupted run's.
"""

from __future__ import annotations

import csv
import os
import shutil
from pathlib import Path

import lightning as L
from dvclive import Live
from dvclive.lightning import DVCLiveLogger
from dvclive.plots import Metric, NumpyEncoder
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.callbacks import Callback

from pipeline.atomic import write_json_atomic
from pipeline.errors import disk_full_error, is_disk_full

ROWS_KEY = "dvclive_rows"  # in checkpoints: [step, metric name, value] of every history row


class AtomicLive(Live):
    def __init__(self, *args, **kwargs) -> None:
        self.rows: list[list] = []  # [step, name, value] of every row written to a history
        super().__init__(*args, **kwargs)

    def make_summary(self) -> None:
        if self._step is not None:
            self.summary["step"] = self.step
        write_json_atomic(self.metrics_file, self.summary, cls=NumpyEncoder)

    def log_metric(self, name: str, val, timestamp: bool = False, plot: bool = True) -> None:
        history = Metric(name, self.plots_dir).output_path
        size = history.stat().st_size if history.exists() else None
        try:
            super().log_metric(name, val, timestamp=timestamp, plot=plot)
        except OSError as err:
            if not is_disk_full(err):
                raise
            if size is None:
                history.unlink(missing_ok=True)
            else:
                os.truncate(history, size)  # the rows before this one stay
            raise disk_full_error(history, previous_existed=size is not None) from err
        if plot:
            self.rows.append([self.step, name, val])

    def history_rows(self) -> list[list]:
        """[step, name, value] of every row in the metric histories on disk, by step."""
        folder = Path(self.plots_dir) / Metric.subfolder
        rows = []
        for path in sorted(folder.rglob("*.tsv")):
            name = path.relative_to(folder).with_suffix("").as_posix()
            with open(path, encoding="utf-8", newline="") as handle:
                for row in csv.DictReader(handle, delimiter="\t"):
                    try:
                        rows.append([int(row["step"]), name, float(row[path.stem])])
                    except (KeyError, TypeError, ValueError):
                        continue  # a row cut short by a kill
        return sorted(rows, key=lambda row: row[0])

    def rewrite(self, rows: list[list]) -> None:
        """Make the histories and the summary those of `rows` (and nothing else)."""
        shutil.rmtree(Path(self.plots_dir) / Metric.subfolder, ignore_errors=True)
        self.summary, self._metrics, self.rows = {}, {}, []
        for step, name, value in rows:
            self.step = step
            self.log_metric(name, value)
        self.make_summary()


class SafeDVCLiveLogger(DVCLiveLogger):
    """`DVCLiveLogger` whose experiment (rank zero's `Live`) is an `AtomicLive`."""

    @property
    def experiment(self) -> Live:
        if self._experiment is None and rank_zero_only.rank == 0:
            self._experiment = AtomicLive(**self._kwargs)
        return super().experiment

    @rank_zero_only
    def restore(self, rows: list[list] | None, step: int) -> None:
        """The histories as they were when the checkpoint of `step` was saved: its `rows`, or,
        for a checkpoint that holds none, the rows on disk up to its step."""
        live = self.experiment
        if rows is None:
            rows = [row for row in live.history_rows() if row[0] <= step]
        live.rewrite(rows)


class LiveHistory(Callback):
    """Saves the rows `logger` wrote in every checkpoint, and restores them on resume (a
    finished run that is only recorded included: its histories are written again if gone)."""

    def __init__(self, logger: SafeDVCLiveLogger) -> None:
        self.logger = logger

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        if trainer.is_global_zero:
            checkpoint[ROWS_KEY] = [list(row) for row in self.logger.experiment.rows]

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module, checkpoint: dict) -> None:
        self.logger.restore(checkpoint.get(ROWS_KEY), int(checkpoint["global_step"]))
