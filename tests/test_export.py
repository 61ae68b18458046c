"""`python -m pipeline.export --to ctranslate2`: the exported model is the same model as ours
and translates as ours does (greedy and beam search, random models of every architecture and
the trained smoke model): every hypothesis either search returns gets the same score from both,
and the translations are the same except where the two searches may part (a tie of the float32
arithmetic, or CTranslate2's own rule at the length limit; `assert_exported_translates_as_ours`).
int8 weights load and translate, and what cannot be exported is refused by name.

Our decoding rules that are not CTranslate2 options (GNMT's length penalty, eos at the length
limit, pad/bos never generated) are reproduced by `translate_with_ctranslate2` (see
`pipeline.export`); the smoke model repeats itself until the length limit on nearly every
sentence, so the limit's rule is exercised on every beam-search sentence here. The smoke model
is trained in the test session, so it differs between machines (bf16 rounds differently on
each): nothing here depends on which sentences it translates well."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from pipeline import environment, export
from pipeline.config_schema import ModelConfig
from pipeline.data.prepared import read_prepared
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.errors import ConfigError, DataError
from pipeline.evaluation import beam_decoding, model_loading
from pipeline.evaluation.beam_decoding import hypothesis_log_probs, summed_log_prob
from pipeline.model.length_penalty import length_normalizer
from pipeline.model.transformer import Transformer
from pipeline.rounding import log_prob_tolerance
from tests.conftest import REPO_ROOT, build_once, shared_build, shared_root
from tests.test_tokenizer import moses_tokenized_copy

TINY = dict(d_model=32, heads=2, encoder_layers=2, decoder_layers=2, d_ff=64, max_positions=64)
# Post-norm, sinusoids, tied (the paper; the smoke model too) and everything else at once.
ARCHITECTURES = {
    "paper": dict(norm_first=False, positional="sinusoidal", tie_embeddings=True),
    "prenorm_learned_untied": dict(norm_first=True, positional="learned", tie_embeddings=False),
    # d_k = 12 apart from d_model / h = 16: CTranslate2's head_dim
    "head_dim_apart_from_width": dict(head_dim=12),
}


def run_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipeline.export", "--to", "ctranslate2", *args],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
    )  # fmt: skip


def ours_and_ctranslate2(model, tokenizer, exported, src_ids, eval_cfg):
    """(our evaluate-stage translations, CTranslate2's n-best lists: its best first) of the
    same source ids."""
    ours = beam_decoding.translate_ids(
        model, tokenizer, src_ids, dataclasses.replace(eval_cfg, nbest=1)
    )
    theirs = export.nbest_with_ctranslate2(
        exported, src_ids, beam_size=eval_cfg.beam_size, length_penalty=eval_cfg.length_penalty,
        max_len_a=eval_cfg.max_len_a, max_len_b=eval_cfg.max_len_b,
        length_normalization=eval_cfg.length_normalization,
    )  # fmt: skip
    return ours, theirs


def assert_exported_translates_as_ours(model, tokenizer, exported, src_ids, eval_cfg):
    """Both decoders on `src_ids`: (ours, CTranslate2's best) after checking that they are the
    same model searched the same way.

    Every hypothesis either decoder returns gets the same score from both (our model's log P,
    teacher-forced, within `log_prob_tolerance`). Where the two translations differ, the
    difference is one the searches are allowed: two searches that keep the same candidates
    break a tie of the arithmetic differently, or CTranslate2 applies its own rule at the
    length limit (which k hypotheses it returns, ranked by its own length penalty; see
    pipeline.export). So: our choice is never beaten by CTranslate2's (our search has every
    candidate CTranslate2's has); CTranslate2 dropped ours only where its list holds a
    hypothesis cut at the limit or where its own penalty ranks ours below every one it kept,
    and otherwise both choices tie; greedy search (beam 1)
    parts only on a tie of the next token's log-probs. No count of differing sentences is
    assumed: it depends on the trained model, hence on the machine that trained it."""
    ours, nbest = ours_and_ctranslate2(model, tokenizer, exported, src_ids, eval_cfg)
    assert len(ours) == len(nbest) == len(src_ids)
    theirs = [hypotheses[0] for hypotheses in nbest]
    a_tokens = [t.tokens[0] for t in ours]
    rows = hypothesis_log_probs(model, src_ids, a_tokens, bos_id=tokenizer.bos_id,
                                max_tokens=eval_cfg.max_tokens)  # fmt: skip

    def normalizer(tokens):
        return length_normalizer(len(tokens) + 1, eval_cfg.length_penalty,
                                 eval_cfg.length_normalization)  # fmt: skip

    def ct2_rank(tokens, log_p):  # CTranslate2's own order of finished hypotheses
        return log_p / (len(tokens) + 1) ** eval_cfg.length_penalty

    differing = [i for i, (a, b) in enumerate(zip(a_tokens, theirs)) if a != b.tokens]
    for i, (a, b) in enumerate(zip(ours, theirs)):  # the beam scores are the model's log P
        tolerance = log_prob_tolerance(model, rows[i]) / normalizer(a_tokens[i])
        model_score = summed_log_prob(rows[i], a_tokens[i], tokenizer.eos_id)
        assert a.scores[0] == pytest.approx(model_score / normalizer(a_tokens[i]),
                                            abs=tolerance), f"#{i}: our beam score"  # fmt: skip
        if i not in differing:
            assert b.score == pytest.approx(a.scores[0], abs=tolerance), f"#{i}: scores differ"

    if not differing:
        return ours, theirs
    b_tokens = [theirs[i].tokens for i in differing]
    b_rows = hypothesis_log_probs(model, [src_ids[i] for i in differing], b_tokens,
                                  bos_id=tokenizer.bos_id, max_tokens=eval_cfg.max_tokens)  # fmt: skip
    ct2_a = export.score_with_ctranslate2(exported, [src_ids[i] for i in differing],
                                          [a_tokens[i] for i in differing])  # fmt: skip
    ct2_b = export.score_with_ctranslate2(exported, [src_ids[i] for i in differing], b_tokens)
    limit = model.cfg.max_positions
    for n, i in enumerate(differing):
        a, b = a_tokens[i], b_tokens[n]
        tolerance_a = log_prob_tolerance(model, rows[i])
        tolerance_b = log_prob_tolerance(model, b_rows[n])
        log_p_a = summed_log_prob(rows[i], a, tokenizer.eos_id)
        log_p_b = summed_log_prob(b_rows[n], b, tokenizer.eos_id)
        # The same model: each side's hypothesis scored alike by both.
        assert sum(ct2_a[n]) == pytest.approx(log_p_a, abs=tolerance_a), f"#{i}: ours' scored"
        assert sum(ct2_b[n]) == pytest.approx(log_p_b, abs=tolerance_b), f"#{i}: theirs scored"
        assert theirs[i].score == pytest.approx(log_p_b / normalizer(b),
                                                abs=tolerance_b / normalizer(b))  # fmt: skip
        tie = tolerance_a / normalizer(a) + tolerance_b / normalizer(b)
        score_a, score_b = log_p_a / normalizer(a), log_p_b / normalizer(b)
        if eval_cfg.beam_size == 1:  # greedy: the first token where they part is a tie
            t = next(t for t, (x, y) in enumerate(zip([*a, -1], [*b, -1])) if x != y)
            x, y = (tokenizer.eos_id if t == len(h) else h[t] for h in (a, b))
            per_token = 2 * log_prob_tolerance(model, rows[i][t : t + 1])  # two decoders apart
            assert abs(float(rows[i][t, x] - rows[i][t, y])) <= per_token, f"#{i}: greedy"
            continue
        assert score_b <= score_a + tie, f"#{i}: CTranslate2 found a better translation"
        max_len = export.max_output_length(min(len(src_ids[i]), limit), eval_cfg.max_len_a,
                                           eval_cfg.max_len_b, limit)  # fmt: skip
        if a in [h.tokens for h in nbest[i]]:  # ranked below theirs by the same scores: a tie
            assert score_a - score_b <= tie, f"#{i}: CTranslate2 ranked ours lower"
        else:  # its own penalty dropped ours, or the searches parted on a tie
            at_limit = any(len(h.tokens) == max_len for h in nbest[i])
            # Of up to 2k - 1 finished, CTranslate2 keeps the k best by log P / |Y| ** alpha:
            # ours dropped so ranks below all k it kept, by that rule.
            ranked_out = len(nbest[i]) == eval_cfg.beam_size and all(
                ct2_rank(a, log_p_a) <= ct2_rank(h.tokens, h.score * normalizer(h.tokens)) + tie
                for h in nbest[i]
            )
            assert at_limit or ranked_out or score_a - score_b <= tie, (
                f"#{i}: CTranslate2 lost our translation, though below the length limit and "
                "ranked above one it kept by its own penalty"
            )
    return ours, theirs


# --------------------------------------------------------------------------- random models


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_random_models_of_every_architecture_translate_as_ours(
    architecture, tokenized_smoke, tmp_path
):
    """Untrained weights (every sentence runs to the length limit); the other architectures
    also read a source eos (data.tokenizer.source_eos), which CTranslate2 adds itself."""
    source_eos = architecture != "paper"
    tokenizer = Tokenizer.load(Path(tokenized_smoke.paths.tokenized) / MODEL_FILE, source_eos)
    torch.manual_seed(0)
    cfg = ModelConfig(**TINY, **ARCHITECTURES[architecture])
    model = Transformer(cfg, tokenizer.vocab_size, tokenizer.pad_id).eval()
    # pad and bos are never targets: training leaves them no probability. Zero logits here,
    # mid-field among random ones: our search bans them, CTranslate2 cannot without
    # renormalising the other tokens' probabilities (see pipeline.export).
    model.output_projection.weight.data[[tokenizer.pad_id, tokenizer.bos_id]] = 0.0
    out = export.export_ctranslate2(model, tokenizer, tmp_path / "ct2")
    exported = export.load_exported(out)

    val = read_prepared(tokenized_smoke, ["val"])["val"].src[:40]
    src_ids = tokenizer.encode_sources(val)
    assert all(ids[-1] == tokenizer.eos_id for ids in src_ids) == source_eos
    for beam, alpha, normalization in ((1, 1.0, "gnmt"), (3, 0.6, "gnmt"), (4, 0.0, "gnmt"),
                                       (3, 1.0, "fairseq")):  # fmt: skip
        eval_cfg = dataclasses.replace(tokenized_smoke.eval, beam_size=beam, length_penalty=alpha,
                                       length_normalization=normalization)  # fmt: skip
        assert_exported_translates_as_ours(model, tokenizer, exported, src_ids, eval_cfg)


@pytest.mark.parametrize("model_type", ["bpe", "subword_nmt"])
def test_a_moses_pretokenized_model_is_exported_with_its_pretokenization(
    tokenized_smoke, tmp_path, model_type
):
    """Wu et al.'s preprocessing (data.tokenizer.pretokenizer: moses, subword-nmt's merges)
    travels with the export: recorded in export.json and beside the folder's spm.model, so the
    loaded folder reads raw sources and writes plain text as our decoding does; a folder whose
    record was lost is refused."""
    cfg = moses_tokenized_copy(tokenized_smoke, tmp_path, model_type=model_type)
    tokenizer = Tokenizer.for_data(Path(cfg.paths.tokenized) / MODEL_FILE, cfg.data)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**TINY), tokenizer.vocab_size, tokenizer.pad_id).eval()
    model.output_projection.weight.data[[tokenizer.pad_id, tokenizer.bos_id]] = 0.0
    out = export.export_ctranslate2(model, tokenizer, tmp_path / "ct2")
    info = json.loads((out / export.EXPORT_INFO).read_text())
    record = {"method": "moses", "lowercase": True, "src_lang": "en", "tgt_lang": "de"}
    assert info["pretokenizer"] == record and info["source_eos"] is True
    assert json.loads((out / "spm.pretokenizer.json").read_text()) == record

    exported = export.load_exported(out)
    assert exported.tokenizer.pretokenizer == tokenizer.pretokenizer
    if model_type == "subword_nmt":
        assert exported.tokenizer.subwords.codes == tokenizer.subwords.codes
        assert (out / "spm.bpe-codes").read_text() == tokenizer.subwords.codes
    val = read_prepared(cfg, ["val"])["val"].src[:20]
    src_ids = exported.tokenizer.encode_sources(val)
    assert src_ids == tokenizer.encode_sources(val)  # raw text in, Moses-tokenized inside
    ours, theirs = assert_exported_translates_as_ours(model, tokenizer, exported, src_ids, cfg.eval)
    assert [exported.tokenizer.decode(h.tokens) for h in theirs] == [t.best for t in ours]

    (out / "spm.pretokenizer.json").unlink()
    with pytest.raises(DataError, match=r"spm\.pretokenizer\.json: .*export\.json records"):
        export.load_exported(out)


def test_head_dim_is_written_where_the_config_sets_it(tokenized_smoke):
    """The default model's spec is CTranslate2's own (d_k = d_model / h); model.head_dim sets
    every attention's head_dim, cross-attention's W^Q and [W^K; W^V] split at h d_k."""
    tokenizer = Tokenizer.load(Path(tokenized_smoke.paths.tokenized) / MODEL_FILE)
    for head_dim, written in ((None, None), (16, 16), (12, 12)):
        model = Transformer(ModelConfig(**TINY, head_dim=head_dim), tokenizer.vocab_size,
                            tokenizer.pad_id).eval()  # fmt: skip
        spec = export.transformer_spec(model, tokenizer)
        layer = spec.decoder.layer[0]
        for attention in (spec.encoder.layer[0].self_attention, layer.self_attention,
                          layer.attention):  # fmt: skip
            assert getattr(attention, "head_dim", None) == written
        inner = TINY["heads"] * (head_dim or TINY["d_model"] // TINY["heads"])
        assert layer.attention.linear[0].weight.shape == (inner, TINY["d_model"])
        assert layer.attention.linear[1].weight.shape == (2 * inner, TINY["d_model"])


# --------------------------------------------------------------------------- bad input


def test_models_ctranslate2_cannot_express_are_refused_by_name(tokenized_smoke, tmp_path):
    tokenizer = Tokenizer.load(Path(tokenized_smoke.paths.tokenized) / MODEL_FILE)
    out = tmp_path / "ct2"

    def tiny_model(vocab_size: int = tokenizer.vocab_size) -> Transformer:
        return Transformer(ModelConfig(**TINY), vocab_size, tokenizer.pad_id).eval()

    model = tiny_model()
    model.decoder_layers[1].ffn_residual.norm.eps = 1e-6
    with pytest.raises(ConfigError, match=r"LayerNorm epsilons differ.*decoder_layers\.1\.ffn_"):
        export.export_ctranslate2(model, tokenizer, out)

    model = tiny_model()
    model.encoder_layers[0].register_parameter("gate", nn.Parameter(torch.ones(4)))
    with pytest.raises(ConfigError, match=r"\['encoder_layers\.0\.gate'\] have no counterpart"):
        export.export_ctranslate2(model, tokenizer, out)

    model = tiny_model()
    model.encoder_layers[0].ffn.linear1.bias = None
    with pytest.raises(ConfigError, match=r"no weight 'encoder_layers\.0\.ffn\.linear1\.bias'"):
        export.export_ctranslate2(model, tokenizer, out)

    with pytest.raises(DataError, match="vocabulary of 1000 pieces but the model has 1200"):
        export.export_ctranslate2(tiny_model(1200), tokenizer, out)
    assert not out.exists()


def test_bad_arguments_are_refused_naming_them_before_any_work(tokenized_smoke, tmp_path):
    spm = Path(tokenized_smoke.paths.tokenized) / MODEL_FILE
    out, absent = tmp_path / "ct2", tmp_path / "absent.ckpt"
    not_a_model = tmp_path / "model.ckpt"
    not_a_model.write_bytes(b"not a checkpoint")
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")

    cases = [
        (["--checkpoint", absent, "--tokenizer", spm, "--out", out],
         f"checkpoint {absent} not found"),
        (["--checkpoint", not_a_model, "--tokenizer", tmp_path / "x.model", "--out", out],
         f"tokenizer {tmp_path / 'x.model'} not found"),
        (["--checkpoint", not_a_model, "--tokenizer", spm, "--out", out, "--quantization", "int3"],
         "--quantization int3: CTranslate2"),
        (["--checkpoint", not_a_model, "--tokenizer", spm, "--out", full],
         f"--out {full} exists and is not an empty folder; --force replaces it"),
        (["--checkpoint", not_a_model, "--tokenizer", spm, "--out", out],
         f"{not_a_model}: not a checkpoint (torch.save writes a zip archive; this file is "
         "not one)"),
    ]  # fmt: skip
    for args, message in cases:
        with pytest.raises((DataError, ConfigError), match=re.escape(message)):
            export.export([str(arg) for arg in args])
    assert not out.exists() and [p.name for p in full.iterdir()] == ["keep.txt"]

    # The command line says it without a traceback, exit status 2.
    result = run_export("--checkpoint", str(absent), "--tokenizer", str(spm), "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: checkpoint {absent} not found")


@pytest.mark.slow
def test_force_refuses_an_out_folder_that_holds_an_input_or_a_stage_output(trained_smoke, tmp_path):
    """`--out models --force` in a workspace would replace the folder that holds the checkpoint
    it reads (and the train stage's output): exit 2 naming both, every file kept; so too an
    --out inside a stage's output."""
    import shutil

    from tests.conftest import snapshot, write_params

    workspace = tmp_path / "workspace"
    workspace.mkdir()
    write_params(workspace)
    shutil.copytree(trained_smoke.paths.train_dir, workspace / "models" / "train")
    shutil.copytree(trained_smoke.paths.tokenized, workspace / "data" / "tokenized")
    before = snapshot(workspace)
    checkpoint, spm = "models/train/checkpoints/last.ckpt", f"data/tokenized/{MODEL_FILE}"

    def run(out: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "pipeline.export", "--checkpoint", checkpoint, "--tokenizer",
             spm, "--out", out, "--force"],
            capture_output=True, text=True, cwd=workspace, timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        )  # fmt: skip

    refused = {
        "models": f"--out models holds --checkpoint {checkpoint}: replacing that folder would "
        "delete it",
        "data": f"--out data holds --tokenizer {spm}: replacing that folder would delete it",
        "plots/ct2": "--out plots/ct2 lies inside paths.plots_dir plots: replacing it would change "
        "that output",
        ".": f"--out . holds --checkpoint {checkpoint}",
    }
    for out, message in refused.items():
        result = run(out)
        assert result.returncode == 2, result.stderr[-2000:]
        assert result.stderr.startswith(f"error: {message}") and "Traceback" not in result.stderr
        assert snapshot(workspace) == before
    assert run("exported/ct2").returncode == 0  # a folder of its own is written
    assert (workspace / "exported/ct2/model.bin").is_file()


def test_a_checkpoint_that_would_run_code_is_refused(malicious_checkpoint, tmp_path):
    spm, out = tmp_path / "spm.model", tmp_path / "ct2"
    spm.write_bytes(b"not read: the checkpoint is refused first")
    result = run_export("--checkpoint", str(malicious_checkpoint.path), "--tokenizer", str(spm),
                        "--out", str(out))  # fmt: skip
    assert not malicious_checkpoint.marker.exists(), "loading the checkpoint ran its code"
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"error: {malicious_checkpoint.path}: refused")
    assert not out.exists()


# --------------------------------------------------------------------------- the smoke model


@pytest.fixture(scope="module")
@shared_build
def smoke_export(trained_smoke, tmp_path_factory) -> SimpleNamespace:
    """The smoke run's averaged model.ckpt (as the evaluate stage writes it), exported by the
    command line with float32 and with int8 weights."""
    root = shared_root(tmp_path_factory) / "smoke_export"
    checkpoint = root / "model.ckpt"
    spm = model_loading.tokenizer_path(trained_smoke)
    folders = {quantization: root / quantization for quantization in ("float32", "int8")}

    def build() -> None:
        model_loading.write_model_checkpoint(
            model_loading.source_checkpoints(trained_smoke), checkpoint
        )
        for quantization, folder in folders.items():
            result = run_export("--checkpoint", str(checkpoint), "--tokenizer", str(spm),
                                "--out", str(folder), "--quantization", quantization)  # fmt: skip
            assert result.returncode == 0, result.stderr

    build_once(root, build)
    return SimpleNamespace(checkpoint=checkpoint, tokenizer=spm, **folders)


@pytest.mark.slow
def test_exported_smoke_model_greedy_and_beam_match_ours(trained_smoke, smoke_export):
    folder = smoke_export.float32
    assert {p.name for p in folder.iterdir()} == {
        "model.bin", "config.json", "shared_vocabulary.json", MODEL_FILE, export.EXPORT_INFO
    }  # fmt: skip
    info = json.loads((folder / export.EXPORT_INFO).read_text())
    assert info["checkpoint"] == str(smoke_export.checkpoint) and info["source_eos"] is False
    assert info["max_positions"] == trained_smoke.model.max_positions
    vocabulary = json.loads((folder / "shared_vocabulary.json").read_text())
    tokenizer = Tokenizer.load(smoke_export.tokenizer)
    assert vocabulary == [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]

    model = model_loading.load_model(smoke_export.checkpoint)
    exported = export.load_exported(folder)
    for corpus in read_prepared(trained_smoke, ["val", "test_2016_flickr"]).values():
        src_ids = tokenizer.encode_sources(corpus.src)
        for beam in (1, 5):
            eval_cfg = dataclasses.replace(trained_smoke.eval, beam_size=beam)
            assert_exported_translates_as_ours(model, tokenizer, exported, src_ids, eval_cfg)


@pytest.mark.slow
def test_int8_export_loads_and_translates(trained_smoke, smoke_export):
    int8, float32 = smoke_export.int8 / "model.bin", smoke_export.float32 / "model.bin"
    assert int8.stat().st_size < 0.5 * float32.stat().st_size  # 1-byte weights
    exported = export.load_exported(smoke_export.int8)
    tokenizer = exported.tokenizer
    val = read_prepared(trained_smoke, ["val"])["val"].src
    translations = export.translate_with_ctranslate2(
        exported, tokenizer.encode_sources(val), beam_size=5, length_penalty=1.0,
        max_len_a=trained_smoke.eval.max_len_a, max_len_b=trained_smoke.eval.max_len_b,
    )  # fmt: skip
    assert len(translations) == len(val)
    special = {tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id}
    for hypothesis in translations:
        assert hypothesis.tokens and not special & set(hypothesis.tokens)
        assert tokenizer.decode(hypothesis.tokens).strip()


@pytest.mark.slow
@pytest.mark.lab  # the lab's benchmark, here for the trained smoke model this module shares
def test_export_quality_compares_float32_and_int8_with_ours(trained_smoke, smoke_export, capsys):
    """benchmarks/export_quality (the int8-vs-float BLEU check of a recipe model) on the
    smoke model: the float32 export scores exactly as ours."""
    from omegaconf import OmegaConf

    from benchmarks import export_quality
    from pipeline.config import to_dict

    params = smoke_export.checkpoint.parent / "params.yaml"
    params.write_text(OmegaConf.to_yaml(OmegaConf.create(to_dict(trained_smoke))))
    payload = export_quality.main([
        "--params", str(params), "--checkpoint", str(smoke_export.checkpoint),
        "--sentences", "100",
    ])  # fmt: skip
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sentences"] == 100
    ours, float32 = payload["results"]["ours"], payload["results"]["ctranslate2_float32"]
    assert float32["same_as_ours"] == ours["same_as_ours"] == 100
    assert float32["bleu"] == ours["bleu"] and float32["chrf"] == ours["chrf"]
    int8 = payload["results"]["ctranslate2_int8"]
    assert payload["drop_vs_float32"]["bleu"] == pytest.approx(float32["bleu"] - int8["bleu"])
    assert payload["within_max_drop"] == (max(payload["drop_vs_float32"].values()) <= 0.5)
    assert payload["provenance"]["hardware"] == environment.hardware()
    assert payload["env"]["threads"] == torch.get_num_threads()


def test_readme_and_the_evaluation_page_quote_the_recipe_models_export_record():
    """What README and docs/evaluation.md say of the recipe model's CTranslate2 export is its
    committed `benchmarks.export_quality` record: translations equal to ours, BLEU, speed."""
    record = json.loads(
        (REPO_ROOT / "results/multi30k_tiny_amx.en-de/export_quality.json").read_text()
    )
    systems = record["results"]
    float32, int8 = systems["ctranslate2_float32"], systems["ctranslate2_int8"]
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    assert (
        f"(float32: {float32['same_as_ours']} of the recipe model's {record['sentences']} "
        "test2016 translations the same as ours)"
    ) in readme
    assert record["within_max_drop"]
    page = (REPO_ROOT / "docs/evaluation.md").read_text()
    names = {"ours": "ours", "ctranslate2_float32": "CTranslate2 float32",
             "ctranslate2_int8": "CTranslate2 int8"}  # fmt: skip
    for key, name in names.items():
        s = systems[key]
        assert (
            f"| {name} | {s['bleu']:.1f} | {s['bleu_lc']:.1f} | {s['chrf']:.1f} "
            f"| {s['same_as_ours']} | {s['sentences_per_s']:.0f} |"
        ) in page
    changed = record["sentences"] - int8["same_as_ours"]
    # both sentences say "above": int8 scored higher than float32, cased and lowercased
    assert int8["bleu"] > float32["bleu"] and int8["bleu_lc"] > float32["bleu_lc"]
    assert (
        f"int8 changes {changed} of the {record['sentences']} translations and scored "
        f"{int8['bleu'] - float32['bleu']:.1f} BLEU above float32 on this one model"
    ) in " ".join(page.split())
    assert (
        f"int8 scored {int8['bleu_lc'] - float32['bleu_lc']:.2f} BLEU (lc) above float32 on this "
        "one model"
    ) in readme


def test_the_readmes_export_folder_is_not_tracked_by_git():
    """README exports to exported/: a model to ship, never a file `git add -A` picks up."""
    for path in ("exported/ct2/model.bin", "exported/ct2/shared_vocabulary.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO_ROOT, timeout=300)
        assert ignored.returncode == 0, path
