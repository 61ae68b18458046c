"""pipeline.training.progress: what the train stage prints, read from the real stage's output."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_in_terminal


@pytest.mark.slow
def test_train_stage_without_a_terminal_prints_progress_lines_and_no_noise(smoke_stage_run):
    """experiment=smoke (200 steps, train.progress_every 50, validation every 100) with stdout
    a pipe: a line per 50 steps with loss, tokens/s and the run's ETA, one per validation,
    greedy BLEU (val/greedy_bleu) on the lines after the first validation; none of Lightning's chatter."""
    result = smoke_stage_run.results["train"]
    out = result.stdout
    assert re.search(
        r"^training [\d.]+ K parameters to step 200 \([\w-]+, 1 process\)$", out, re.M
    ), out
    steps = re.findall(r"^step (\d+)/200 \((\d+)%\)  loss ([\d.]+)  ([\d,]+) tok/s"
                       r"(?:  greedy BLEU ([\d.]+))?  eta (\S+)$", out, re.M)  # fmt: skip
    assert [int(s[0]) for s in steps] == [50, 100, 150, 200], out
    assert [int(s[1]) for s in steps] == [25, 50, 75, 100]
    assert all(float(s[2]) > 0 and float(s[3].replace(",", "")) > 0 for s in steps)
    assert steps[-1][5] == "0:00:00"  # nothing left at the last step
    assert steps[2][4] != ""  # after the validation at step 100, its BLEU is shown
    validations = re.findall(r"^validation at step (\d+): val/greedy_bleu [\d.]+, val/loss [\d.]+, "
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
    tokens/s, the last greedy BLEU and elapsed<remaining time; the validations as lines."""
    import os
    import sys

    from tests.conftest import write_params

    tokenized = smoke_stage_run.root / "data" / "tokenized"
    write_params(tmp_path, "experiment=smoke", "train.max_steps=20",
                 "train.val_check_interval=10", f"paths.tokenized={tokenized}")  # fmt: skip
    env = {**os.environ, "WANDB_MODE": "disabled"}
    out = run_in_terminal([sys.executable, "-m", "pipeline.stages.train"], tmp_path, env)
    bars = re.findall(r"step (\d+)/20 +(\d+)%\|[^|]*\| (\S+)<(\S+), loss [\d.]+, lr [\d.e+-]+, "
                      r"[\d,]+ tok/s(, greedy BLEU [\d.]+)?", out)  # fmt: skip
    assert bars and bars[-1][:2] == ("20", "100") and bars[-1][3] == "00:00", out[-2000:]
    assert any(bar[4] for bar in bars)  # val/greedy_bleu once step 10 was validated
    assert "validation at step 10: val/greedy_bleu" in out
    for noise in ("litlogger", "LeafSpec", "FLOPs", "v_num", "Epoch "):
        assert noise not in out, noise


def test_lightnings_messages_print_once_and_a_resumed_runs_folder_is_no_warning():
    """A sweep worker configures the root logger: Lightning's own handler and the root's would
    each print every message of Lightning's, once `silence_lightning_noise` has run only one;
    and Lightning's warning about a checkpoint folder that holds files (a resumed run) is off."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    code = (
        "import logging\n"
        "logging.basicConfig(level=logging.INFO, format='%(asctime)s %(name)s: %(message)s')\n"
        "from lightning.pytorch.utilities import rank_zero_info\n"
        "from pipeline.training.progress import silence_lightning_noise\n"
        "rank_zero_info('before: twice')\n"
        "silence_lightning_noise()\n"
        "rank_zero_info('after: once')\n"
        "from lightning.pytorch.utilities import rank_zero_warn\n"
        "rank_zero_warn('Checkpoint directory /run/checkpoints exists and is not empty.')\n"
        "rank_zero_warn('a warning of its own')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout + result.stderr
    assert out.count("before: twice") == 2, out  # what Lightning does by itself
    assert out.count("after: once") == 1, out
    # a resumed run's checkpoint folder holds files: expected, so no warning; others stay
    assert "exists and is not empty" not in out and "a warning of its own" in out, out


# A real Lightning run of a one-weight model that logs the metrics the train stage logs, at
# values as wide as a long run's (5-digit steps aside), under StepProgress.
TINY_RUN = """
import sys, torch, lightning.pytorch as pl
from pipeline.training.progress import StepProgress, silence_lightning_noise
silence_lightning_noise()  # as the train stage does

class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
    def training_step(self, batch, _):
        loss = (self.w * batch).sum() ** 2
        self.log_dict({"train/loss": 5.812, "lr": 8.4e-3, "train/tokens_per_sec": 112050.0})
        return loss
    def validation_step(self, batch, _):
        self.log_dict({"val/greedy_bleu": 27.41, "val/loss": 4.5, "val/ppl": 90.0})
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)

data = torch.utils.data.DataLoader(torch.ones(64, 1), batch_size=1)
progress = StepProgress(every=5)
trainer = pl.Trainer(max_steps=20, val_check_interval=10, limit_val_batches=1, logger=False,
                     enable_checkpointing=False, enable_model_summary=False,
                     num_sanity_val_steps=0, callbacks=[progress])
trainer.fit(Tiny(), data, data)
"""
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _tiny_run_command():
    import sys

    return [sys.executable, "-c", TINY_RUN]


@pytest.mark.slow
def test_in_an_80_column_terminal_the_bar_fits_with_tokens_per_second_and_val_bleu():
    import os

    from tests.conftest import REPO_ROOT

    out = run_in_terminal(_tiny_run_command(), REPO_ROOT, dict(os.environ), columns=80,
                          timeout=300)  # fmt: skip
    frames = [ANSI.sub("", frame) for frame in re.split(r"[\r\n]+", out) if frame.strip()]
    bars = [frame for frame in frames if frame.startswith("step ")]
    assert bars and all(len(frame) <= 80 for frame in frames), [f for f in frames if len(f) > 80]
    assert re.fullmatch(r"step 20/20 100%\|█+\| \S+<00:00, loss 5\.812, 112,050 tok/s, "
                        r"greedy BLEU 27\.41 *", bars[-1]), bars[-1]  # fmt: skip

    wide = run_in_terminal(_tiny_run_command(), REPO_ROOT, dict(os.environ), columns=120,
                           timeout=300)  # fmt: skip
    assert ", lr 8.40e-03, 112,050 tok/s, greedy BLEU 27.41" in wide  # room for the lr too


def test_without_a_terminal_each_progress_line_fits_80_columns():
    import subprocess

    from tests.conftest import REPO_ROOT

    result = subprocess.run(_tiny_run_command(), cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split()[1] for line in lines] == ["5/20", "10/20", "15/20", "20/20"]
    assert all(len(line) <= 80 for line in lines), lines
    assert re.fullmatch(r"step 20/20 \(100%\)  loss 5\.812  112,050 tok/s  greedy BLEU 27\.41  "
                        r"eta 0:00:00", lines[-1]), lines  # fmt: skip
