"""pipeline.evaluation.decoding_search: the val grid, its best row, and that the evaluate stage
reproduces the chosen setting's score."""

from __future__ import annotations

import copy
import json
import re

import pytest

from pipeline.errors import ConfigError
from pipeline.evaluation import decoding_search, evaluate, model_loading
from tests.conftest import with_a_long_source, write_params


@pytest.fixture
def search_config(trained_smoke, tmp_path):
    cfg = copy.deepcopy(trained_smoke)
    for name in ("eval_dir", "metrics_dir", "plots_dir"):
        setattr(cfg.paths, name, str(tmp_path / name))
    cfg.eval.heatmaps = 0
    return cfg


@pytest.mark.slow
def test_grid_on_val_and_the_best_setting_reproduces_in_evaluate(search_config):
    cfg = search_config
    result = decoding_search.search(cfg, averages=[1, 2], beam_sizes=[1, 3],
                                    length_penalties=[0.6, 2.0], metric="bleu_lc")  # fmt: skip
    rows = result["rows"]
    settings = {(r["average"], r["beam_size"], r["length_penalty"]) for r in rows}
    assert settings == {(a, b, lp) for a in (1, 2) for b in (1, 3) for lp in (0.6, 2.0)}
    assert result["split"] == cfg.data.val_split
    assert result["best"]["bleu_lc"] == max(r["bleu_lc"] for r in rows)
    assert all(0 < r["length_ratio"] < 5 for r in rows)
    written = json.loads((decoding_search.Path(cfg.paths.metrics_dir)
                          / decoding_search.SEARCH_METRICS_FILE).read_text())  # fmt: skip
    assert written == result

    best = result["best"]
    cfg.eval.average, cfg.eval.beam_size = best["average"], best["beam_size"]
    cfg.eval.length_penalty = best["length_penalty"]
    cfg.eval.splits = [cfg.data.val_split]
    scores = evaluate.run(cfg)[cfg.data.val_split]
    # sacrebleu's float64 scores of the same hypotheses: float64 arithmetic, not the CPU's.
    assert scores["bleu_lc"] == pytest.approx(best["bleu_lc"], abs=1e-9)
    assert scores["chrf"] == pytest.approx(best["chrf"], abs=1e-9)


@pytest.mark.slow
def test_a_given_averaged_checkpoint_scores_as_its_window_does(search_config, tmp_path):
    from pipeline.training.checkpoints import select_checkpoints

    cfg = search_config
    given = tmp_path / "model.ckpt"  # what a run's evaluate stage leaves: eval/model.ckpt
    model_loading.write_model_checkpoint(select_checkpoints(cfg.paths.train_dir, 2), given)
    grid = dict(beam_sizes=[3], length_penalties=[0.6, 2.0], metric="bleu_lc")
    from_run = decoding_search.search(cfg, averages=[2], **grid)["rows"]
    from_file = decoding_search.search(cfg, averages=[5], checkpoint=given, **grid)["rows"]
    assert [r["average"] for r in from_file] == [decoding_search.GIVEN_CHECKPOINT] * 2
    for run_row, file_row in zip(from_run, from_file, strict=True):
        assert file_row == {**run_row, "average": decoding_search.GIVEN_CHECKPOINT}


def test_a_val_source_longer_than_the_model_reads_is_refused_before_decoding(
    search_config, tmp_path
):
    """Settings chosen on val sources cut short would be chosen on scores the model never
    earned: the search refuses a source longer than model.max_positions, naming its line."""
    source = with_a_long_source(search_config, tmp_path, "val", 2)
    with pytest.raises(ConfigError) as refused:
        decoding_search.search(search_config, averages=[1], beam_sizes=[1], length_penalties=[1.0])
    assert "split 'val' example 2 has a source of" in str(refused.value)
    assert f"(line 3 of {source})" in str(refused.value)
    assert not (tmp_path / "metrics_dir").exists()  # nothing written


def test_a_missing_checkpoint_is_named_before_any_decoding(tmp_path):
    with pytest.raises(decoding_search.PipelineError, match=r"--checkpoint .*nowhere\.ckpt"):
        decoding_search.run(["--checkpoint", str(tmp_path / "nowhere.ckpt")])


def test_table_marks_the_best_row():
    row = {"average": 3, "beam_size": 5, "length_penalty": 1.0, "bleu": 40.0, "bleu_lc": 40.5,
           "bleu_tok_lc": 40.7, "chrf": 60.0, "length_ratio": 0.98}  # fmt: skip
    other = dict(row, length_penalty=2.0, bleu=39.0)
    table = decoding_search.format_table({"rows": [row, other], "best": row})
    assert table.splitlines()[2].endswith("<- best")
    assert "<- best" not in table.splitlines()[3]


@pytest.mark.parametrize(
    ("flags", "key"),
    [(["--length-penalty", "1.0", "-1"], "eval.length_penalty"),
     (["--length-penalty", "nan"], "eval.length_penalty"),
     (["--beam-size", "0"], "eval.beam_size"),
     (["--average", "5", "0"], "eval.average")],
)  # fmt: skip
def test_a_grid_value_outside_its_keys_domain_is_refused_before_any_checkpoint_is_read(
    tmp_path, monkeypatch, flags, key
):
    """In a folder with no run at all: the value is refused first, naming its key, not the
    missing checkpoints a search would stop at after averaging and decoding the others."""
    write_params(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=rf"^config key '{re.escape(key)}': must be valid"):
        decoding_search.run(flags)
