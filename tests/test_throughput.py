"""The run's totals across resumes, through Lightning's own checkpoint flow: a checkpoint holds
the run's `run_totals`, a run resumed from it continues them, a finished run loaded again
reports them unchanged, and a run that ends on a checkpoint reports that checkpoint's."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader

from pipeline.training.throughput import TOTALS_KEY, Throughput, tokens_per_second

TOKENS = 7  # target tokens of every batch


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch["x"]).sum() ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def totals_in(path: Path) -> dict[str, float]:
    return torch.load(path, map_location="cpu", weights_only=True)[TOTALS_KEY]


def fit(root: Path, max_steps: int, ckpt_path: Path | None = None) -> Throughput:
    """A real Trainer run with the callback, a checkpoint every 2 steps in `root`."""
    loader = DataLoader(range(100), batch_size=1,
                        collate_fn=lambda _: {"x": torch.ones(1), "num_tgt_tokens": TOKENS})  # fmt: skip
    throughput = Throughput()
    checkpoints = ModelCheckpoint(dirpath=root, filename="step-{step}", save_top_k=-1,
                                  every_n_train_steps=2, auto_insert_metric_name=False)  # fmt: skip
    trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        log_every_n_steps=1, callbacks=[throughput, checkpoints])  # fmt: skip
    trainer.fit(Tiny(), loader, ckpt_path=ckpt_path)
    return throughput


def test_a_checkpoints_totals_continue_and_a_finished_run_reports_them(tmp_path):
    first = fit(tmp_path / "first", max_steps=4)
    saved = totals_in(tmp_path / "first" / "step-4.ckpt")
    assert saved["train_tokens"] == 4 * TOKENS
    assert first.final_totals == saved  # it ended on that checkpoint: its figures

    resumed = fit(tmp_path / "resumed", max_steps=6, ckpt_path=tmp_path / "first" / "step-4.ckpt")
    assert resumed.final_totals["train_tokens"] == 6 * TOKENS  # the first 4 steps counted once
    for key in ("train_seconds", "wall_seconds"):
        assert resumed.final_totals[key] > saved[key]
    assert totals_in(tmp_path / "resumed" / "step-6.ckpt") == (resumed.final_totals)

    finished = fit(tmp_path / "finished", max_steps=4, ckpt_path=tmp_path / "first" / "step-4.ckpt")
    assert finished.final_totals == saved  # a finished run trains no more
    assert finished.tokens_per_sec == tokens_per_second(saved) > 0
    assert (finished.target_tokens, finished.wall_seconds) == (
        saved["train_tokens"], saved["wall_seconds"],
    )  # fmt: skip


def test_tokens_per_second_of_no_training_is_zero():
    assert tokens_per_second({"train_tokens": 0.0, "train_seconds": 0.0}) == 0.0
