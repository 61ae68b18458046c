"""The evaluate stage: batching helpers, errors a user can cause, and (slow) an end-to-end run
on the smoke data with a briefly trained checkpoint, checked against the sacrebleu CLI and the
W&B offline files."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import torch

from pipeline.errors import DataError
from pipeline.evaluation import evaluate

SACREBLEU_CLI = Path(sys.executable).parent / "sacrebleu"


# Where a run writes; prepared + tokenized stay those of the shared (read-only) smoke data.
RUN_OUTPUTS = ("train_dir", "eval_dir", "metrics_dir", "plots_dir", "wandb_dir")


def eval_config(tokenized_smoke, root: Path, *overrides: tuple[str, object]):
    """A private copy of the smoke config whose outputs go under `root`."""
    cfg = copy.deepcopy(tokenized_smoke)
    for name in RUN_OUTPUTS:
        setattr(cfg.paths, name, str(root / name))
    for key, value in overrides:
        setattr(cfg.eval, key, value)
    return cfg


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize("max_tokens", [1, 7, 20, 64])
def test_length_batches_cover_every_sentence_within_the_budget(max_tokens):
    lengths = [5, 0, 12, 3, 3, 9, 1, 7, 7, 20, 2, 0, 4]
    batches = evaluate.length_batches(lengths, max_tokens)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == [i for i, n in enumerate(lengths) if n > 0]  # once each, no empties
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= max_tokens or len(batch) == 1  # a long sentence goes alone
        assert lengths[batch[0]] == max(lengths[i] for i in batch)
    # Longest first, so lengths never increase along the flattened order.
    assert [lengths[i] for i in flat] == sorted((lengths[i] for i in flat), reverse=True)


def test_length_batches_fill_the_budget():
    batches = evaluate.length_batches([4] * 10, max_tokens=12)
    assert [len(b) for b in batches] == [3, 3, 3, 1]


def test_pad_batch():
    batch = evaluate.pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert batch.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.dtype == torch.long


def test_sample_indices_are_spread_over_the_split():
    assert evaluate.sample_indices(3, 1000) == [0, 500, 999]
    assert evaluate.sample_indices(5, 3) == [0, 1, 2]
    assert evaluate.sample_indices(0, 10) == []
    assert evaluate.sample_indices(1, 10) == [0]


def test_nbest_lines():
    translations = [
        evaluate.Translation(["ein Hund", "Hund"], [[1], [2]], [-0.5, -1.25]),
        evaluate.Translation(["eine Katze"], [[3]], [-0.1]),
    ]
    assert evaluate.nbest_lines(translations) == [
        "0\t-0.5000\tein Hund",
        "0\t-1.2500\tHund",
        "1\t-0.1000\teine Katze",
    ]
    assert evaluate.Translation([], [], []).best == ""


def test_wandb_metric_names(make_config):
    cfg = make_config("eval.splits=[val,test_2016_flickr]")
    scores = {"bleu": 30.0, "bleu_lc": 31.0, "chrf": 55.0, "ter": 50.0}
    results = {"val": dict(scores), "test_2016_flickr": {**scores, "bleu": 28.0}}
    metrics = evaluate.wandb_metrics(results, cfg)
    assert metrics["test/bleu"] == 28.0  # the benchmark split, as the contract names it
    assert metrics["eval/val/bleu"] == 30.0 and metrics["eval/test_2016_flickr/ter"] == 50.0
    assert "val/bleu" not in metrics  # that name is training's greedy val/bleu
    cfg = make_config("eval.splits=[val]")
    assert "test/bleu" not in evaluate.wandb_metrics({"val": scores}, cfg)


# --------------------------------------------------------------------------- user errors


def test_missing_prepared_split_is_named(tokenized_smoke, tmp_path):
    cfg = eval_config(tokenized_smoke, tmp_path, ("splits", ["val", "test_2017_flickr"]))
    with pytest.raises(
        DataError, match="'test_2017_flickr' has no prepared text.*data.test_splits"
    ):
        evaluate.run(cfg)


def test_missing_checkpoints_say_to_train(tokenized_smoke, tmp_path):
    cfg = eval_config(tokenized_smoke, tmp_path)
    with pytest.raises(DataError, match="train"):
        evaluate.run(cfg)
    cfg.eval.checkpoint = str(tmp_path / "nowhere.ckpt")
    with pytest.raises(DataError, match="eval.checkpoint=.*nowhere.ckpt: file not found"):
        evaluate.run(cfg)
    assert not Path(cfg.paths.eval_dir).exists()  # nothing half-written
