"""Re-validating a run's step checkpoints gives the loss per target token at each step."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import checkpoint_val_loss
from pipeline.data.datamodule import TranslationDataModule
from pipeline.rounding import float32_tolerance
from pipeline.training.module import TranslationModule
from tests.conftest import split_loss


def test_one_row_per_step_checkpoint_with_its_loss_per_token(trained_smoke, tmp_path):
    checkpoints = Path(trained_smoke.paths.train_dir) / "checkpoints"
    out = tmp_path / "curve.val_loss.tsv"
    checkpoint_val_loss.cli([str(checkpoints), "--tokenized", trained_smoke.paths.tokenized,
                             "--out", str(out)])  # fmt: skip
    header, *rows = out.read_text().splitlines()
    steps = [int(row.split("\t")[0]) for row in rows]
    saved = sorted((int(p.stem.split("-")[1]), p) for p in checkpoints.glob("step-*.ckpt"))
    assert header == "step\tloss" and steps == [step for step, _ in saved] and len(steps) >= 2
    module = TranslationModule.load_from_checkpoint(saved[-1][1])
    data = TranslationDataModule(trained_smoke)
    data.setup("validate")
    loader = data.val_dataloader()
    per_token, _ = split_loss(module, loader)
    # The same per-batch loss sums, added up in float32 (with a division and a multiplication
    # per batch) or float64.
    tolerance = float32_tolerance(len(loader) + 2, per_token)
    assert float(rows[-1].split("\t")[1]) == pytest.approx(per_token, abs=tolerance)


def test_a_folder_without_step_checkpoints_is_named(tmp_path):
    with pytest.raises(SystemExit, match=str(tmp_path)):
        checkpoint_val_loss.run_checkpoints(tmp_path)
