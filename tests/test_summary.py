"""The DVC metrics: a dozen numbers from the train and evaluate records, named as in W&B."""

from __future__ import annotations

import json

import pytest

from pipeline.errors import DataError
from pipeline.summary import summarize


def test_summary_names_the_benchmark_split_test_and_keeps_the_rest_out(make_config, tmp_path):
    cfg = make_config("data.test_splits=[test_2016_flickr,test_2017_flickr]")
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    scores = {"bleu": 30.0, "chrf": 55.0, "ter": 50.0, "bleu_lc": 31.0, "sentences": 1000}
    evaluation = {split: {**scores, "bleu": bleu} for split, bleu in
                  (("val", 31.0), ("test_2016_flickr", 30.0), ("test_2017_flickr", 27.0))}  # fmt: skip
    evaluation["signatures"] = {"bleu": "nrefs:1|case:mixed"}
    (metrics / "eval.json").write_text(json.dumps(evaluation))
    training = {"val/loss": 3.1, "val/ppl": 7.9, "wall_time_s": 60.0,
                "train/tokens_per_sec": 5000.0, "num_parameters": 10, "last": {"step": 4}}  # fmt: skip
    (metrics / "train.json").write_text(json.dumps(training))

    summary = summarize(cfg)
    assert summary["test/bleu"] == 30.0 and summary["eval/test_2017_flickr/bleu"] == 27.0
    assert summary["eval/val/bleu"] == 31.0 and summary["val/ppl"] == 7.9
    assert summary["train/wall_time_s"] == 60.0 and summary["train/tokens_per_sec"] == 5000.0
    assert len(summary) == 3 * 3 + 4  # no signatures, intervals, counts or statistics


def test_a_missing_record_is_named(make_config, tmp_path):
    with pytest.raises(DataError, match=r"eval\.json: cannot be read"):
        summarize(make_config())
