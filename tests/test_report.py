"""pipeline.report: Table-3 table, CSV and charts from a real Optuna study.

The study's trials carry what sweep trials record (test BLEU, hypotheses files); the
hypotheses are real Multi30k references with controlled damage, so the expected numbers can
be computed independently here.
"""

from __future__ import annotations

import gzip
import statistics

import matplotlib.image
import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from pipeline import report, sweep
from pipeline.evaluation import scoring
from tests.conftest import REPO_ROOT

N_SENTENCES = 200


@pytest.fixture
def references(multi30k_dir):
    with gzip.open(multi30k_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f][:N_SENTENCES]


def damaged(references: list[str], every: int) -> list[str]:
    """Drop the last word of every `every`-th sentence: a worse system, by a known amount."""
    return [" ".join(r.split()[:-1]) if i % every == 0 else r for i, r in enumerate(references)]


@pytest.fixture
def study(tmp_path, references):
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "test_2016_flickr.de").write_text("\n".join(references) + "\n")
    damage = {("base", 1): 2, ("base", 2): 3, ("heads_1", 1): 1, ("heads_1", 2): 1}
    study = optuna.create_study(
        study_name="smoke", storage=f"sqlite:///{tmp_path / 'study.db'}", direction="maximize"
    )
    for (variant, seed), every in damage.items():
        hyps = damaged(references, every)
        hyp_path = tmp_path / f"{variant}-{seed}.hyp"
        hyp_path.write_text("\n".join(hyps) + "\n")
        bleu = scoring.score(hyps, references)["bleu"]
        study.add_trial(
            optuna.create_trial(
                state=TrialState.COMPLETE,
                value=bleu,
                params={"variant": variant, "seed": seed},
                distributions={
                    "variant": CategoricalDistribution(["base", "heads_1"]),
                    "seed": CategoricalDistribution([1, 2]),
                },
                user_attrs={
                    "test_bleu": bleu,
                    "val_ppl": 10.0 + seed,
                    "parameters": 1_000_000,
                    "hypotheses": str(hyp_path),
                    "config": {
                        "data": {"test_splits": ["test_2016_flickr"], "tgt_lang": "de"},
                        "paths": {"prepared": str(prepared)},
                    },
                },
            )
        )
    return spec, study


def test_variant_rows_match_independent_numbers(study, references):
    spec, study = study
    rows = {r.variant: r for r in report.variant_rows(spec, study.trials)}
    base_bleus = [scoring.score(damaged(references, e), references)["bleu"] for e in (2, 3)]
    worse = scoring.score(damaged(references, 1), references)["bleu"]
    assert rows["base"].bleu_mean == pytest.approx(statistics.fmean(base_bleus))
    assert rows["base"].bleu_std == pytest.approx(statistics.stdev(base_bleus))
    assert rows["heads_1"].delta == pytest.approx(worse - statistics.fmean(base_bleus))
    assert rows["heads_1"].factor == "model.heads=1"
    # Damaging every sentence vs every 2nd/3rd: a real difference, so a small p-value.
    assert rows["heads_1"].p_value is not None and rows["heads_1"].p_value < 0.05
    assert rows["base"].p_value is None


def test_report_files(study, tmp_path):
    spec, study = study
    out = tmp_path / "report"
    path = report.write_report(spec, study, out, log_to_wandb=False)
    text = path.read_text()
    assert "| base | (base recipe) |" in text and "| heads_1 | model.heads=1 |" in text
    csv_lines = (out / "trials.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 4
    for name in ("bleu_per_variant", "param_importances", "parallel_coordinates"):
        image = matplotlib.image.imread(out / f"{name}.png")
        assert image.shape[0] > 100 and image.shape[1] > 100
        assert f"({name}.png)" in text


def test_empty_study_is_a_clear_error(tmp_path):
    spec = sweep.load_spec(REPO_ROOT / "ablations/smoke.yaml")
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="smoke")
    with pytest.raises(report.PipelineError, match="no trials"):
        report.write_report(spec, study, tmp_path / "out", log_to_wandb=False)
