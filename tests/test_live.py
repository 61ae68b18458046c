"""DVCLive's files on a real full disk (tmpfs): the summary and each metric's history keep
their previous content, and the error names the file."""

from __future__ import annotations

import pytest

from pipeline.errors import DiskFullError
from pipeline.training.live import AtomicLive


def test_a_history_row_or_summary_that_does_not_fit_leaves_the_files_as_they_were(small_disk):
    live = AtomicLive(dir=str(small_disk.path / "live"), save_dvc_exp=False, dvcyaml=None,
                      report=None)  # fmt: skip
    for step in range(3):
        live.step = step
        live.log_metric("train/loss", 5.0 - step)
    live.make_summary()
    history = small_disk.path / "live" / "plots" / "metrics" / "train" / "loss.tsv"
    summary = small_disk.path / "live" / "metrics.json"
    before = {path: path.read_bytes() for path in (history, summary)}

    small_disk.fill(free=0)
    live.step = 3
    with pytest.raises(DiskFullError, match="loss.tsv: disk full .* the previous loss.tsv is"):
        for _ in range(1000):  # the page the file has left may hold a few rows more
            live.log_metric("train/loss", 1.0)
            before[history] = history.read_bytes()
    with pytest.raises(DiskFullError, match="metrics.json: disk full .* the previous metrics"):
        live.make_summary()
    assert {path: path.read_bytes() for path in before} == before
    assert not [p for p in summary.parent.iterdir() if ".tmp-" in p.name]
