"""pipeline.sweep.upgrade on a copy of the committed Table 3 study: the dashboard's layout
(named objective, curves as intermediate values, settings as parameters, variant and seed as
attributes), nothing else changed, and a study with workers still at it refused."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from pipeline.sweep.claims import grid_point
from pipeline.sweep.deadline import trial_variant
from pipeline.sweep.spec import load_spec
from pipeline.sweep.summary import study_summary
from tests.conftest import REPO_ROOT

STUDIES = REPO_ROOT / "ablations" / "results"


def upgrade(spec: str, results: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.sweep.upgrade", f"ablations/{spec}.yaml",
         "--results-dir", str(results)],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=1200,
    )  # fmt: skip


def copy_study(name: str, results: Path) -> Path:
    """The committed study's storage and its trials' curves and run records."""
    source, dest = STUDIES / name, results / name
    dest.mkdir(parents=True)
    shutil.copy2(source / "study.db", dest / "study.db")
    for curve in source.glob("trials/*/curve.json"):
        (dest / "trials" / curve.parent.name).mkdir(parents=True)
        shutil.copy2(curve, dest / "trials" / curve.parent.name / curve.name)
    return dest


def trials(study_dir: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{study_dir / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage).get_trials()


@pytest.mark.parametrize(
    "name, settings",
    [("table3", {"model.heads", "model.dropout", "train.label_smoothing", "model.positional"}),
     ("table3_label_smoothing", {"train.label_smoothing"})],
)  # fmt: skip
def test_a_committed_study_opens_in_the_dashboards_layout(tmp_path, name, settings):
    study_dir = copy_study(name, tmp_path)
    before = trials(study_dir, name)

    result = upgrade(name, tmp_path)
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{study_dir / 'study.db'}")
    assert study.metric_names == ["val/bleu"]
    after = study.get_trials()
    assert [(t.number, t.state, t.value) for t in after] == [
        (t.number, t.state, t.value) for t in before
    ]
    for old, new in zip(before, after):
        assert set(new.params) == settings, new.params
        point = grid_point(old)  # the committed study may be upgraded already: the same then
        assert {"variant": new.user_attrs["variant"], "seed": new.user_attrs["seed"]} == point
        assert "variant" not in new.params and "seed" not in new.params
        assert grid_point(new) == point and trial_variant(new) == point["variant"]
        assert new.datetime_start == old.datetime_start
        assert {k: v for k, v in new.user_attrs.items() if k not in ("variant", "seed")} == {
            k: v for k, v in old.user_attrs.items() if k not in ("variant", "seed")
        }
        if new.state == TrialState.COMPLETE:
            curve = json.loads(
                (study_dir / "trials" / new.user_attrs["record"] / "curve.json").read_text()
            )
            assert new.intermediate_values == {r["step"]: r["val/bleu"] for r in curve}
    # The worker's closing summary names each point as before, with the headline BLEU (lc).
    spec = load_spec(REPO_ROOT / f"ablations/{name}.yaml")
    summary = study_summary(study, spec).splitlines()
    assert summary[0].split()[3:6] == ["test", "BLEU", "(lc)"]
    for t in after:
        if t.state == TrialState.COMPLETE:
            (line,) = [row for row in summary if row.split()[0] == str(t.number)]
            point = f"{t.user_attrs['variant']}-seed{t.user_attrs['seed']}"
            assert line.split()[1:2] == [point] and f"{t.user_attrs['test_bleu_lc']:.2f}" in line
    heads = {t.user_attrs["variant"]: t.params.get("model.heads") for t in after}
    if name == "table3":
        assert heads["heads_1"] == 1 and heads["base"] == heads["dropout_0.1"] == 4

    # Again: nothing changes.
    digest = [(t.number, t.params, t.user_attrs, t.intermediate_values) for t in after]
    assert upgrade(name, tmp_path).returncode == 0
    assert [(t.number, t.params, t.user_attrs, t.intermediate_values)
            for t in trials(study_dir, name)] == digest  # fmt: skip


def test_a_study_with_a_running_trial_is_refused_and_left_as_it_is(tmp_path):
    study_dir = copy_study("table3_label_smoothing", tmp_path)
    database = study_dir / "study.db"
    storage = f"sqlite:///{database}"
    study = optuna.load_study(study_name="table3_label_smoothing", storage=storage)
    study.enqueue_trial({"variant": "base", "seed": 3})
    study.ask()  # a worker at work: RUNNING
    before = hashlib.sha256(database.read_bytes()).hexdigest()

    result = upgrade("table3_label_smoothing", tmp_path)
    assert result.returncode == 2, result.stderr
    assert "running or waiting" in result.stderr and "Traceback" not in result.stderr
    assert hashlib.sha256(database.read_bytes()).hexdigest() == before
    assert not list(study_dir.glob("study.db.*"))
