"""The DVC metrics: a dozen numbers from the train and evaluate records, named as in W&B."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import DataError
from pipeline.summary import SCORES, summarize


def test_summary_names_the_benchmark_split_test_and_keeps_the_rest_out(make_config, tmp_path):
    cfg = make_config("data.test_splits=[test_2016_flickr,test_2017_flickr]")
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    scores = {"bleu": 30.0, "chrf": 55.0, "ter": 50.0, "bleu_lc": 31.0, "sentences": 1000}
    evaluation = {split: {**scores, "bleu_lc": bleu} for split, bleu in
                  (("val", 31.0), ("test_2016_flickr", 30.0), ("test_2017_flickr", 27.0))}  # fmt: skip
    evaluation["signatures"] = {"bleu": "nrefs:1|case:mixed"}
    (metrics / "eval.json").write_text(json.dumps(evaluation))
    training = {"val/loss": 3.1, "val/ppl": 7.9, "wall_time_s": 60.0,
                "train/mean_tokens_per_sec": 5000.0, "num_parameters": 10, "steps": 4,
                "last": {"step": 4}}  # fmt: skip
    (metrics / "train.json").write_text(json.dumps(training))

    summary = summarize(cfg)
    assert summary["test/bleu_lc"] == 30.0 and summary["eval/test_2017_flickr/bleu_lc"] == 27.0
    assert summary["eval/val/bleu_lc"] == 31.0 and summary["val/ppl"] == 7.9
    assert summary["train/wall_time_s"] == 60.0 and summary["train/mean_tokens_per_sec"] == 5000.0
    assert summary["train/steps"] == 4
    assert len(summary) == 3 * 3 + 5  # no signatures, intervals, counts or statistics


def test_the_headline_bleu_has_one_name_in_dvc_and_wandb(make_config):
    """README's headline, BLEU (lc), is `test/bleu_lc` in the DVC metrics and in W&B; cased
    BLEU keeps `test/bleu` in W&B and is not in the summary under any name."""
    from pipeline.evaluation.evaluate import wandb_metrics

    cfg = make_config()
    split = {"bleu": 30.0, "bleu_lc": 31.0, "chrf": 55.0, "ter": 50.0}
    logged = wandb_metrics({name: split for name in cfg.eval.splits}, cfg)
    assert logged["test/bleu_lc"] == 31.0 and logged["eval/val/bleu_lc"] == 31.0
    assert logged["test/bleu"] == 30.0  # cased BLEU: W&B only
    summary_keys = {f"test/{key}" for key in SCORES} | {f"eval/val/{key}" for key in SCORES}
    assert summary_keys <= set(logged)  # the DVC summary's scores are logged under one name
    assert "test/bleu" not in summary_keys


def test_a_missing_record_is_named(make_config, tmp_path):
    with pytest.raises(DataError, match=r"eval\.json: cannot be read"):
        summarize(make_config())


def test_the_headline_fits_80_columns(make_config):
    """At its widest numbers (100.0 everywhere) the last line of a run fits 80 columns."""
    from pipeline.summary import headline

    cfg = make_config()
    summary = {"test/bleu_lc": 100.0, "test/chrf": 100.0, "test/ter": 100.0,
               "eval/val/bleu_lc": 100.0}  # fmt: skip
    line = headline(summary, cfg)
    assert line == (f"test BLEU (lc) 100.0 on {cfg.data.test_splits[0]} (chrF 100.0, TER 100.0); "
                    "val 100.0")  # fmt: skip
    assert len(line) <= 80
