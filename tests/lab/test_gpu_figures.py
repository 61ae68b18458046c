"""benchmarks/gpu_figures.sh, the one run behind docs/lab-benchmarks.md's GPU tables, run end to end
on this CPU with small settings: the suite and the sweep-worker study both write their JSON with
the commit given, what cannot run here is named, and benchmarks/gpu_report.py renders every
figure from those files. docs/lab-benchmarks.md's block is the report of the committed run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from packaging.utils import canonicalize_name

from benchmarks import gpu_report
from pipeline import docs_blocks
from pipeline.environment import read_lock
from pipeline.sweep import load_spec
from tests.conftest import REPO_ROOT
from tests.lab.test_gpu_suite import TINY

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_figures.sh"
COMMIT = "abc1234"


def on_one_core() -> None:
    """Confine this process and its children to one of the cores it may use."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


@pytest.mark.slow
def test_the_gpu_run_writes_both_records_and_the_report_renders_them(
    tmp_path, multi30k_dir, tokenized_smoke
):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "study": "workers", "kind": "grid", "base_experiment": "smoke",
        "budget": {"train.max_steps": 2, "train.val_check_interval": 2, "eval.average": 1},
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"}, "seeds": [1, 2],
        "variants": {"base": {}},
    }))  # fmt: skip
    out = tmp_path / "out"
    suite_options = [*TINY, "--sizes", "tiny", "--repeats", "1", "--warmup", "0",
                     "--target-tokens", "300", "--decode-batch-sizes", "1", "4",
                     "--decode-batches", "1", "--decode-repeats", "1"]  # fmt: skip
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "MULTI30K_DIR": str(multi30k_dir),
        "REMOTE_JOBS_RUNS": str(tmp_path / "runs"),
        "REMOTE_JOBS_SITE": str(tmp_path / "site"),
        "REMOTE_JOBS_WHEELS": str(tmp_path / "no-wheels"),  # this machine has what it needs
        "REMOTE_JOBS_FAIRSEQ_VENV": str(tmp_path / "fairseq-venv"),
        "GPU_FIGURES_TOKENIZED": tokenized_smoke.paths.tokenized,
        "GPU_SUITE_OPTIONS": " ".join(suite_options),
        "GPU_FIGURES_WORKERS": "1 2",
        "GPU_FIGURES_TRIALS_PER_WORKER": "1",
        "GPU_FIGURES_SPEC": str(spec),
        # each step's limit is the GPU's; here it only bounds a hung step on a loaded machine
        "GPU_SUITE_S": "900",
        "SWEEP_S": "900",
    }
    # On one core, as every test process trains on one thread: the launcher gives a lone sweep
    # worker every core it may use, and with the suite's other processes on them its trial's
    # threads wait on each other (a beam search of 2 s took 43 s).
    done = subprocess.run(["bash", str(SCRIPT), COMMIT, str(out)], cwd=REPO_ROOT, env=env,
                          text=True, capture_output=True, timeout=2000,
                          preexec_fn=on_one_core)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "GPU suite on cpu" in done.stdout and "sweep workers 1 2" in done.stdout

    suite = json.loads((out / "gpu_suite.json").read_text())
    sweep = json.loads((out / "sweep_workers.json").read_text())
    assert suite["provenance"]["commit"] == sweep["provenance"]["commit"] == COMMIT
    # no fairseq venv and no GPU here: named, not dropped
    assert "fairseq" in suite["skipped"]["train/tiny/fairseq"]
    assert not any(reason.startswith("failed") for reason in suite["skipped"].values())
    assert [(r["workers"], r["trials"]) for r in sweep["through_sweep"]] == [(1, 1), (2, 2)]
    for row in sweep["through_sweep"]:
        assert row["trials_per_hour"] == pytest.approx(3600 * row["trials"] / row["wall_s"])
        assert "unavailable" in row["gpu"]
    machine = (out / "machine.txt").read_text()
    assert "== CPU" in machine and "== packages" in machine
    assert {"gpu_suite.log", "sweep_workers.log"} <= {p.name for p in out.iterdir()}

    text = gpu_report.block(*gpu_report.load(out))
    assert f"commit {COMMIT}" in text
    one, two = (r["trials_per_hour"] for r in sweep["through_sweep"])
    gain = f"{two / one:.2f}x (N = 2)" if two > one else f"{1:.2f}x (N = 1)"
    assert f"| {gain} | {'met' if max(one, two) / one >= 4 else 'not met'} |" in text
    ours = suite["train"]["tiny"]["results"]["bfloat16"]["systems"]["ours"]
    assert (
        f"| tiny | bfloat16 | ours | {ours['step_ms']:,.1f} | {ours['tgt_tokens_per_s']:,.0f} |"
        in text
    )
    rates = suite["decode"]["results"]["4"]["sentences_per_s"]
    ratio = rates["ours_bfloat16"] / rates["ctranslate2"]
    assert f"| 4 | ctranslate2 | {rates['ctranslate2']:,.1f} | {ratio:.2f} |" in text
    # the targets that need a GPU peer are not measured on a CPU, and say so
    assert text.count("| not measured |") == 3
    for key, reason in suite["skipped"].items():
        assert f"- `{key}`: {reason}" in text


def test_the_docs_block_is_the_report_of_the_committed_gpu_run():
    expected = gpu_report.block(*gpu_report.load(REPO_ROOT / gpu_report.RESULTS))
    assert docs_blocks.read(REPO_ROOT / gpu_report.PAGE, gpu_report.BLOCK) == expected


def test_the_default_grid_has_a_point_for_every_trial_of_the_most_workers():
    """gpu_figures.sh's defaults (workers 1 4 16, trials per worker) against its spec's grid:
    the largest N must find a point for each of its trials."""
    script = SCRIPT.read_text()
    workers = re.search(r"WORKERS=\$\{GPU_FIGURES_WORKERS:-([\d ]+)\}", script).group(1).split()
    per_worker = int(re.search(r"TRIALS_PER_WORKER:-(\d+)\}", script).group(1))
    spec = re.search(r"SPEC=\$\{GPU_FIGURES_SPEC:-(\S+)\}", script).group(1)
    grid = load_spec(REPO_ROOT / spec).grid()
    assert len(grid) >= per_worker * max(map(int, workers))


def test_every_package_carried_to_a_remote_machine_is_pinned_in_the_lock():
    """benchmarks/carry.sh downloads benchmarks/remote_packages.txt at the lock's versions."""
    names = [line.strip() for line in (REPO_ROOT / "benchmarks" / "remote_packages.txt")
             .read_text().splitlines() if line.strip() and not line.startswith("#")]  # fmt: skip
    pins = read_lock()
    assert names and [name for name in names if canonicalize_name(name) not in pins] == []


@pytest.mark.slow
def test_a_step_over_its_time_limit_makes_the_run_exit_1_and_says_so(
    tmp_path, multi30k_dir, tokenized_smoke
):
    env = {**os.environ, "PYTHON": sys.executable, "MULTI30K_DIR": str(multi30k_dir),
           "REMOTE_JOBS_RUNS": str(tmp_path / "runs"), "REMOTE_JOBS_SITE": str(tmp_path / "site"),
           "REMOTE_JOBS_WHEELS": str(tmp_path / "no-wheels"),
           "GPU_FIGURES_TOKENIZED": tokenized_smoke.paths.tokenized,
           "GPU_SUITE_S": "1", "SWEEP_S": "1"}  # fmt: skip
    done = subprocess.run(["bash", str(SCRIPT), COMMIT, str(tmp_path / "out")], cwd=REPO_ROOT,
                          env=env, text=True, capture_output=True, timeout=600)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.count("exit 124") == 2  # timeout's status for each step
    assert (tmp_path / "out" / "machine.txt").exists()  # what was written is kept
