"""pipeline.training.progress: what the train stage prints, read from the real stage's output."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_in_terminal


@pytest.mark.slow
def test_train_stage_without_a_terminal_prints_progress_lines_and_no_noise(smoke_stage_run):
    """experiment=smoke (200 steps, train.progress_every 50, validation every 100) with stdout
    a pipe: a line per 50 steps with loss, lr, tokens/s and the run's ETA, one per validation,
    val/bleu on the lines after the first validation; none of Lightning's chatter."""
    result = smoke_stage_run.results["train"]
    out = result.stdout
    assert re.search(r"^training [\d.]+ K parameters to step 200 \(", out, re.M), out
    steps = re.findall(r"^step (\d+)/200 \((\d+)%\)  loss ([\d.]+)  lr ([\d.e+-]+)  ([\d,]+) tok/s"
                       r"(?:  val/bleu ([\d.]+))?  elapsed (\S+)  eta (\S+)$", out, re.M)  # fmt: skip
    assert [int(s[0]) for s in steps] == [50, 100, 150, 200], out
    assert [int(s[1]) for s in steps] == [25, 50, 75, 100]
    assert all(float(s[2]) > 0 and float(s[3]) > 0 for s in steps)
    assert steps[-1][7] == "0:00:00"  # nothing left at the last step
    assert steps[2][5] != ""  # after the validation at step 100, its BLEU is shown
    validations = re.findall(r"^validation at step (\d+): val/bleu [\d.]+, val/loss [\d.]+, "
                             r"val/ppl [\d.]+$", out, re.M)  # fmt: skip
    assert validations == ["100", "200"]
    everything = result.stdout + result.stderr
    for noise in ("litlogger", "LeafSpec", "FLOPs", "v_num", "Epoch "):
        assert noise not in everything, noise


@pytest.mark.slow
def test_train_stage_in_a_terminal_shows_one_bar_of_steps_with_metrics_and_eta(
    smoke_stage_run, tmp_path
):
    """In a terminal: a bar of optimizer steps of max_steps (not `Epoch 4/-2`), with loss, lr,
    tokens/s, the last val/bleu and elapsed<remaining time; the validations as lines."""
    import os
    import sys

    from tests.conftest import write_params

    tokenized = smoke_stage_run.root / "data" / "tokenized"
    write_params(tmp_path, "experiment=smoke", "train.max_steps=20",
                 "train.val_check_interval=10", f"paths.tokenized={tokenized}")  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = run_in_terminal([sys.executable, "-m", "pipeline.stages.train"], tmp_path, env)
    bars = re.findall(r"step (\d+)/20 +(\d+)%\|[^|]*\| (\S+)<(\S+), loss [\d.]+, lr [\d.e+-]+, "
                      r"[\d,]+ tok/s(, val/bleu [\d.]+)?", out)  # fmt: skip
    assert bars and bars[-1][:2] == ("20", "100") and bars[-1][3] == "00:00", out[-2000:]
    assert any(bar[4] for bar in bars)  # val/bleu once step 10 was validated
    assert "validation at step 10: val/bleu" in out
    for noise in ("litlogger", "LeafSpec", "FLOPs", "v_num", "Epoch "):
        assert noise not in out, noise
