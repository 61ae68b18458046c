"""The GPU suite's CPU run (`--device cpu`, tiny sizes, one timed round): one JSON with the
provenance, every system timed or skipped with its reason, and numbers that agree with each
other (tokens/s from step time, MFU from the FLOP count, ratios from the rates)."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks import gpu_suite
from benchmarks.train_throughput import BUILD_FAIRSEQ

TINY = ["model.d_model=32", "model.heads=2", "model.d_ff=64", "model.encoder_layers=1",
        "model.decoder_layers=1"]  # fmt: skip


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.mark.slow
def test_the_suite_runs_on_the_cpu_and_writes_one_consistent_json(
    tokenized_smoke, tmp_path, capsys
):
    absent = tmp_path / "no-fairseq-venv"
    out = tmp_path / "suite.json"
    payload = gpu_suite.main([
        *TINY, "--tokenized", tokenized_smoke.paths.tokenized, "--device", "cpu",
        "--sizes", "tiny", "--repeats", "1", "--warmup", "0", "--target-tokens", "300",
        "--decode-batch-sizes", "1", "8", "--decode-batches", "2", "--decode-repeats", "1",
        "--fairseq-venv", str(absent), "--out", str(out),
    ])  # fmt: skip
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(payload, sort_keys=True))
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == written

    assert written["benchmark"] == "gpu_suite"
    assert {"commit", "environment_lock", "hardware"} <= set(written["provenance"])
    assert written["versions"]["torch"] and written["versions"]["ctranslate2"]
    assert written["peak"]["source"].startswith("timed bf16 matmul")  # no datasheet on a CPU
    peak = written["peak"]["dense_bf16_flops_per_s"]
    assert positive(peak)
    # fairseq has no venv here: skipped with the command that builds it, in training and decoding
    for key in ("train/tiny/fairseq", "decode/fairseq"):
        assert str(absent) in written["skipped"][key]
        assert BUILD_FAIRSEQ in written["skipped"][key]

    tiny = written["train"]["tiny"]
    assert tiny["model"]["d_model"] == 32 and tiny["model"]["vocab"] == 1000
    assert 150 <= tiny["batch"]["tgt_tokens"] <= 600
    assert set(tiny["results"]) == {"float32", "bfloat16"}
    for result in tiny["results"].values():
        systems = result["systems"]
        assert set(systems) == {"ours", "torch"}
        for s in systems.values():
            assert positive(s["step_ms"]) and s["peak_memory_bytes"] is None  # CUDA only
            assert s["tgt_tokens_per_s"] == pytest.approx(
                tiny["batch"]["tgt_tokens"] / (s["step_ms"] / 1000)
            )
            assert s["mfu"] == pytest.approx(
                tiny["model_flops_per_step"] / (s["step_ms"] / 1000) / peak
            )
        assert result["ours_over"]["torch"] == pytest.approx(
            systems["ours"]["tgt_tokens_per_s"] / systems["torch"]["tgt_tokens_per_s"]
        )

    decode = written["decode"]
    assert decode["split"] == "test_2016_flickr" and decode["beam_size"] == 5
    assert decode["decoder_steps_per_sentence"] > 1
    assert set(decode["results"]) == {"1", "8"}
    assert [decode["results"][b]["sentences"] for b in ("1", "8")] == [2, 16]
    for result in decode["results"].values():
        rates = result["sentences_per_s"]
        assert set(rates) == {"ours_float32", "ours_bfloat16", "ctranslate2", "ctranslate2_int8"}
        assert all(positive(rate) for rate in rates.values())
        assert result["ours_over"]["ctranslate2"] == pytest.approx(
            rates["ours_float32"] / rates["ctranslate2"]
        )
