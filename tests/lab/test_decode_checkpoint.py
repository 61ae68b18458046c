"""benchmarks.fairseq.decode_checkpoint: our weights under fairseq's names, our positional
table in fairseq's layout, and (slow, with a fairseq venv built beforehand) the real fairseq
computing our model's logits and scoring its own beam search's hypotheses as our model does."""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU

from benchmarks.common import bench_config
from benchmarks.fairseq import decode_checkpoint, train_peer
from pipeline.model.positional import sinusoid_table
from pipeline.model.transformer import Transformer
from tests.conftest import REPO_ROOT, write_params
from tests.test_decoding import beam_score_tolerance

SPECIAL = {"pad_id": 0, "unk_id": 1, "bos_id": 2, "eos_id": 3}
VOCAB = 50


def tiny_model(*overrides: str, layers: int = 2) -> Transformer:
    args = argparse.Namespace(overrides=["model.dropout=0.0", *overrides], seed=7, d_model=16,
                              layers=layers, heads=2, d_ff=32, vocab=VOCAB)  # fmt: skip
    cfg = bench_config(args)
    torch.manual_seed(0)
    model = Transformer(cfg.model, VOCAB, SPECIAL["pad_id"]).eval()
    model.bench_cfg = cfg  # for the tests that need the config the model was built from
    return model


def fairseq_names(layers: int) -> set[str]:
    """fairseq 0.12 TransformerModel's parameter names, post-norm, shared embeddings (written
    out from fairseq/models/transformer/transformer_{encoder,decoder}.py and
    fairseq/modules/transformer_layer.py)."""
    attention = [f"{p}_proj.{k}" for p in ("q", "k", "v", "out") for k in ("weight", "bias")]
    norm = ("weight", "bias")
    names = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
             "decoder.output_projection.weight"}  # fmt: skip
    for i in range(layers):
        enc, dec = f"encoder.layers.{i}", f"decoder.layers.{i}"
        names |= {f"{enc}.self_attn.{a}" for a in attention}
        names |= {f"{dec}.{m}.{a}" for m in ("self_attn", "encoder_attn") for a in attention}
        for prefix, norms in ((enc, ("self_attn_layer_norm", "final_layer_norm")),
                              (dec, ("self_attn_layer_norm", "encoder_attn_layer_norm",
                                     "final_layer_norm"))):  # fmt: skip
            names |= {f"{prefix}.{n}.{k}" for n in norms for k in norm}
            names |= {f"{prefix}.fc{j}.{k}" for j in (1, 2) for k in norm}
    return names


def test_state_dict_is_ours_under_fairseq_names():
    model = tiny_model()
    converted = decode_checkpoint.fairseq_state_dict(model)
    assert set(converted) == fairseq_names(layers=2)
    embedding = model.src_embed.weight
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                 "decoder.output_projection.weight"):  # fmt: skip
        assert torch.equal(converted[name], embedding)
    for ours, theirs in ((model.encoder_layers[1].self_attn, "encoder.layers.1.self_attn"),
                         (model.decoder_layers[0].cross_attn, "decoder.layers.0.encoder_attn")):  # fmt: skip
        d = ours.in_proj.in_features
        for row, part in enumerate("qkv"):
            rows = slice(row * d, (row + 1) * d)
            assert torch.equal(converted[f"{theirs}.{part}_proj.weight"], ours.in_proj.weight[rows])
            assert torch.equal(converted[f"{theirs}.{part}_proj.bias"], ours.in_proj.bias[rows])
        assert torch.equal(converted[f"{theirs}.out_proj.weight"], ours.out_proj.weight)
    layer = model.decoder_layers[1]
    pairs = {"fc1.weight": layer.ffn.linear1.weight, "fc2.bias": layer.ffn.linear2.bias,
             "encoder_attn_layer_norm.weight": layer.cross_attn_residual.norm.weight,
             "final_layer_norm.bias": layer.ffn_residual.norm.bias}  # fmt: skip
    for name, tensor in pairs.items():
        assert torch.equal(converted[f"decoder.layers.1.{name}"], tensor)


def test_positions_sit_where_fairseq_looks_them_up():
    model = tiny_model()
    pad = 5  # not 0: the offset must follow the pad id
    table = decode_checkpoint.fairseq_positions(model, pad_id=pad)
    ours = sinusoid_table(model.cfg.max_positions, model.cfg.d_model)
    assert table.shape == (pad + 1 + model.cfg.max_positions, model.cfg.d_model)
    assert not table[: pad + 1].any()  # fairseq's pad row (and those below it) are zeros
    assert torch.equal(table[pad + 1 :], ours)  # position p at row pad + 1 + p


def test_the_probe_admits_rounding_and_refuses_another_function_of_the_weights():
    """The probe's bound (float32 rounding over the model's reduction length) holds the same
    logits computed in float64 and refuses logits of a model whose weights differ in one
    feed-forward layer, as a wrong name mapping would give."""
    model = tiny_model()
    generator = torch.Generator().manual_seed(3)
    sources = [[*torch.randint(4, VOCAB, (n,), generator=generator).tolist(), SPECIAL["eos_id"]]
               for n in (9, 3, 6)]  # fmt: skip
    probe = decode_checkpoint.probe_batch(sources, SPECIAL["bos_id"], SPECIAL["pad_id"])
    with torch.no_grad():
        exact = copy.deepcopy(model).double()(probe["src"], probe["tgt_in"]).float()
        other = copy.deepcopy(model)
        other.decoder_layers[0].ffn.linear1.weight.mul_(1.01)
        changed = other(probe["src"], probe["tgt_in"])
    assert decode_checkpoint.probe_difference(model, probe, exact, SPECIAL["pad_id"]) <= 1
    assert decode_checkpoint.probe_difference(model, probe, changed, SPECIAL["pad_id"]) > 1


def test_models_fairseq_cannot_hold_are_refused():
    with pytest.raises(ValueError, match="only sinusoidal"):
        decode_checkpoint.fairseq_positions(tiny_model("model.positional=learned"), pad_id=0)
    with pytest.raises(ValueError, match="tie_embeddings"):
        decode_checkpoint.fairseq_state_dict(tiny_model("model.tie_embeddings=false"))


def test_a_missing_checkpoint_is_named(make_config, tmp_path):
    with pytest.raises(SystemExit, match="--checkpoint .*absent.ckpt: no such file"):
        decode_checkpoint.run_model(make_config(), tmp_path / "absent.ckpt", tmp_path)


def test_left_padding_as_fairseq_pads_sources():
    padded = decode_checkpoint.left_padded([[7, 8, 3], [9, 3]], pad_id=0)
    assert padded.tolist() == [[7, 8, 3], [0, 9, 3]]


@pytest.mark.slow
@pytest.mark.skipif(
    train_peer.built_venv(train_peer.DEFAULT_VENV) is None,
    reason="no fairseq venv (`python -m benchmarks.fairseq.train_peer --build-venv-only`)",
)
def test_fairseq_runs_our_model_and_its_hypotheses_score_alike_in_ours():
    """The real fairseq with our weights: its teacher-forced logits are ours (the worker's
    probe; decode_with_fairseq refuses otherwise), and every hypothesis of its incremental beam
    search, rescored by our model with fairseq's length normalisation, gets fairseq's own
    score: the two compute one function step by step, positions included."""
    model = tiny_model("model.init=fairseq")
    cfg = model.bench_cfg
    generator = torch.Generator().manual_seed(1)
    sources = [[*torch.randint(4, VOCAB, (n,), generator=generator).tolist(), SPECIAL["eos_id"]]
               for n in (9, 3, 6, 12, 1, 7)]  # fmt: skip
    generation = {"beam_size": 3, "length_penalty": 1.0, "batch_size": 4,
                  **decode_checkpoint.FAIRSEQ_GENERATION, "max_len_b": 8}  # fmt: skip
    # refused (SystemExit) where fairseq's probe logits lie beyond float32 rounding of ours
    _, hypotheses, _ = decode_checkpoint.decode_with_fairseq(
        model, cfg, SPECIAL, sources, generation, venv=train_peer.DEFAULT_VENV, threads=1
    )
    assert len(hypotheses) == len(sources)
    eval_cfg = argparse.Namespace(length_penalty=1.0, length_normalization="fairseq",
                                  max_tokens=cfg.eval.max_tokens)  # fmt: skip
    ours = decode_checkpoint.model_scores(model, sources, [h["tokens"] for h in hypotheses],
                                       eval_cfg, SPECIAL["eos_id"], SPECIAL["bos_id"])  # fmt: skip
    for source, hypothesis, (score, _) in zip(sources, hypotheses, ours, strict=True):
        assert 1 <= len(hypothesis["tokens"]) <= 8  # min_len 1, max_len_b 8
        # fairseq's score: the summed log-probability (eos included) / |Y| ** lenpen, as far
        # apart as two float32 evaluations of the model may put it
        tolerance = beam_score_tolerance(model, torch.tensor([source]), hypothesis["tokens"],
                                         eval_cfg.length_penalty, "fairseq")  # fmt: skip
        assert score == pytest.approx(hypothesis["score"], abs=tolerance)


@pytest.mark.slow
@pytest.mark.skipif(
    train_peer.built_venv(train_peer.DEFAULT_VENV) is None,
    reason="no fairseq venv (`python -m benchmarks.fairseq.train_peer --build-venv-only`)",
)
def test_compare_scores_both_searches_from_their_files(trained_smoke, tmp_path):
    """A trained run's checkpoint decoded by both searches: the JSON is what compare returns,
    each search's translations are on disk one per source, and its scores are sacrebleu's of
    that file; identical hypotheses are counted as neither search's win."""
    cfg = copy.deepcopy(trained_smoke)
    cfg.paths.eval_dir = str(tmp_path / "eval")  # no model.ckpt there: averaged as evaluate would
    checkpoint, averaged_from = decode_checkpoint.run_model(cfg, None, tmp_path)
    newest = sorted((Path(cfg.paths.train_dir) / "checkpoints").glob("step-*.ckpt"))
    assert sorted(averaged_from) == sorted(str(p) for p in newest[-cfg.eval.average :])
    out = tmp_path / "decode.json"
    result = decode_checkpoint.compare(cfg, checkpoint, ["val"], out, venv=train_peer.DEFAULT_VENV,
                                    threads=1, extra={"averaged_from": averaged_from})  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert result["averaged_from"] == averaged_from and result["run"]["seed"] == cfg.seed
    assert result["training"]["steps"] == cfg.train.max_steps  # the run's train.json
    entry = result["splits"]["val"]
    references = (Path(cfg.paths.prepared) / "val.de").read_text(encoding="utf-8").splitlines()
    assert entry["sentences"] == len(references)
    for name in decode_checkpoint.SEARCHES:
        path = train_peer.hypotheses_path(out, "val", name)
        hypotheses = path.read_text(encoding="utf-8").split("\n")
        assert len(hypotheses[:-1]) == len(references)  # one line each, then the final newline
        expected = BLEU(lowercase=True).corpus_score(hypotheses[:-1], [references]).score
        assert entry["scores"][name]["bleu_lc"] == pytest.approx(expected)
    wins = entry["model_score"]
    assert entry["identical_hypotheses"] + wins["ours_higher"] + wins["fairseq_higher"] <= len(
        references
    )
    assert 0.0 < entry["paired_bootstrap_bleu_lc"]["p_value"] <= 1.0
    assert 0 <= entry["probe_logit_difference_over_rounding_bound"] <= 1


def test_a_checkpoint_that_would_run_code_is_refused(malicious_checkpoint, tmp_path):
    write_params(tmp_path)  # the command reads ./params.yaml
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.fairseq.decode_checkpoint", "--checkpoint",
         str(malicious_checkpoint.path), "--out", str(tmp_path / "out.json")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert not malicious_checkpoint.marker.exists(), "loading the checkpoint ran its code"
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: {malicious_checkpoint.path}: refused")
    assert not (tmp_path / "out.json").exists()
