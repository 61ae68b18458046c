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
    """The committed study's storage and its trials' records (curves, run records, scores)."""
    source, dest = STUDIES / name, results / name
    dest.mkdir(parents=True)
    shutil.copy2(source / "study.db", dest / "study.db")
    shutil.copytree(source / "trials", dest / "trials")
    return dest


def changed_settings(name: str) -> dict[str, set[str]]:
    """Per variant of the committed spec, the config keys it sets to other values than the
    base's."""
    from pipeline import config as config_lib
    from pipeline.sweep.spec import point_config

    spec = load_spec(REPO_ROOT / f"ablations/{name}.yaml")
    base = config_lib.to_dict(point_config(spec, {}))
    return {variant: {key for key, value in overrides.items()
                      if value != config_lib.subtree(base, key)}
            for variant, overrides in spec.variants.items()}  # fmt: skip


def trials(study_dir: Path, name: str) -> list[optuna.trial.FrozenTrial]:
    storage = f"sqlite:///{study_dir / 'study.db'}"
    return optuna.load_study(study_name=name, storage=storage).get_trials()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["table3", "table3_label_smoothing"])
def test_a_committed_study_opens_in_the_dashboards_layout(tmp_path, name):
    study_dir = copy_study(name, tmp_path)
    before = trials(study_dir, name)

    result = upgrade(name, tmp_path)
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{study_dir / 'study.db'}")
    assert study.metric_names == ["val/greedy_bleu"]
    after = study.get_trials()
    assert [(t.number, t.state, t.value) for t in after] == [
        (t.number, t.state, t.value) for t in before
    ]
    changed = changed_settings(name)
    for old, new in zip(before, after):
        point = grid_point(old)  # the committed study may be upgraded already: the same then
        assert new.params == {} and new.distributions == {}
        assert set(changed[point["variant"]]) <= set(new.user_attrs), new.user_attrs
        assert {"variant": new.user_attrs["variant"], "seed": new.user_attrs["seed"]} == point
        assert grid_point(new) == point and trial_variant(new) == point["variant"]
        assert new.datetime_start == old.datetime_start
        added = ("variant", "seed", *changed[point["variant"]])
        assert {k: v for k, v in new.user_attrs.items() if k not in added} == {
            k: v for k, v in old.user_attrs.items() if k not in added
        }
        if new.state == TrialState.COMPLETE:
            curve = json.loads(
                (study_dir / "trials" / new.user_attrs["record"] / "curve.json").read_text()
            )
            # recorded as val/bleu before the greedy score got a name of its own
            greedy = {r["step"]: r.get("val/greedy_bleu", r.get("val/bleu")) for r in curve}
            assert new.intermediate_values == greedy
    # The worker's closing summary names each point as before, with the headline BLEU (lc).
    spec = load_spec(REPO_ROOT / f"ablations/{name}.yaml")
    summary = study_summary(study, spec).splitlines()
    assert summary[0].split()[3:6] == ["test", "BLEU", "(lc)"]
    for t in after:
        if t.state == TrialState.COMPLETE:
            (line,) = [row for row in summary if row.split()[0] == str(t.number)]
            point = f"{t.user_attrs['variant']}-seed{t.user_attrs['seed']}"
            assert line.split()[1:2] == [point] and f"{t.user_attrs['test_bleu_lc']:.2f}" in line
    heads = {t.user_attrs["variant"]: t.user_attrs.get("model.heads") for t in after}
    if name == "table3":
        assert heads["heads_1"] == 1 and heads["base"] is heads["dropout_0.1"] is None
    _ranks_and_crowns_nothing(study, spec, study_dir)

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


def _ranks_and_crowns_nothing(study: optuna.Study, spec, study_dir: Path) -> None:
    """What optuna-dashboard shows: no parameter importance (it ranks, with PED-ANOVA, every
    parameter a finished trial has: here none); the study's note says how many trials
    finished, the verdicts or that there are none, what "Best Trial" is, and where the report
    is."""
    from optuna.importance import PedAnovaImportanceEvaluator, get_param_importances
    from optuna_dashboard import get_note

    finished = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert get_param_importances(study, evaluator=PedAnovaImportanceEvaluator()) == {}
    note = get_note(study)
    planned = len(spec.grid())
    assert note.startswith(f"**{spec.study}**: {len(finished)} of {planned} planned trials")
    assert ('"Best Trial" is the highest val/greedy_bleu of a single seed, not a finding') in note
    assert f"`python -m pipeline.report {spec.study}` writes `{study_dir / 'report.md'}`" in note
    if len(finished) < planned:
        assert "Interim: no verdict is drawn" in note
    else:
        verdicts = [line for line in note.splitlines() if line.startswith("- ")]
        assert [line.split(":")[0] for line in verdicts] == [
            f"- {v}" for v in spec.variants if v != "base"
        ], note
    failed = sum(t.state == TrialState.FAIL for t in study.get_trials())
    if failed:
        assert f"{failed} failed trials are attempts that stopped" in note


def test_a_workers_note_counts_the_finished_trials_by_the_database(tmp_path):
    """The note a worker writes after each trial (on a copy of the pilot, a grid whose points
    all finished) says how many finished, counted without reading the study's trials."""
    from optuna_dashboard import get_note

    from pipeline.sweep.upgrade import save_status_note

    study_dir = copy_study("table3", tmp_path)
    spec = load_spec(REPO_ROOT / "ablations" / "table3.yaml")
    storage = f"sqlite:///{study_dir / 'study.db'}"
    study = optuna.load_study(study_name=spec.study, storage=storage)
    finished = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    save_status_note(study, spec, study_dir)
    note = get_note(optuna.load_study(study_name=spec.study, storage=storage))
    assert note.startswith(f"**{spec.study}**: {len(finished)} of {len(spec.grid())} planned")
    assert "verdicts are the report's" in note or "Interim: no verdict" in note
