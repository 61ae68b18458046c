"""pipeline.console: a long phase is a bar in a terminal and one line in a log, and a warning is
one line, through a pipe and through a pseudo-terminal (Python's `pty`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT, run_in_terminal

# A command through `pipeline.cli.main`, as every stage and tool runs: a phase, then a warning.
COMMAND = [sys.executable, "-c", """
import warnings
from pipeline import console
from pipeline.cli import main

def run():
    with console.Phase("encode train", total=3, unit="sent") as phase:
        for _ in range(3):
            phase.update()
    warnings.warn("3 training pairs dropped: over the limit")

main(run)
"""]  # fmt: skip


def test_without_a_terminal_a_phase_and_a_warning_are_one_line_each():
    result = subprocess.run(COMMAND, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr  # no bar frames in a log
    assert re.fullmatch(
        r"encode train: 3 sent in 0:00:0\d\nwarning: 3 training pairs dropped: over the limit\n",
        result.stderr,
    ), result.stderr


def test_in_a_terminal_a_phase_draws_a_bar_and_a_warning_has_no_source_line():
    out = run_in_terminal(COMMAND, REPO_ROOT, dict(os.environ), timeout=120)
    assert re.search(r"encode train: 100%\|[^|]*\| 3/3 ", out), out
    assert "\nwarning: 3 training pairs dropped: over the limit\r\n" in out, out
    for noise in ("UserWarning", "warnings.warn(", "<string>:"):  # category, code line, path
        assert noise not in out, noise


# ---------------------------------------------------------------- the smoke run, end to end

# The smoke run at a fifth of its updates: what the console shows does not depend on how long
# it trains, and two validations still come before the last step's.
STEPS = 40
SMOKE_RUN = ["dvc", "exp", "run", "-S", "experiment=smoke", "-S", f"train.max_steps={STEPS}",
             "-S", f"train.val_check_interval={STEPS // 2}"]  # fmt: skip
# What DVC itself prints after the last stage (`dvc exp run`).
DVC_CLOSING = ("Updating lock file", "Ran experiment(s)", "Experiment results have been applied")


@pytest.fixture
def smoke_repo(tmp_path, multi30k_dir, monkeypatch):
    """A git + DVC copy of the repository for a real `dvc exp run`, and its environment, with
    W&B not told to be silent (a user's default)."""
    from tests.test_dvc_pipeline import _env, copy_repository

    monkeypatch.setenv("MULTI30K_DIR", str(multi30k_dir))
    repo = copy_repository(tmp_path / "repo")
    return repo, {**_env(), "WANDB_SILENT": "false"}


def _wandb_lines(repo) -> list[str]:
    """The one line each W&B run of the pipeline leaves: training's, then evaluation's."""
    from pipeline.tracking import offline_run_dirs

    runs = offline_run_dirs(repo / "wandb_runs")
    assert len(runs) == 2, runs
    return [f"W&B: offline run saved; upload it with `wandb sync {run.relative_to(repo)}`"
            for run in runs]  # fmt: skip


def _headline(repo) -> str:
    summary = json.loads((repo / "metrics" / "summary.json").read_text())
    return f"test BLEU (lc) {summary['test/bleu_lc']:.1f} on test_2016_flickr ("


@pytest.mark.slow
def test_the_smoke_run_logged_to_a_file_reads_line_by_line_and_ends_with_its_score(smoke_repo):
    """`dvc exp run -S experiment=smoke > log 2>&1` (at `STEPS`): no progress-bar frames (carriage
    returns), one line per phase, one line per W&B run and none of W&B's banners, and the test
    BLEU as the last line the pipeline prints (only DVC's closing lines after it). Run again
    with nothing to do, `python -m pipeline.summary` (what `make smoke` and `make repro` end
    with) still ends it with the score."""
    repo, env = smoke_repo
    log = repo / "smoke.log"
    with log.open("w") as out:
        done = subprocess.run(SMOKE_RUN, cwd=repo, env=env, stdout=out,
                              stderr=subprocess.STDOUT, timeout=1800)  # fmt: skip
    text = log.read_text()
    assert done.returncode == 0, text[-3000:]
    assert "\r" not in text
    lines = text.splitlines()
    assert [line for line in lines if "wandb" in line.lower()] == _wandb_lines(repo)
    for phase in ("encode train: 2,000 sent in ", "encode val: 1,014 sent in ",
                  "save 3 splits: done in ", "decode val: ", "decode test_2016_flickr: "):  # fmt: skip
        assert sum(line.startswith(phase) for line in lines) == 1, phase
    score = max(i for i, line in enumerate(lines) if line.startswith(_headline(repo)))
    assert all(not line or line.startswith(DVC_CLOSING) for line in lines[score + 1 :]), lines

    again = subprocess.run(SMOKE_RUN, cwd=repo, env=env, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0 and "Running stage 'train'" not in again.stdout, again.stdout
    shown = subprocess.run([sys.executable, "-m", "pipeline.summary"], cwd=repo, env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    assert shown.returncode == 0 and shown.stdout.startswith(_headline(repo)), shown.stderr


@pytest.mark.slow
def test_the_smoke_run_in_a_terminal_keeps_its_bar_current_and_its_messages_apart(smoke_repo):
    """In a terminal 140 columns wide (the whole bar): the final bar shows the last validation's BLEU,
    Lightning's "`Trainer.fit` stopped" starts a line of its own, one line per W&B run,
    no Python warning source lines."""
    repo, env = smoke_repo
    out = run_in_terminal(SMOKE_RUN, repo, env, columns=140, timeout=1800)
    validations = re.findall(r"validation at step (\d+): val/bleu ([\d.]+)", out)
    finals = re.findall(rf"step {STEPS}/{STEPS} 100%\|[^|]*\|[^\r\n]*val/bleu ([\d.]+)", out)
    assert validations[-1][0] == str(STEPS) and finals, out[-3000:]
    assert finals[-1] == validations[-1][1]
    stopped = out.index("`Trainer.fit` stopped")
    assert out[stopped - 1] in "\r\n", out[stopped - 200 : stopped + 50]
    for line in _wandb_lines(repo):
        assert out.count(line) == 1, line
    assert "wandb:" not in out and "UserWarning" not in out
