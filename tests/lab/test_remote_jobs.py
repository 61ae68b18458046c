"""benchmarks/remote_jobs.sh, the job runner for a remote machine without internet, run end to
end on this CPU: a study and a DVC-stage run started in the background, waited for, and packed
for the trip back; nothing written into the tree (the remote's next command copies the tree
again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "remote_jobs.sh"


@pytest.mark.slow
def test_a_study_and_a_dvc_run_come_back_packed_with_their_records(tmp_path, multi30k_dir):
    study = f"remote-{os.getpid()}"
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({
        "study": study, "kind": "grid", "base_experiment": "smoke",
        "budget": {"train.max_steps": 10, "train.val_check_interval": 5, "eval.average": 1},
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"}, "seeds": [1],
        "variants": {"base": {}, "heads_1": {"model.heads": 1}},
    }))  # fmt: skip
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "REMOTE_JOBS_RUNS": str(tmp_path / "runs"),
        "REMOTE_JOBS_SITE": str(tmp_path / "site"),
        "REMOTE_JOBS_WHEELS": str(tmp_path / "no-wheels"),  # this machine has what it needs
        "REMOTE_JOBS_POLL": "2",
        "PYTHON": sys.executable,
        "MULTI30K_DIR": str(multi30k_dir),
        "OUT": str(out),
    }

    def script(*args: str, timeout: float, returncode: int = 0, **more_env: str) -> str:
        done = subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO_ROOT, text=True,
                              env={**env, **more_env}, capture_output=True, timeout=timeout)  # fmt: skip
        assert done.returncode == returncode, done.stdout + done.stderr
        return done.stdout

    # a job that cannot start (its spec is missing) is named and leaves the others to run
    missing = f"study:{tmp_path / 'missing.yaml'}"
    started = script("start", "abc1234", missing, f"study:{spec}",
                     "dvc:smoke:experiment=smoke train.max_steps=10 train.val_check_interval=5 eval.average=1",
                     timeout=120, returncode=1)  # fmt: skip
    assert f"NOT STARTED: {missing}" in started
    assert f"study {study}: starting 2 workers" in started and "dvc: smoke" in started
    # waiting ends at its deadline, not at the next poll after it
    script("wait_jobs", "1", timeout=30, REMOTE_JOBS_POLL="600")
    waited = script("wait_jobs", "600", timeout=660)
    last = [line for line in waited.splitlines() if line.startswith("== ")][-1]
    assert "processes: 0;" in last, waited  # every job ended
    script("collect", timeout=60)
    without_models = unpack(out, tmp_path / "without_models")
    assert (without_models / "dvc" / "smoke" / "metrics" / "eval.json").is_file()
    assert not list(without_models.rglob("*.ckpt"))  # models only when asked for
    for part in out.glob("results.tgz.part-*"):
        part.unlink()
    script("collect", "models", timeout=60)
    back = unpack(out, tmp_path / "back")
    # the study: every point COMPLETE in the storage's snapshot, each with its record
    storage = f"sqlite:///{back / 'results' / study / 'study.db'}"
    trials = optuna.load_study(study_name=study, storage=storage).get_trials()
    assert sorted(t.params["variant"] for t in trials if t.state == TrialState.COMPLETE) == [
        "base", "heads_1"
    ]  # fmt: skip
    for point in ("base-seed1", "heads_1-seed1"):
        record = back / "results" / study / "trials" / point
        assert json.loads((record / "run.json").read_text())["hardware"]
        translations = (record / "test_2016_flickr.hyp").read_text().splitlines()
        assert len(translations) == 1000  # test2016's sentences (10 updates: mostly empty)
    # the DVC-stage run: its metrics, hypotheses, averaged model and provenance
    run = back / "dvc" / "smoke"
    evaluation = json.loads((run / "metrics" / "eval.json").read_text())
    assert {"val", "test_2016_flickr"} <= evaluation.keys()
    assert (run / "eval" / "model.ckpt").stat().st_size > 0
    assert yaml.safe_load((run / "params.yaml").read_text())["train"]["max_steps"] == 10
    made_on = json.loads((run / "made_on.json").read_text())
    assert made_on["commit"] == "abc1234" and made_on["hardware"]  # the commit it was told
    assert "starting 2 sweep workers" in (back / "logs" / f"{study}-workers.log").read_text()
    assert not (REPO_ROOT / "ablations" / "results" / study).exists()  # nothing in the tree


def unpack(out: Path, folder: Path) -> Path:
    """What `collect` left in `out`, joined and unpacked into `folder`."""
    archive_path = folder.with_suffix(".tgz")
    with open(archive_path, "wb") as whole:
        for part in sorted(out.glob("results.tgz.part-*")):
            whole.write(part.read_bytes())
    with tarfile.open(archive_path) as archive:
        archive.extractall(folder, filter="data")
    return folder


@pytest.mark.parametrize(
    ("given", "threads"),
    [({}, 1), ({"OMP_NUM_THREADS": "2"}, 2), ({"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "1"}, 1)],
)
def test_jobs_get_the_threads_asked_for(given, threads):
    """The jobs' torch runs as many threads as OMP_NUM_THREADS asks (MKL's own setting, when
    given, still caps it); the script runs any command after its settings."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    probe = "import torch; print(torch.get_num_threads())"
    out = subprocess.run(
        ["bash", str(SCRIPT), sys.executable, "-c", probe],
        env={**env, **given}, cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    assert int(out) == threads
