"""The run's totals across resumes: a checkpoint's `run_totals` (as every earlier version wrote
them) continue in the resumed run, and a run that ends on a checkpoint reports its figures."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from pipeline.training.throughput import TOTALS_KEY, Throughput, tokens_per_second


def _trainer(step: int) -> SimpleNamespace:
    strategy = SimpleNamespace(reduce=lambda tensor, reduce_op: tensor)  # one rank
    return SimpleNamespace(global_step=step, strategy=strategy, validating=False)


def test_a_checkpoints_totals_continue_and_a_finished_run_reports_them():
    saved = {"train_tokens": 1000.0, "train_seconds": 4.0, "wall_seconds": 9.0}
    finished = Throughput()
    finished.on_load_checkpoint(_trainer(10), None, {"global_step": 10, TOTALS_KEY: saved})
    assert finished.final_totals == saved  # a finished run trains no more
    assert (finished.tokens_per_sec, finished.target_tokens, finished.wall_seconds) == (
        250.0, 1000.0, 9.0)  # fmt: skip

    resumed = Throughput()
    resumed.on_load_checkpoint(_trainer(10), None, {TOTALS_KEY: saved})
    resumed.total_train_tokens = 24
    module = SimpleNamespace(device=torch.device("cpu"))
    checkpoint = {}
    resumed.on_save_checkpoint(_trainer(12), module, checkpoint)
    assert checkpoint[TOTALS_KEY]["train_tokens"] == 1024.0
    assert checkpoint[TOTALS_KEY]["wall_seconds"] >= 9.0
    resumed.on_train_end(_trainer(12), module)  # ends on that checkpoint: its figures
    assert resumed.final_totals == checkpoint[TOTALS_KEY]


def test_tokens_per_second_of_no_training_is_zero():
    assert tokens_per_second({"train_tokens": 0.0, "train_seconds": 0.0}) == 0.0
