"""The evaluate stage: batching helpers, errors a user can cause, and (slow) an end-to-end run
on the smoke data with a briefly trained checkpoint, checked against the sacrebleu CLI and the
W&B offline files."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import torch
import yaml

from pipeline.errors import ConfigError, DataError
from pipeline.evaluation import beam_decoding, evaluate, model_loading
from pipeline.rounding import float32_tolerance
from tests.conftest import build_once, run_stage, shared_build, shared_root, with_a_long_source
from tests.test_tokenizer import moses_config, moses_tokenized_copy

SACREBLEU_CLI = Path(sys.executable).parent / "sacrebleu"


# Where evaluate writes; data and checkpoints stay those of the shared (read-only) fixture.
RUN_OUTPUTS = ("eval_dir", "metrics_dir", "plots_dir", "wandb_dir")


def eval_config(base, root: Path, *overrides: tuple[str, object]):
    """A private copy of a fixture's config whose evaluation outputs go under `root`."""
    cfg = copy.deepcopy(base)
    for name in RUN_OUTPUTS:
        setattr(cfg.paths, name, str(root / name))
    for key, value in overrides:
        setattr(cfg.eval, key, value)
        if key == "splits":  # every configured test split is evaluated: these are the ones
            cfg.data.test_splits = [split for split in value if split != cfg.data.val_split]
    return cfg


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize("max_tokens", [1, 7, 20, 64])
def test_length_batches_cover_every_sentence_within_the_budget(max_tokens):
    lengths = [5, 0, 12, 3, 3, 9, 1, 7, 7, 20, 2, 0, 4]
    batches = beam_decoding.length_batches(lengths, max_tokens)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == [i for i, n in enumerate(lengths) if n > 0]  # once each, no empties
    for batch in batches:
        padded = len(batch) * max(lengths[i] for i in batch)
        assert padded <= max_tokens or len(batch) == 1  # a long sentence goes alone
        assert lengths[batch[0]] == max(lengths[i] for i in batch)
    # Longest first, so lengths never increase along the flattened order.
    assert [lengths[i] for i in flat] == sorted((lengths[i] for i in flat), reverse=True)


def test_length_batches_fill_the_budget():
    batches = beam_decoding.length_batches([4] * 10, max_tokens=12)
    assert [len(b) for b in batches] == [3, 3, 3, 1]


def test_pad_batch():
    batch = beam_decoding.pad_batch([[5, 6, 7], [8]], pad_id=0)
    assert batch.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.dtype == torch.long


def test_sample_indices_are_spread_over_the_split():
    assert evaluate.sample_indices(3, 1000) == [0, 500, 999]
    assert evaluate.sample_indices(5, 3) == [0, 1, 2]
    assert evaluate.sample_indices(0, 10) == []
    assert evaluate.sample_indices(1, 10) == [0]


def test_nbest_lines():
    translations = [
        beam_decoding.Translation(["ein Hund", "Hund"], [[1], [2]], [-0.5, -1.25]),
        beam_decoding.Translation(["eine Katze"], [[3]], [-0.1]),
    ]
    assert beam_decoding.nbest_lines(translations) == [
        "0\t-0.5000\tein Hund",
        "0\t-1.2500\tHund",
        "1\t-0.1000\teine Katze",
    ]
    assert beam_decoding.Translation([], [], []).best == ""


def test_wandb_metric_names(make_config):
    cfg = make_config("eval.splits=[val,test_2016_flickr]")
    scores = {"bleu": 30.0, "bleu_lc": 31.0, "chrf": 55.0, "ter": 50.0}
    results = {"val": dict(scores), "test_2016_flickr": {**scores, "bleu": 28.0}}
    metrics = evaluate.wandb_metrics(results, cfg)
    assert metrics["test/bleu"] == 28.0  # the benchmark split, as the contract names it
    assert metrics["eval/val/bleu"] == 30.0 and metrics["test/ter"] == 50.0
    # one name a score: the benchmark split is not also eval/<split>/...; training's greedy
    # validation BLEU is val/greedy_bleu
    assert not [key for key in metrics if key.startswith("eval/test_2016_flickr/")]
    assert not [key for key in metrics if key.startswith("val/")]
    cfg = make_config("eval.splits=[val]", "data.test_splits=[]")
    assert "test/bleu" not in evaluate.wandb_metrics({"val": scores}, cfg)


# --------------------------------------------------------------------------- user errors


def test_missing_prepared_split_is_named(tokenized_smoke, tmp_path):
    cfg = eval_config(tokenized_smoke, tmp_path, ("splits", ["val", "test_2017_flickr"]))
    cfg.paths.train_dir = str(tmp_path / "train")
    with pytest.raises(
        DataError, match="'test_2017_flickr' has no prepared text.*data.test_splits"
    ):
        evaluate.run(cfg)


def test_missing_checkpoints_say_to_train(tokenized_smoke, tmp_path):
    cfg = eval_config(tokenized_smoke, tmp_path)
    cfg.paths.train_dir = str(tmp_path / "train")
    with pytest.raises(DataError, match="train"):
        evaluate.run(cfg)
    cfg.eval.checkpoint = str(tmp_path / "nowhere.ckpt")
    with pytest.raises(DataError, match="eval.checkpoint=.*nowhere.ckpt not found"):
        evaluate.run(cfg)
    assert not Path(cfg.paths.eval_dir).exists()  # nothing half-written


# --------------------------------------------------------------------------- end to end


def read_text_lines(path) -> list[str]:
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def sacrebleu_cli(ref: Path, hyp: Path) -> dict[str, float]:
    out = subprocess.run(
        [str(SACREBLEU_CLI), str(ref), "-i", str(hyp), "-m", "bleu", "chrf", "ter"]
        + ["-w", "4", "-f", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    names = {"BLEU": "bleu", "chrF2": "chrf", "TER": "ter"}
    return {names[entry["name"]]: entry["score"] for entry in json.loads(out)}


def averaged_state(paths) -> dict[str, torch.Tensor]:
    """The reference average, computed here from the raw checkpoint files."""
    states = [torch.load(p, map_location="cpu", weights_only=False)["state_dict"] for p in paths]
    return {
        key: torch.stack([s[key].double() for s in states]).mean(0).to(states[0][key].dtype)
        if states[0][key].is_floating_point()
        else states[0][key]
        for key in states[0]
    }


# What evaluating, translating and exporting a checkpoint import: Lightning costs seconds of
# start-up in each process and none of them trains.
LOAD_WITHOUT_LIGHTNING = """
import json, sys
from pipeline import config, tracking
from pipeline.evaluation import evaluate, model_loading
cfg = config.from_dict(json.loads(sys.argv[1]))
sources = model_loading.source_checkpoints(cfg)
model_loading.check_trained_with(sources, cfg)
model_loading.load_model(sources[0])
print(sorted(name for name in sys.modules if name.split(".")[0] == "lightning"))
"""


def test_a_checkpoint_loads_without_lightning_as_lightning_loads_it(trained_smoke):
    from pipeline.config import to_dict
    from pipeline.kernels import SpeedPaths, speed_paths_of
    from pipeline.training.checkpoints import LAST_NAME, checkpoint_dir
    from pipeline.training.module import TranslationModule

    checkpoint = checkpoint_dir(trained_smoke.paths.train_dir) / LAST_NAME
    saved_config = json.dumps(to_dict(trained_smoke))
    loaded = subprocess.run([sys.executable, "-c", LOAD_WITHOUT_LIGHTNING, saved_config],
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split("\n")[-2] == "[]", loaded.stdout

    ours = model_loading.load_model(checkpoint)
    reference = TranslationModule.load_from_checkpoint(checkpoint, map_location="cpu",
                                                       weights_only=True).model.float().eval()  # fmt: skip
    assert type(ours) is type(reference) and not ours.training
    trained_paths = SpeedPaths.on_cpu(trained_smoke.runtime.cpu_speed_paths)
    assert speed_paths_of(ours) == speed_paths_of(reference) == trained_paths
    expected = reference.state_dict()
    assert ours.state_dict().keys() == expected.keys()
    for name, value in ours.state_dict().items():
        assert torch.equal(value, expected[name]), name


@pytest.mark.slow
def test_evaluate_end_to_end(trained_smoke, tmp_path):
    from pipeline.tracking import offline_run_dirs, read_offline_run

    # 40 steps of training leave a model whose beams end at once (eos is its likeliest first
    # token after "."): beam 1, i.e. greedy, still writes non-empty lines to compare.
    cfg = eval_config(
        trained_smoke, tmp_path, ("average", 2), ("average_by", "last"), ("beam_size", 1)
    )
    assert cfg.eval.splits == ["val", "test_2016_flickr"]
    results = evaluate.run(cfg)

    # eval.json, keyed by split, is what run() returns; numbers flat per split for DVC.
    written = json.loads((Path(cfg.paths.metrics_dir) / "eval.json").read_text())
    assert written == json.loads(json.dumps(results))
    assert written["checkpoints_averaged"] == 2
    assert 0 < written["wall_time_s"] < 600
    assert (
        "tok:13a" in written["signatures"]["bleu"] and "case:lc" in written["signatures"]["bleu_lc"]
    )
    eval_dir, prepared = Path(cfg.paths.eval_dir), Path(cfg.paths.prepared)
    for split in cfg.eval.splits:
        metrics = written[split]
        scored = {"bleu", "bleu_lc", "chrf", "ter", "bleu_tok_lc", "bleu_lc_ci"}
        assert set(metrics) == scored | {"sentences"}
        assert metrics["bleu_lc_ci"] > 0  # eval.bootstrap_samples: the test set's own noise
        hypotheses = read_text_lines(eval_dir / f"{split}.hyp")
        sources = read_text_lines(prepared / f"{split}.en")
        assert len(hypotheses) == len(sources) == metrics["sentences"]  # one line per source
        assert sum(bool(h) for h in hypotheses) > len(hypotheses) // 2  # it did translate
        # The scores are the sacrebleu command line's on the same files.
        cli = sacrebleu_cli(prepared / f"{split}.de", eval_dir / f"{split}.hyp")
        assert {key: round(metrics[key], 4) for key in cli} == cli
    assert not (eval_dir / "val.nbest").exists()  # nbest=1

    # Averaging: model.ckpt holds the mean of the two newest step checkpoints.
    checkpoint_dir = Path(cfg.paths.train_dir) / "checkpoints"
    newest = sorted(checkpoint_dir.glob("step-*.ckpt"))[-2:]
    assert len(newest) == 2
    saved = torch.load(eval_dir / "model.ckpt", map_location="cpu", weights_only=False)
    assert sorted(saved["averaged_from"]) == sorted(str(p) for p in newest)
    assert "optimizer_states" not in saved
    expected = averaged_state(newest)
    assert saved["state_dict"].keys() == expected.keys()
    for key, tensor in expected.items():
        # A mean of two float32 tensors, summed and divided in either order: two roundings.
        tolerance = float32_tolerance(2, float(tensor.abs().max()))
        torch.testing.assert_close(saved["state_dict"][key], tensor, rtol=0, atol=tolerance)
    single = torch.load(newest[-1], map_location="cpu", weights_only=False)["state_dict"]
    assert any(not torch.equal(single[k], expected[k]) for k in expected)  # really averaged

    # Heatmaps: eval.heatmaps PNGs of the benchmark split, a layers x heads grid each.
    model = model_loading.load_model(eval_dir / "model.ckpt")
    tokenizer = model_loading.load_tokenizer(model_loading.tokenizer_path(cfg), model)
    pngs = sorted((Path(cfg.paths.plots_dir) / "attention").glob("*.png"))
    indices = evaluate.sample_indices(cfg.eval.heatmaps, 1000)
    assert [p.name for p in pngs] == [f"test_2016_flickr_{i:04d}.png" for i in indices]
    test_sources = read_text_lines(prepared / "test_2016_flickr.en")
    test_hyps = read_text_lines(eval_dir / "test_2016_flickr.hyp")
    test_refs = read_text_lines(prepared / "test_2016_flickr.de")
    for i, png in zip(indices, pngs):
        src_ids = tokenizer.encode(test_sources[i])
        (translation,) = beam_decoding.translate_ids(model, tokenizer, [src_ids], cfg.eval)
        assert translation.best == test_hyps[i]
        hyp_ids = translation.tokens[0]  # the generated pieces (re-encoding may merge them)
        title = f"test_2016_flickr #{i}: {test_sources[i]}"
        redrawn = tmp_path / "redrawn.png"
        weights = evaluate.attention_heatmap(model, tokenizer, src_ids, hyp_ids, redrawn, title)
        layers, heads = cfg.model.decoder_layers, cfg.model.heads
        assert weights.shape == (layers, heads, len(hyp_ids) + 1, len(src_ids))
        assert (weights >= 0).all()
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        # Padding the source must not move any weight onto the pad keys.
        padded = torch.tensor([src_ids + [tokenizer.pad_id] * 3])
        tgt_in = torch.tensor([[tokenizer.bos_id, *hyp_ids]])
        padded_weights = model.cross_attention_weights(padded, tgt_in)
        assert padded_weights[..., len(src_ids) :].abs().max() == 0
        torch.testing.assert_close(padded_weights[..., : len(src_ids)], weights)
        # The stage's PNG is exactly this drawing of these weights.
        assert (matplotlib.image.imread(png) == matplotlib.image.imread(redrawn)).all()

    # W&B offline run: scores under the contract's names, samples table, heatmap images.
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    run = read_offline_run(run_dir)
    assert run["run"]["job_type"] == "eval"
    summary = run["summary"]
    assert summary["test/bleu"] == pytest.approx(written["test_2016_flickr"]["bleu"])
    assert summary["eval/val/chrf"] == pytest.approx(written["val"]["chrf"])
    assert summary["eval/val/bleu_lc_ci"] == pytest.approx(written["val"]["bleu_lc_ci"])
    assert not [key for key in summary if key.startswith("eval/test_2016_flickr/")]
    assert summary["test/bleu_lc_ci"] == pytest.approx(written["test_2016_flickr"]["bleu_lc_ci"])
    # The scored model, with the subword model it needs, as a `model` artifact.
    (artifact,) = [a for a in run["artifacts"] if a["type"] == "model"]
    assert artifact["type"] == "model" and artifact["name"] == f"model-{cfg.experiment_name}"
    assert artifact["files"] == ["model.ckpt", "spm.model"]
    assert artifact["metadata"]["test/bleu"] == pytest.approx(summary["test/bleu"])
    # The config, readable beside the run without W&B's tools.
    config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert config["eval"]["value"]["beam_size"] == 1
    assert sorted(config["eval_checkpoints"]["value"]) == sorted(str(p) for p in newest)
    (logged,) = [row for row in run["history"] if "eval/samples" in row]
    assert logged["eval/samples"]["nrows"] == min(cfg.eval.samples, 1000)
    for png in pngs:
        image = logged[f"eval/attention/{png.stem}"]
        assert image["_type"] == "image-file" and image["caption"].startswith("test_2016_flickr #")
        logged_png = matplotlib.image.imread(run_dir / "files" / image["path"])
        assert (logged_png == matplotlib.image.imread(png)).all()
    table = json.loads((run_dir / "files" / logged["eval/samples"]["path"]).read_text())
    assert table["columns"] == ["split", "index", "source", "reference", "hypothesis"]
    for split, i, source, reference, hypothesis in table["data"]:
        assert split == "test_2016_flickr"
        assert (source, reference, hypothesis) == (test_sources[i], test_refs[i], test_hyps[i])


@pytest.mark.slow
def test_evaluate_one_checkpoint_with_nbest_into_a_given_run(trained_smoke, tmp_path):
    """eval.checkpoint, no averaging, n-best lists, a sweep trial's W&B run left open."""
    from pipeline.tracking import offline_run_dirs, read_offline_run, start_wandb_run

    best = sorted((Path(trained_smoke.paths.train_dir) / "checkpoints").glob("best-*.ckpt"))[-1]
    cfg = eval_config(
        trained_smoke,
        tmp_path,
        ("checkpoint", str(best)),
        ("splits", ["val"]),
        ("nbest", 2),
        ("heatmaps", 1),
        ("samples", 3),
    )
    run = start_wandb_run(cfg, job_type="trial")
    results = evaluate.run(cfg, wandb_run=run)
    run.log({"after_eval": 1.0})  # still open: the trial finishes it
    run.finish()

    assert results["checkpoints_averaged"] == 1 and set(results) >= {"val"}
    assert "test_2016_flickr" not in results
    eval_dir = Path(cfg.paths.eval_dir)
    saved = torch.load(eval_dir / "model.ckpt", map_location="cpu", weights_only=False)
    original = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
    assert all(torch.equal(saved["state_dict"][k], v) for k, v in original.items())

    hypotheses = read_text_lines(eval_dir / "val.hyp")
    nbest = [line.split("\t") for line in read_text_lines(eval_dir / "val.nbest")]
    assert len(nbest) == 2 * len(hypotheses)  # beam 2 always yields 2 finished hypotheses
    for k, hypothesis in enumerate(hypotheses):
        (i1, s1, t1), (i2, s2, _) = nbest[2 * k], nbest[2 * k + 1]
        assert int(i1) == int(i2) == k and t1 == hypothesis
        assert float(s1) >= float(s2)  # best first
    assert [p.name for p in (Path(cfg.paths.plots_dir) / "attention").glob("*.png")] == [
        "val_0000.png"
    ]
    (run_dir,) = offline_run_dirs(cfg.paths.wandb_dir)
    logged = read_offline_run(run_dir)
    assert logged["run"]["job_type"] == "trial"
    assert logged["summary"]["eval/val/bleu"] == pytest.approx(results["val"]["bleu"])
    assert "test/bleu" not in logged["summary"]
    assert logged["summary"]["after_eval"] == 1.0


# --------------------------------------------------------------------------- Moses


def test_load_tokenizer_reads_text_as_the_model_was_trained(tokenized_smoke, tmp_path):
    """The one loader of evaluate, translate, decoding_search and export: the run's config
    brings the source eos and must agree with the recorded pre-tokenization."""
    cfg = moses_tokenized_copy(tokenized_smoke, tmp_path)
    tokenizer = model_loading.load_tokenizer(model_loading.tokenizer_path(cfg), None, cfg.data)
    assert tokenizer.pretokenizer.method == "moses" and tokenizer.source_eos
    with pytest.raises(DataError, match=r"data\.tokenizer\.pretokenizer=none"):
        model_loading.load_tokenizer(model_loading.tokenizer_path(cfg), None, tokenized_smoke.data)


@pytest.fixture(scope="module")
@shared_build
def trained_moses(tokenized_smoke, tmp_path_factory):
    """The smoke corpus as Wu et al.'s recipe reads it (lowercased, Moses-tokenized, source
    eos) and the smoke model trained on it for 40 updates (validations and checkpoints at
    20 and 40); read-only like `trained_smoke`."""
    from pipeline.data.tokenized import tokenize
    from pipeline.training.trainer import run

    root = shared_root(tmp_path_factory) / "trained_moses"
    cfg = moses_config(tokenized_smoke, root)
    for name in ("train_dir", "eval_dir", "metrics_dir", "plots_dir", "wandb_dir"):
        setattr(cfg.paths, name, str(root / name))
    cfg.train.max_steps, cfg.train.val_check_interval = 40, 20
    cfg.train.progress_bar = False
    build_once(root, lambda: (tokenize(cfg), run(cfg)))
    return cfg


@pytest.mark.slow
def test_evaluate_with_moses_pretokenization_scores_detokenized_hypotheses(trained_moses, tmp_path):
    """Sources are Moses-tokenized in English before the subword model, the hypotheses are
    Moses-detokenized in German after it, and the scores are sacreBLEU's on those plain-text
    hypotheses against the raw (cased) references; the translate CLI writes the same."""
    import sentencepiece
    from omegaconf import OmegaConf
    from sacremoses import MosesDetokenizer

    from pipeline import translate
    from pipeline.config import to_dict
    from pipeline.data.moses import moses_tokenize

    cfg = eval_config(trained_moses, tmp_path, ("average", 2), ("beam_size", 1),
                      ("splits", ["val"]), ("heatmaps", 1), ("samples", 3))  # fmt: skip
    results = evaluate.run(cfg)
    eval_dir, prepared = Path(cfg.paths.eval_dir), Path(cfg.paths.prepared)
    hypotheses = read_text_lines(eval_dir / "val.hyp")
    sources = read_text_lines(prepared / "val.en")
    assert sum(bool(h) for h in hypotheses) > len(hypotheses) // 2  # it did translate

    # The same model and ids, detokenized here with sentencepiece and sacremoses directly.
    spm = sentencepiece.SentencePieceProcessor(model_file=str(model_loading.tokenizer_path(cfg)))
    src_ids = spm.encode(moses_tokenize(sources, "en"), out_type=int, add_eos=True)
    model = model_loading.load_model(eval_dir / "model.ckpt")
    tokenizer = model_loading.load_tokenizer(model_loading.tokenizer_path(cfg), model, cfg.data)
    assert tokenizer.encode_sources(sources) == src_ids
    translations = beam_decoding.translate_ids(model, tokenizer, src_ids, cfg.eval)
    detokenizer = MosesDetokenizer(lang="de")
    expected = [
        detokenizer.detokenize(spm.decode(t.tokens[0]).split(), unescape=True) for t in translations
    ]
    assert hypotheses == expected
    assert all(h == h.lower() and "&quot;" not in h and "&apos;" not in h for h in hypotheses)
    # Scored against the raw references, exactly as the sacrebleu command line scores them.
    cli = sacrebleu_cli(prepared / "val.de", eval_dir / "val.hyp")
    assert {key: round(results["val"][key], 4) for key in cli} == cli

    params = tmp_path / "params.yaml"
    params.write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))
    (tmp_path / "in.en").write_text("".join(f"{s}\n" for s in sources[:8]), encoding="utf-8")
    translate.translate(["--params", str(params), "--input", str(tmp_path / "in.en"),
                         "--output", str(tmp_path / "out.de")])  # fmt: skip
    assert read_text_lines(tmp_path / "out.de") == hypotheses[:8]


def test_stage_reports_a_user_error_without_traceback(tokenized_smoke, tmp_path):
    from omegaconf import OmegaConf

    from pipeline.config import to_dict

    cfg = eval_config(tokenized_smoke, tmp_path)
    cfg.paths.train_dir = str(tmp_path / "never_trained")
    (tmp_path / "params.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))
    result = run_stage("evaluate", tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr
    assert "never_trained" in result.stderr and "train" in result.stderr
    assert not (tmp_path / "metrics_dir" / "eval.json").exists()


def test_checkpoints_of_another_config_are_refused_naming_the_key(trained_smoke, tmp_path):
    """params.yaml changed after (or while) the train stage ran: the evaluate stage must not
    score the old model under the new parameters."""
    cfg = eval_config(trained_smoke, tmp_path)
    cfg.model.heads = 2 * trained_smoke.model.heads
    with pytest.raises(ConfigError, match="config key 'model.heads' differs from .*step-") as err:
        evaluate.run(cfg)
    assert "run the train stage first" in str(err.value)
    assert not Path(cfg.paths.eval_dir).exists()  # refused before any output
    cfg = eval_config(trained_smoke, tmp_path)
    cfg.train.progress_bar = not cfg.train.progress_bar  # cannot change the weights: accepted
    model_loading.check_trained_with(model_loading.source_checkpoints(cfg), cfg)


@pytest.mark.slow
def test_evaluate_stage_ends_with_a_table_of_every_split(smoke_stage_run):
    """BLEU, lowercased BLEU with its 95% interval, chrF, TER, how many translations differ and
    where they are, per split of eval.splits, as the last lines the stage prints."""
    out = smoke_stage_run.results["evaluate"].stdout.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("split "))
    assert out[header].split() == ["split", "sentences", "BLEU", "BLEU", "lc", "(95%", "CI)",
                                   "chrF", "TER", "distinct"]  # fmt: skip
    scores = json.loads((smoke_stage_run.root / "metrics" / "eval.json").read_text())
    for row, split in zip(out[header + 1 : header + 3], ("val", "test_2016_flickr")):
        cells = row.split()
        hypotheses = (smoke_stage_run.root / "eval" / f"{split}.hyp").read_text().splitlines()
        assert cells[0] == split and int(cells[1]) == scores[split]["sentences"]
        # The table prints one decimal: half its last digit, 0.05, is the rounding.
        assert float(cells[2]) == pytest.approx(scores[split]["bleu"], abs=0.05)
        assert cells[4] == "±" and float(cells[5]) == pytest.approx(scores[split]["bleu_lc_ci"],
                                                                     abs=0.05)  # fmt: skip
        assert float(cells[6]) == pytest.approx(scores[split]["chrf"], abs=0.05)
        assert int(cells[8]) == len(set(hypotheses))
    assert out[header + 3] == "hypotheses: eval/<split>.hyp"
    assert out[header + 4].startswith("BLEU signature: nrefs:1|")


def test_the_score_table_fits_80_columns(make_config, tmp_path):
    """The longest split name and every number at its widest (5-digit sentence counts,
    100.0 TER): each line of the table the evaluate stage ends with fits 80 columns."""
    cfg = make_config("eval.splits=[val,test_2016_flickr]")
    eval_dir = Path(cfg.paths.eval_dir)
    eval_dir.mkdir(parents=True)
    scores = {"sentences": 10000, "bleu": 100.0, "bleu_lc": 100.0, "bleu_lc_ci": 10.0,
              "chrf": 100.0, "ter": 100.0}  # fmt: skip
    for split in cfg.eval.splits:
        (eval_dir / f"{split}.hyp").write_text("".join(f"{i}\n" for i in range(10000)))
    signature = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.5.1"
    results = {**dict.fromkeys(cfg.eval.splits, scores), "signatures": {"bleu": signature}}
    lines = evaluate.results_table(results, cfg).splitlines()
    assert [line.split()[0] for line in lines[1:3]] == list(cfg.eval.splits)
    assert lines[1].split()[-1] == "10000"  # distinct translations
    assert lines[-2] == f"hypotheses: {eval_dir}/<split>.hyp"
    assert all(len(line) <= 80 for line in lines[:-2]), lines


# --------------------------------------------------------------------------- faults


def write_stage_params(cfg, folder: Path) -> None:
    from omegaconf import OmegaConf

    from pipeline.config import to_dict

    (folder / "params.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(cfg))))


def fast_eval_config(trained, root: Path, eval_dir: Path):
    """One small split, greedy: a stage run of seconds, outputs under `root`, eval_dir given."""
    cfg = eval_config(trained, root, ("splits", ["val"]), ("beam_size", 1), ("average", 1))
    cfg.eval.heatmaps = cfg.eval.samples = 1
    cfg.paths.eval_dir = str(eval_dir)
    return cfg


@pytest.mark.slow
def test_a_full_disk_or_a_read_only_eval_dir_exits_2_naming_the_file_and_keeps_the_output(
    trained_smoke, tmp_path, small_disk
):
    """A real full tmpfs under eval_dir: exit 2 naming eval_dir/model.ckpt (torch.save's own
    error names no file), the previous output intact and no staging folder left; the same
    filesystem remounted read-only: exit 2 naming eval_dir, the output intact."""
    from tests.conftest import snapshot

    eval_dir = small_disk.path / "eval"
    write_stage_params(fast_eval_config(trained_smoke, tmp_path, eval_dir), tmp_path)
    assert run_stage("evaluate", tmp_path).returncode == 0
    before = snapshot(small_disk.path)
    small_disk.fill(free=64 * 1024)
    full = run_stage("evaluate", tmp_path)
    assert full.returncode == 2, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    assert f"error: {eval_dir / 'model.ckpt'}: disk full (no space left on device) while " \
        "writing it; the previous model.ckpt is intact" in full.stderr  # fmt: skip
    (small_disk.path / ".filler").unlink()
    assert snapshot(small_disk.path) == before  # no staging folder, every file as it was

    remount = subprocess.run(["mount", "-o", "remount,ro", str(small_disk.path)],
                             capture_output=True, text=True, timeout=300)  # fmt: skip
    if remount.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only: {remount.stderr.strip()}")
    read_only = run_stage("evaluate", tmp_path)
    assert read_only.returncode == 2, read_only.stderr[-3000:]
    assert "Traceback" not in read_only.stderr
    assert f"error: {eval_dir}: cannot write it: {small_disk.path} is on a read-only file " \
        "system (mounted read-only); the previous eval is intact. Mount " \
        f"{small_disk.path} read-write" in read_only.stderr  # fmt: skip
    assert snapshot(small_disk.path) == before


@pytest.mark.slow
def test_a_killed_evaluate_leaves_staging_that_clean_lists_and_the_next_run_removes(
    trained_smoke, tmp_path
):
    """kill -9 while the stage writes its output folder: `pipeline.clean` lists the staging
    folder it left (also one named as earlier versions named them), and the next run of the
    stage removes both."""
    import os
    import signal
    import time

    eval_dir = tmp_path / "eval"
    write_stage_params(fast_eval_config(trained_smoke, tmp_path, eval_dir), tmp_path)
    stage = subprocess.Popen([sys.executable, "-m", "pipeline.stages.evaluate"], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    prefix = f".eval.tmp-{stage.pid}-"
    deadline = time.monotonic() + 300
    while not any(p.name.startswith(prefix) and (p / "model.ckpt").exists()
                  for p in tmp_path.iterdir()):  # fmt: skip
        assert stage.poll() is None and time.monotonic() < deadline, "it ended before the kill"
        time.sleep(0.01)
    os.kill(stage.pid, signal.SIGKILL)
    stage.wait(timeout=60)
    (staging,) = [p for p in tmp_path.iterdir() if p.name.startswith(prefix)]
    older = tmp_path / ".eval.tmp-k3x9q2ab"  # as a killed earlier version named it
    older.mkdir()
    (older / "model.ckpt").write_bytes(b"\0" * 1000)

    listed = subprocess.run([sys.executable, "-m", "pipeline.clean", "--work-dir",
                             str(tmp_path / "work"), "--results-dir", str(tmp_path / "results")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    for folder in (staging, older):
        (line,) = [line for line in listed.stdout.splitlines() if line.startswith(str(folder))]
        assert f"removable: left by a killed run writing {eval_dir}" in line

    rerun = run_stage("evaluate", tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".eval.")]
    assert (eval_dir / "model.ckpt").is_file()


def test_a_source_longer_than_the_model_reads_is_refused_before_decoding(trained_smoke, tmp_path):
    """A source longer than model.max_positions would be decoded cut short and scored as if the
    model had read it whole: evaluate refuses it naming its split and line, before decoding,
    and writes no output (the translate command cuts and warns instead: its input is free)."""
    cfg = fast_eval_config(trained_smoke, tmp_path, tmp_path / "eval")
    source = with_a_long_source(cfg, tmp_path, "val", 4)
    with pytest.raises(ConfigError) as refused:
        evaluate.run(cfg)
    message = str(refused.value)
    assert message.startswith(
        f"config key 'model.max_positions'={cfg.model.max_positions} is shorter than the data: "
        "split 'val' example 4 has a source of "
    )
    assert f"(line 5 of {source})" in message
    assert not Path(cfg.paths.eval_dir).exists() and not Path(cfg.paths.metrics_dir).exists()


def test_an_eval_dir_holding_the_checkpoints_is_refused_naming_both(trained_smoke, tmp_path):
    """paths.eval_dir set to a folder holding paths.train_dir: replacing it would delete the
    checkpoints it averages. Refused before any output, naming both; nothing is deleted."""
    import shutil

    from tests.conftest import snapshot

    cfg = eval_config(trained_smoke, tmp_path)
    cfg.paths.train_dir = str(tmp_path / "models" / "train")
    shutil.copytree(trained_smoke.paths.train_dir, cfg.paths.train_dir)
    cfg.paths.eval_dir = str(tmp_path / "models")
    before = snapshot(tmp_path / "models")
    with pytest.raises(DataError) as refused:
        evaluate.run(cfg)
    assert str(refused.value).startswith(
        f"{tmp_path / 'models'} holds paths.train_dir {cfg.paths.train_dir}: replacing that "
        "folder would delete it"
    )
    assert snapshot(tmp_path / "models") == before
    assert not (Path(cfg.paths.metrics_dir) / "eval.json").exists()


NOT_CHECKPOINTS = {
    "a tensor": lambda path: torch.save(torch.zeros(3), path),  # was IndexError, "train first"
    "a list": lambda path: torch.save([1, 2], path),
    "other keys": lambda path: torch.save({"weight": torch.zeros(2)}, path),
    "text": lambda path: path.write_text("two dogs are playing in the snow .\n"),
    "no bytes": lambda path: path.write_bytes(b""),
}


@pytest.mark.parametrize("content", NOT_CHECKPOINTS)
def test_a_file_that_is_not_a_checkpoint_is_named_so(tokenized_smoke, tmp_path, content):
    """A file that is there but is no checkpoint: the model loader, the Python API and export
    say so, naming it, instead of a Python error and the advice to train first."""
    from pipeline import export
    from pipeline.translate import Translator

    path = tmp_path / "model.ckpt"
    NOT_CHECKPOINTS[content](path)
    spm = Path(tokenized_smoke.paths.tokenized) / "spm.model"
    out = ["--checkpoint", str(path), "--tokenizer", str(spm), "--out", str(tmp_path / "ct2")]
    for load in (lambda: model_loading.load_model(path), lambda: export.export(out),
                 lambda: Translator.from_checkpoint(path, spm, config=tokenized_smoke)):  # fmt: skip
        with pytest.raises(DataError, match=f"^{re.escape(str(path))}: not a checkpoint") as err:
            load()
        assert "first" not in str(err.value)
