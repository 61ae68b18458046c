"""DVCLive's Lightning logger (what `dvc plots` and `dvc metrics` read), made safe on a full disk.

DVCLive writes `metrics.json` with a plain `open(..., "w")` and appends each row of a metric's
history to `plots/metrics/<name>.tsv`: out of space, the first is left empty and the second
with half a row. Here the summary goes through `pipeline.atomic`, a row that did not fit is
taken back, and both raise DiskFullError naming the file.
"""

from __future__ import annotations

import os

from dvclive import Live
from dvclive.lightning import DVCLiveLogger
from dvclive.plots import Metric, NumpyEncoder
from lightning.fabric.utilities.rank_zero import rank_zero_only

from pipeline.atomic import write_json_atomic
from pipeline.errors import disk_full_error, is_disk_full


class AtomicLive(Live):
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


class SafeDVCLiveLogger(DVCLiveLogger):
    """`DVCLiveLogger` whose experiment (rank zero's `Live`) is an `AtomicLive`."""

    @property
    def experiment(self) -> Live:
        if self._experiment is None and rank_zero_only.rank == 0:
            self._experiment = AtomicLive(**self._kwargs)
        return super().experiment
