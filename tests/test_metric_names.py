"""One name a number: former names read as today's, in records committed before the rename."""

from __future__ import annotations

import yaml

from pipeline.metric_names import (
    FORMER_SUMMARY,
    GREEDY_VAL_BLEU,
    MEAN_TOKENS_PER_SEC,
    WINDOW_TOKENS_PER_SEC,
    current_metric,
    current_names,
)
from pipeline.report.records import load_records
from pipeline.sweep.spec import load_spec
from tests.conftest import REPO_ROOT

FORMER_GREEDY = "val/bleu"
STUDIES = REPO_ROOT / "ablations" / "results"


def test_former_names_read_as_todays_nested_and_todays_name_wins():
    summary = {FORMER_GREEDY: 3.0, WINDOW_TOKENS_PER_SEC: 900.0, "val/loss": 4.0,
               "last": {FORMER_GREEDY: 2.5, "step": 40}}  # fmt: skip
    assert current_names(summary, FORMER_SUMMARY) == {
        GREEDY_VAL_BLEU: 3.0, MEAN_TOKENS_PER_SEC: 900.0, "val/loss": 4.0,
        "last": {GREEDY_VAL_BLEU: 2.5, "step": 40},
    }  # fmt: skip
    # a logged value: the window's rate keeps its name
    assert current_names({WINDOW_TOKENS_PER_SEC: 900.0}) == {WINDOW_TOKENS_PER_SEC: 900.0}
    both = {FORMER_GREEDY: 1.0, GREEDY_VAL_BLEU: 2.0}
    assert current_names(both) == {GREEDY_VAL_BLEU: 2.0}
    assert current_metric(FORMER_GREEDY) == GREEDY_VAL_BLEU
    assert current_metric("val/loss") == "val/loss"


def test_committed_studies_recorded_under_former_names_read_under_todays():
    """Every committed trial record reads with today's names only: the report and its charts
    find the greedy curve and the run's mean rate in studies recorded before the rename."""
    studies = [d for d in STUDIES.iterdir() if (d / "trials").is_dir()]
    assert studies
    former = set(FORMER_SUMMARY)
    seen = 0
    for study in studies:
        for record in load_records(study):
            seen += 1
            assert not former & set(record.train), record.folder
            assert GREEDY_VAL_BLEU in record.train and MEAN_TOKENS_PER_SEC in record.train
            assert record.curve and all(GREEDY_VAL_BLEU in p for p in record.curve), record.folder
            assert not any(FORMER_GREEDY in p for p in record.curve)
    assert seen


def test_a_spec_with_the_former_objective_name_loads_under_todays(tmp_path):
    spec = yaml.safe_load((REPO_ROOT / "ablations" / "smoke.yaml").read_text())
    spec["objective"]["metric"] = FORMER_GREEDY
    path = tmp_path / "former.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert load_spec(path).metric == GREEDY_VAL_BLEU


def test_a_checkpoint_logged_under_former_names_resumes_with_its_best_validation(make_config):
    """A run checkpointed before the rename resumes: its history reads under today's names,
    so the best validation (what ranks checkpoints and sweeps read) is found."""
    from pipeline.training.module import TranslationModule

    cfg = make_config("model.d_model=32", "model.heads=2", "model.d_ff=64")
    module = TranslationModule(cfg, vocab_size=30)
    history = [{"step": 10, "train/loss": 5.0, "lr": 1e-3},
               {"step": 20, FORMER_GREEDY: 4.0, "val/loss": 4.5, "val/ppl": 90.0},
               {"step": 40, FORMER_GREEDY: 6.0, "val/loss": 4.0, "val/ppl": 55.0}]  # fmt: skip
    module.on_load_checkpoint({"history": history})
    assert module.best_val() == {"step": 40, GREEDY_VAL_BLEU: 6.0, "val/loss": 4.0, "val/ppl": 55.0}
