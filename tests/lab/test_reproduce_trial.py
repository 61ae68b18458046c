"""benchmarks/reproduce_trial.py: a trial recorded by a real worker (the sweep CLI, one
thread, the fused loss compiled as the recipes run it) is trained again to its first
validation on this machine, identical bit for bit; a record one ulp away differs; a record of
another commit or whose first validation lies in the cool-down is refused before training. The
recorded checks (benchmarks/results/reproduce_trial/) hold their trials' records, and the docs
say what they found."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks.reproduce_trial import COMPARED, current_names
from tests.conftest import REPO_ROOT, build_once, shared_build, shared_root

TOOL = REPO_ROOT / "benchmarks" / "reproduce_trial.py"
RECORDED = REPO_ROOT / "benchmarks" / "results" / "reproduce_trial"
# A real worker's record, committed: refused records are edited copies of it.
COMMITTED_TRIAL = REPO_ROOT / "ablations" / "results" / "table3_seeds" / "trials" / "base-seed1"


def reproduce(trial: Path, work: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), str(trial), "--work", str(work), *flags],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture(scope="session")
@shared_build
def recorded_trial(tmp_path_factory, multi30k_dir) -> Path:
    """The record folder of the one finished trial of a smoke study, once per test run."""
    root = shared_root(tmp_path_factory) / "reproduce_trial"
    spec = {
        "study": "reproduce",
        "kind": "grid",
        "base_experiment": "smoke",
        "budget": {"train.max_steps": 20, "train.val_check_interval": 10,
                   "train.warmup_steps": 10, "train.cooldown_steps": 5,
                   "runtime.compile_loss": True, "eval.average": 1},
        "objective": {"metric": "val/greedy_bleu", "direction": "maximize"},
        "seeds": [1],
        "variants": {"base": {}},
    }  # fmt: skip

    def build() -> None:
        (root / "spec.yaml").write_text(yaml.safe_dump(spec))
        env = {**os.environ, "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1",
               "MULTI30K_DIR": str(multi30k_dir)}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "pipeline.sweep", str(root / "spec.yaml"), "--results-dir",
             str(root / "results"), "--work-dir", str(root / "work")],
            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr

    build_once(root, build)
    (trial,) = (root / "results" / "reproduce" / "trials").iterdir()
    return trial


def copy_record(trial: Path, into: Path, edit=None) -> Path:
    """A copy of the record folder's three files; `edit(run, curve, params)` changes them."""
    into.mkdir()
    loaded = {name: json.loads((trial / name).read_text()) for name in ("run.json", "curve.json")}
    params = yaml.safe_load((trial / "params.yaml").read_text())
    if edit:
        edit(loaded["run.json"], loaded["curve.json"], params)
    for name, value in loaded.items():
        (into / name).write_text(json.dumps(value))
    (into / "params.yaml").write_text(yaml.safe_dump(params))
    return into


@pytest.mark.slow
def test_a_trial_trained_again_here_reproduces_its_first_validation(recorded_trial, tmp_path):
    # No --any-commit: the record names the code that runs here, uncommitted changes included.
    out = tmp_path / "out.json"
    done = reproduce(recorded_trial, tmp_path / "work", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    first = json.loads((recorded_trial / "curve.json").read_text())[0]
    assert result["identical"] and result["step"] == first["step"] == 10
    assert result["measured"] == {key: first[key] for key in COMPARED}
    assert result["threads"] == 1 and "identical: step 10" in done.stderr


@pytest.mark.slow
def test_a_record_one_ulp_away_differs(recorded_trial, tmp_path):
    def nudge(run, curve, params):
        curve[0]["val/loss"] = math.nextafter(curve[0]["val/loss"], math.inf)

    record = copy_record(recorded_trial, tmp_path / "record", nudge)
    done = reproduce(record, tmp_path / "work")
    assert done.returncode == 1, done.stdout + done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert not result["identical"] and "differs: step 10" in done.stderr


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda run, curve, params: run.update(commit="0000000"), "recorded at commit 0000000"),
        (lambda run, curve, params: params["train"].update(cooldown_steps=3900),
         "is not a validation before the cool-down"),
    ],
    ids=["another_commit", "first_validation_in_the_cooldown"],
)  # fmt: skip
def test_a_record_that_cannot_be_reproduced_here_is_refused_before_training(
    tmp_path, edit, message
):
    flags = () if "commit" in message else ("--any-commit",)
    record = copy_record(COMMITTED_TRIAL, tmp_path / "record", edit)
    done = reproduce(record, tmp_path / "work", *flags)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "work").exists()  # no data prepared, nothing trained


def recorded_checks() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(RECORDED.glob("*.json"))]


def test_each_recorded_check_holds_its_trials_record():
    assert recorded_checks(), RECORDED
    for check in recorded_checks():
        trial = REPO_ROOT / "ablations" / "results" / check["record"]
        # both written under the names of the trial's commit (greedy BLEU was `val/bleu`)
        first = current_names(json.loads((trial / "curve.json").read_text())[0])
        run = json.loads((trial / "run.json").read_text())
        recorded = current_names(check["recorded"])
        assert recorded == {key: first[key] for key in COMPARED}, check["record"]
        assert (check["step"], check["recorded_commit"]) == (first["step"], run["commit"])
        assert check["commit"] == run["commit"] and check["threads"] == run["threads"]
        assert check["identical"] == (check["measured"] == check["recorded"])


def test_the_docs_say_what_the_recorded_checks_found():
    page = (REPO_ROOT / "docs" / "sweeps-at-scale.md").read_text(encoding="utf-8")
    assert (
        "an Intel Xeon with\nAMX, for one, does not reproduce `table3_seeds`' base seed 1" in page
    )
    amx = [check for check in recorded_checks() if "amx_tile" in check["machine"]["flags"]]
    assert any(
        check["record"] == "table3_seeds/trials/base-seed1"
        and check["recorded_on"].startswith("AMD EPYC")
        and not check["identical"]
        for check in amx
    )
    # every AMD EPYC family with AVX512-BF16 checked reproduces both records, and is named
    amd = {}
    for check in recorded_checks():
        machine = check["machine"]
        if machine["model name"].startswith("AMD EPYC") and "avx512_bf16" in machine["flags"]:
            family = (machine["cpu family"], machine["model"])
            amd.setdefault(family, {})[check["record"]] = check["identical"]
    for (family, model), found in sorted(amd.items()):
        assert found == {
            "table3_seeds/trials/base-seed1": True,
            "table3_seeds/trials/heads_2-seed1": True,
        }, (family, model)
    named = "; ".join(f"family {family}, model {model}" for family, model in sorted(amd))
    sentence = (f"AMD EPYC with AVX512-BF16 of each CPU family checked ({named}) reproduces "
                "both it and heads_2 seed 1 bit for bit")  # fmt: skip
    assert " ".join(page.split()).count(sentence) == 1, named
