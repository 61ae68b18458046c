"""The benchmark scripts run end to end at tiny sizes (one timed round) on the real smoke-tokenized
corpus and print a JSON line with the expected keys; the pieces their numbers rest on (FLOP
count, equal decoding work, padding accounting) are checked against independent references."""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import ttest_ind
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import batching, common, decode_throughput, train_throughput
from benchmarks.common import marian_model, tokenized_corpus
from pipeline import environment
from pipeline.config_schema import ModelConfig
from pipeline.data.tokenized import load_tokenized
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.evaluation.beam_decoding import pad_batch
from pipeline.evaluation.seed_stats import ALPHA
from pipeline.model.decoding import beam_search
from pipeline.model.transformer import Transformer
from tests.conftest import NUMBER_WORDS

TINY_MODEL = ["--d-model", "32", "--layers", "1", "--heads", "2", "--d-ff", "64"]
ONE_ROUND = ["--repeats", "1", "--warmup", "0", "--device", "cpu"]
TOKENS = {"pad_id": 0, "bos_id": 2, "eos_id": 3}


def last_json_line(capsys) -> dict:
    lines = capsys.readouterr().out.strip().splitlines()
    return json.loads(lines[-1])


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_train_throughput_end_to_end(tokenized_smoke, capsys, tmp_path):
    """Every system by default; fairseq, whose venv is absent here, is skipped with the
    command that builds it, and the others are timed."""
    absent = tmp_path / "no-fairseq-venv"
    argv = [
        "--tokenized", tokenized_smoke.paths.tokenized, *TINY_MODEL, *ONE_ROUND,
        "--target-tokens", "300", "--peak-size", "256", "--dtype", "float32",
        "--fairseq-venv", str(absent),
    ]  # fmt: skip
    returned = train_throughput.main(argv)
    captured = capsys.readouterr()
    printed = json.loads(captured.out.strip().splitlines()[-1])
    assert printed == json.loads(json.dumps(returned, sort_keys=True))
    reason = printed["skipped"]["fairseq"]
    assert str(absent) in reason
    assert f"`{train_throughput.BUILD_FAIRSEQ} --venv {absent}`" in reason
    assert f"note: fairseq skipped: {reason}" in captured.err.splitlines()
    assert set(printed["parameters"]) == {"ours"}
    assert printed["benchmark"] == "train_throughput"
    assert printed["model"]["d_model"] == 32 and printed["model"]["vocab"] == 1000
    batch = printed["batch"]
    assert 150 <= batch["tgt_tokens"] <= 600  # about --target-tokens
    result = printed["results"]["float32"]
    assert set(result["tgt_tokens_per_s"]) == {"ours", "torch", "marian"}
    assert set(result["ratio"]) == {"torch", "marian"}
    for name, per_s in result["tgt_tokens_per_s"].items():
        assert positive(per_s)
        assert per_s == pytest.approx(batch["tgt_tokens"] / (result["step_ms"][name] / 1000))
    assert result["ratio"]["torch"] == pytest.approx(
        result["tgt_tokens_per_s"]["ours"] / result["tgt_tokens_per_s"]["torch"]
    )
    assert positive(result["matmul_peak_flops_per_s"])
    assert result["fraction_of_matmul_peak"] == pytest.approx(
        result["achieved_flops_per_s"] / result["matmul_peak_flops_per_s"]
    )


def test_a_peer_package_not_in_the_environment_is_taken_from_the_peers_folder(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(environment, "PEERS_DIR", tmp_path / "no-peers")
    with pytest.raises(ModuleNotFoundError, match=r"peer_in_the_folder.*make setup"):
        common.peer_package("peer_in_the_folder")
    assert str(tmp_path / "no-peers") not in sys.path

    peers = tmp_path / "peers"
    (peers / "peer_in_the_folder").mkdir(parents=True)
    (peers / "peer_in_the_folder" / "__init__.py").write_text("NAME = 'peer'\n")
    monkeypatch.setattr(environment, "PEERS_DIR", peers)
    monkeypatch.delitem(sys.modules, "peer_in_the_folder", raising=False)
    assert common.peer_package("peer_in_the_folder").NAME == "peer"
    assert sys.path[-1] == str(peers)  # after the environment's own: its packages win
    monkeypatch.delitem(sys.modules, "peer_in_the_folder")


def test_training_flops_match_torch_flop_counter():
    """The analytic count equals what torch's FlopCounterMode sees in one forward + backward
    of our model (matmuls, attention incl. its backward), to within a few percent."""
    cfg = ModelConfig(d_model=64, heads=4, encoder_layers=2, decoder_layers=2, d_ff=128,
                      dropout=0.0)  # fmt: skip
    model = Transformer(cfg, vocab_size=500, pad_id=0)
    src = torch.randint(4, 500, (6, 11))
    tgt_in = torch.randint(4, 500, (6, 9))
    with FlopCounterMode(display=False) as counter:
        model(src, tgt_in).sum().backward()
    expected = train_throughput.training_flops(cfg, 500, batch=6, src_len=11, tgt_len=9)
    # A count of operations, not float arithmetic: the formula's approximation (see its module).
    assert counter.get_total_flops() == pytest.approx(expected, rel=0.05)


def test_decode_throughput_end_to_end(tokenized_smoke, capsys):
    argv = [
        "--tokenized", tokenized_smoke.paths.tokenized, *TINY_MODEL, *ONE_ROUND,
        "--sentences", "12", "eval.beam_size=2", "eval.max_len_b=3", "eval.max_tokens=64",
    ]  # fmt: skip
    decode_throughput.main(argv)
    printed = last_json_line(capsys)
    assert printed["benchmark"] == "decode_throughput"
    assert printed["sentences"] == 12 and printed["beam_size"] == 2
    assert printed["batches"] >= 2  # eval.max_tokens=64 splits 12 sentences
    # the record names the machine, code and lock the figures come from
    assert printed["provenance"]["hardware"] == environment.hardware()
    assert printed["provenance"]["commit"] == environment.code_commit()
    assert printed["env"]["threads"] == torch.get_num_threads()
    result = printed["results"]["float32"]
    assert set(result["sentences_per_s"]) == set(decode_throughput.SYSTEMS)
    assert set(decode_throughput.SYSTEMS) >= {"cached", "uncached", "marian", "ctranslate2"}
    assert all(positive(v) for v in result["sentences_per_s"].values())
    for name in set(decode_throughput.SYSTEMS) - {"cached"}:
        assert result["ratio"][f"cached_vs_{name}"] == pytest.approx(
            result["sentences_per_s"]["cached"] / result["sentences_per_s"][name]
        )
    # The step count follows the length rule on each batch's longest source.
    test = load_tokenized(tokenized_smoke.paths.tokenized)["test_2016_flickr"]
    assert printed["decoder_steps"] >= 2 * (int(1.2 * min(test["src_len"])) + 3 + 1)


def test_every_system_decodes_the_same_number_of_steps():
    """Untrained weights, eos banned until the limit: our beam search (cached and not) returns
    hypotheses of exactly L tokens, and Marian's generate L + 1 tokens after its start token,
    so each system runs L + 1 decoder steps."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, heads=2, encoder_layers=1, decoder_layers=1, d_ff=64)
    vocab, steps = 50, 7
    ours = decode_throughput.EosBanned(Transformer(cfg, vocab, 0), eos_id=3).eval()
    src = pad_batch([[5, 6, 7, 8], [9, 10]], pad_id=0)
    for use_cache in (True, False):
        hypotheses = beam_search(ours, src, bos_id=2, eos_id=3, beam_size=3, length_penalty=1.0,
                                 max_len_a=0.0, max_len_b=steps, use_cache=use_cache)  # fmt: skip
        assert [len(h[0].tokens) for h in hypotheses] == [steps, steps]
    marian = marian_model(cfg, vocab, TOKENS).eval()
    out = marian.generate(input_ids=src, attention_mask=src.ne(0), num_beams=3,
                          max_new_tokens=steps + 1, min_new_tokens=steps + 1)  # fmt: skip
    assert out.shape == (2, steps + 2) and not out[:, 1:].eq(3).any()


def test_ctranslate2_decodes_the_same_number_of_steps(tokenized_smoke, tmp_path):
    """The exported model with eos disabled until its last step (min = max decoding length
    = L + 1) returns hypotheses of L + 1 tokens: L + 1 decoder steps, as ours and Marian."""
    from pipeline.export import export_ctranslate2, load_exported

    tokenizer, steps = Tokenizer.load(Path(tokenized_smoke.paths.tokenized) / MODEL_FILE), 7
    cfg = ModelConfig(d_model=32, heads=2, encoder_layers=1, decoder_layers=1, d_ff=64)
    model = Transformer(cfg, tokenizer.vocab_size, tokenizer.pad_id).eval()
    exported = load_exported(
        export_ctranslate2(model, tokenizer, tmp_path / "ct2", quantization="int8")
    )
    rows = [[tokenizer.piece(t) for t in ids] for ids in ([5, 6, 7, 8], [9, 10])]
    results = exported.translator.translate_batch(
        rows, beam_size=3, min_decoding_length=steps + 1, max_decoding_length=steps + 1,
        return_end_token=True,
    )  # fmt: skip
    assert [len(r.hypotheses[0]) for r in results] == [steps + 1, steps + 1]
    assert all(tokenizer.piece(tokenizer.eos_id) not in r.hypotheses[0] for r in results)


def test_batching_end_to_end(tokenized_smoke, capsys):
    batching.main(["--tokenized", tokenized_smoke.paths.tokenized, "--max-tokens", "1024"])
    printed = last_json_line(capsys)
    assert printed["benchmark"] == "batching"
    token, fixed = printed["results"]["token_batching"], printed["results"]["fixed_size_random"]
    examples = printed["examples"]
    for stats in (token, fixed):
        assert stats["sentences_per_batch"] * stats["batches"] == pytest.approx(examples)
    assert token["max_padded_tokens"] <= 1024
    assert token["padding_fraction"] < fixed["padding_fraction"]


def test_padding_accounting_matches_padded_tensors(tokenized_smoke):
    """batch_stats' padding equals the pad positions of the tensors a batch really becomes
    (src padded; tgt_in = bos + y padded)."""
    train = load_tokenized(tokenized_smoke.paths.tokenized)["train"]
    src_lens, tgt_lens = np.asarray(train["src_len"]), np.asarray(train["tgt_len"])
    batches = batching.fixed_size_batches(len(train), 37, seed=1)[:5]
    pads = positions = 0
    targets = []
    for batch in batches:
        rows = train.select(batch)
        src = pad_batch(rows["src_ids"], 0)
        tgt_in = pad_batch([[2, *row] for row in rows["tgt_ids"]], 0)
        pads += int(src.eq(0).sum() + tgt_in.eq(0).sum())
        positions += src.numel() + tgt_in.numel()
        targets.append(int(tgt_in.ne(0).sum()))  # one per target token the loss sees
    stats = batching.batch_stats(batches, src_lens, tgt_lens)
    assert stats["padding_fraction"] == pytest.approx(pads / positions)
    assert stats["target_tokens_per_batch"] == pytest.approx(np.mean(targets))
    assert stats["target_tokens_per_batch_std"] == pytest.approx(np.std(targets))


def test_default_tokenized_folder_is_used_only_with_the_asked_vocabulary(tokenized_smoke, capsys):
    """`paths.tokenized` (e.g. the default experiment's 10000) is not silently benchmarked for
    `--vocab 8000`: a folder of another size is re-tokenized; an explicit --tokenized is kept."""
    cfg = copy.deepcopy(tokenized_smoke)
    vocab = cfg.data.tokenizer.vocab_size
    with tokenized_corpus(cfg, None) as (tokenizer, _):
        assert tokenizer.vocab_size == vocab
    assert "tokenizing" not in capsys.readouterr().err

    cfg.data.tokenizer.vocab_size = vocab + 200
    with tokenized_corpus(cfg, None) as (tokenizer, splits):
        assert tokenizer.vocab_size == vocab + 200
        assert max(max(ids) for ids in splits["train"]["src_ids"]) < vocab + 200
    err = capsys.readouterr().err
    assert f"holds a vocabulary of {vocab}, not {vocab + 200}" in err and "tokenizing" in err

    with tokenized_corpus(cfg, tokenized_smoke.paths.tokenized) as (tokenizer, _):
        assert tokenizer.vocab_size == vocab


@pytest.mark.parametrize(
    ("device", "precision", "expected", "absent"),
    [
        ("cpu", train_throughput.FAIRSEQ_FLOAT32, ["--cpu"], ["--fp16", "--amp", "--bf16"]),
        ("cuda", "fairseq_float32", [], ["--cpu", "--fp16", "--amp", "--bf16"]),
        ("cuda", "fairseq_fp16", ["--fp16"], ["--cpu", "--amp", "--bf16"]),
        ("cuda", "fairseq_amp", ["--amp"], ["--cpu", "--fp16", "--bf16"]),
    ],
)
def test_fairseq_flags_name_the_device_and_precision(make_config, device, precision, expected,
                                                     absent):  # fmt: skip
    flags = train_throughput.fairseq_flags(make_config("model=tiny"), device, precision)
    assert all(flag in flags for flag in expected)
    assert not any(flag in flags for flag in absent)
    assert flags[flags.index("--encoder-embed-dim") + 1] == "128"


def test_benchmark_figures_page_states_the_recorded_decode_ratios_before_and_after_the_seam():
    """The decoding ratios docs/lab-benchmarks.md quotes for the speed-path move are the means of
    the committed runs' ratios, and each side holds the same number of runs."""
    root = Path(__file__).resolve().parents[2]
    record = json.loads(
        (root / "benchmarks/results/decode_throughput_speed_path_seam.json").read_text()
    )
    page = " ".join((root / "docs/lab-benchmarks.md").read_text().split())
    runs = record["runs"]
    assert len(runs["before"]) == len(runs["after"]) >= 3
    assert f"{NUMBER_WORDS[len(runs['before'])]} interleaved runs a side" in page
    spread, welch_p = {}, {}
    for dtype in ("float32", "bfloat16"):
        ratios = [
            [r["results"][dtype]["ratio"]["cached_vs_marian"] for r in runs[side]]
            for side in ("before", "after")
        ]
        means = [np.mean(side) for side in ratios]
        assert f"{means[0]:.2f} -> {means[1]:.2f}" in page, dtype
        spread[dtype] = max(max(side) - min(side) for side in ratios)
        welch_p[dtype] = ttest_ind(*ratios, equal_var=False).pvalue
    assert min(welch_p.values()) > ALPHA, "the page says the runs cannot tell a change"
    assert (
        f"Welch p = {welch_p['float32']:.2f} in fp32 and {welch_p['bfloat16']:.2f} in bf16: "
        f"cannot tell; a single run's ratio varied by up to {spread['bfloat16']:.2f} in bf16 "
        f"and {spread['float32']:.2f} in fp32"
    ) in page


def test_benchmark_figures_page_states_the_recorded_ctranslate2_figures():
    """The CTranslate2 table and sentence of docs/lab-benchmarks.md are the committed decode and
    export records: sentences per second of every system and ours' ratio to each."""
    root = Path(__file__).resolve().parents[2]
    record = json.loads(
        (root / "benchmarks/results/decode_throughput_ctranslate2.json").read_text()
    )
    page = " ".join((root / "docs/lab-benchmarks.md").read_text().split())
    speed, ratio = (record["results"]["float32"][key] for key in ("sentences_per_s", "ratio"))
    assert f"| ours | {speed['cached']:.1f} | - |" in page
    rows = {"ctranslate2": "CTranslate2 float32", "ctranslate2_int8": "CTranslate2 int8",
            "marian": "Marian"}  # fmt: skip
    for system, label in rows.items():
        row = f"| {label} | {speed[system]:.1f} | {ratio[f'cached_vs_{system}']:.2f}x |"
        assert row in page, row
    assert f"{record['sentences']} test2016 sources in {record['batches']} batches" in page
    export = json.loads((root / "results/multi30k_tiny_amx.en-de/export_quality.json").read_text())[
        "results"
    ]
    ours, exported = (export[k]["sentences_per_s"] for k in ("ours", "ctranslate2_float32"))
    assert f"{exported / ours:.1f}x faster ({exported:.0f} against {ours:.0f} sentences/s" in page
