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
    validations = re.findall(r"validation at step (\d+): val/greedy_bleu ([\d.]+)", out)
    finals = re.findall(rf"step {STEPS}/{STEPS} 100%\|[^|]*\|[^\r\n]*greedy BLEU ([\d.]+)", out)
    assert validations[-1][0] == str(STEPS) and finals, out[-3000:]
    assert finals[-1] == validations[-1][1]
    stopped = out.index("`Trainer.fit` stopped")
    assert out[stopped - 1] in "\r\n", out[stopped - 200 : stopped + 50]
    for line in _wandb_lines(repo):
        assert out.count(line) == 1, line
    assert "wandb:" not in out and "UserWarning" not in out


# ---------------------------------------------------------------- a sweep's end, said once


@pytest.fixture
def finished_study(tmp_path):
    """A grid study of three points, every one finished (an objective without training), and
    the command that runs `--workers 2` on it."""
    import yaml

    from pipeline import sweep

    spec_path = tmp_path / "ended.yaml"
    spec_path.write_text(yaml.safe_dump({
        "study": "ended", "kind": "grid", "base_experiment": "smoke",
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"}, "seeds": [1],
        "variants": {"base": {}, "heads_2": {"model.heads": 2}, "heads_1": {"model.heads": 1}},
    }))  # fmt: skip
    spec, results = sweep.load_spec(spec_path), tmp_path / "results"
    url = f"sqlite:///{tmp_path / 'study.db'}"
    objective = {"base": 3.0, "heads_2": 5.0, "heads_1": 4.0}

    def trial_fn(spec, trial, root):
        sweep.suggest_params(spec, trial)
        return objective[trial.params["variant"]]

    sweep.run_worker(spec, url, results, trial_fn=trial_fn, work_root=tmp_path / "work")
    return [sys.executable, "-m", "pipeline.sweep", str(spec_path), "--workers", "2",
            "--storage", url, "--results-dir", str(results), "--work-dir", str(tmp_path / "work"),
            "--allow-mixed"]  # the checkout may change between the two: no pin check here  # fmt: skip


def _says_its_end_once(out: str, command: list[str]) -> None:
    lines = out.replace("\r\n", "\n").splitlines()
    assert sum(line.startswith("trial  point") for line in lines) == 1, out
    assert sum(line == "best: trial 2 (heads_2-seed1), val/greedy_bleu 5.00" for line in lines) == 1
    assert [line for line in lines if line.startswith("dashboard: ")] == [
        f"dashboard: optuna-dashboard {command[command.index('--storage') + 1]}"
    ]
    results = command[command.index("--results-dir") + 1]
    assert [line for line in lines if line.startswith("report: ")] == [
        f"report: python -m pipeline.report {command[3]} --results-dir {results}"
    ]


@pytest.mark.slow
def test_several_workers_on_a_finished_study_print_its_summary_once_through_a_pipe(
    finished_study,
):
    result = subprocess.run(finished_study, cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    _says_its_end_once(result.stdout, finished_study)


@pytest.mark.slow
def test_several_workers_on_a_finished_study_print_its_summary_once_in_a_terminal(
    finished_study,
):
    out = run_in_terminal(finished_study, REPO_ROOT, dict(os.environ), columns=80, timeout=600)
    _says_its_end_once(out, finished_study)


def test_the_report_command_says_where_it_wrote_the_report(tmp_path):
    """A copy of a committed study: one line naming report.md, not the report itself."""
    import shutil

    results = tmp_path / "results"
    shutil.copytree(REPO_ROOT / "ablations" / "results" / "table3_label_smoothing",
                    results / "table3_label_smoothing")  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.report", "table3_label_smoothing", "--no-wandb",
         "--results-dir", str(results)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = results / "table3_label_smoothing" / "report.md"
    assert result.stdout == f"report: {report}\n"
    assert report.read_text(encoding="utf-8").startswith("#")
