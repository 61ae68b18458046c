"""Translation quality of an exported model: BLEU of our decoding, of the CTranslate2 export
with float32 weights and with quantized (default int8) weights, on one split of the corpus.

    python -m benchmarks.export_quality --checkpoint eval/model.ckpt [--quantization int8]
        [--split test_2016_flickr] [--params params.yaml] [--max-drop 0.5]

The model is exported twice into a temporary folder (`pipeline.export`), every system decodes
the same sources with the decoding settings of `eval` in params.yaml (beam, length penalty,
length limit) and is scored like the evaluate stage (`pipeline.evaluation.scoring`, no
bootstrap). Reported: the scores, how many translations equal ours, sentences per second, and
whether the quantized model's BLEU and lowercased BLEU are within `--max-drop` of float32's
(by default 0.5 BLEU). Exits 1 when they are not.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import environment, print_json, print_table
from pipeline import config as config_lib
from pipeline.data.tokenizer import MODEL_FILE
from pipeline.environment import provenance
from pipeline.evaluation.outputs import MODEL_CHECKPOINT

DEFAULT_MAX_DROP = 0.5  # BLEU points the quantized model may lose against float32
FLOAT = "float32"
TOLERANCE_METRICS = ("bleu", "bleu_lc")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml", help="config: paths and eval settings")
    parser.add_argument("--checkpoint", type=Path, help="default: <paths.eval_dir>/model.ckpt")
    parser.add_argument("--tokenizer", type=Path, help="default: <paths.tokenized>/spm.model")
    parser.add_argument("--split", default=None, help="default: the config's first test split")
    parser.add_argument("--quantization", default="int8", help="the quantized weight type")
    parser.add_argument("--max-drop", type=float, default=DEFAULT_MAX_DROP,
                        help="BLEU the quantized model may lose against float32")  # fmt: skip
    parser.add_argument("--sentences", type=int, default=None, help="the first N only")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch default)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    from pipeline.data.prepared import read_prepared
    from pipeline.evaluation.beam_decoding import one_line, translate_ids
    from pipeline.evaluation.model_loading import load_tokenizer
    from pipeline.evaluation.scoring import score
    from pipeline.export import (
        export_ctranslate2,
        load_checkpoint,
        load_exported,
        translate_with_ctranslate2,
    )

    made_with = provenance()  # at the start: commits made while it runs are not its code
    args = parse_args(argv)
    cfg = config_lib.load(args.params)
    if args.threads:
        torch.set_num_threads(args.threads)
    checkpoint = args.checkpoint or Path(cfg.paths.eval_dir) / MODEL_CHECKPOINT
    split = args.split or cfg.data.test_splits[0]
    corpus = read_prepared(cfg, [split])[split]
    sources, references = corpus.src[: args.sentences], corpus.tgt[: args.sentences]
    model, trained = load_checkpoint(checkpoint)
    tokenizer = load_tokenizer(args.tokenizer or Path(cfg.paths.tokenized) / MODEL_FILE, model,
                               trained.data)  # fmt: skip
    src_ids = tokenizer.encode_sources(sources)
    e = dataclasses.replace(cfg.eval, nbest=1)

    started = time.perf_counter()
    ours = [t.tokens[0] if t.tokens else [] for t in translate_ids(model, tokenizer, src_ids, e)]
    outputs, seconds = {"ours": ours}, {"ours": time.perf_counter() - started}
    with tempfile.TemporaryDirectory(prefix="export-quality-") as scratch:
        for quantization in (FLOAT, args.quantization):
            folder = export_ctranslate2(model, tokenizer, Path(scratch) / quantization,
                                        quantization=quantization)  # fmt: skip
            exported = load_exported(folder, threads=torch.get_num_threads())
            started = time.perf_counter()
            hypotheses = translate_with_ctranslate2(
                exported, src_ids, beam_size=e.beam_size, length_penalty=e.length_penalty,
                max_len_a=e.max_len_a, max_len_b=e.max_len_b, max_tokens=e.max_tokens,
                length_normalization=e.length_normalization,
            )  # fmt: skip
            seconds[f"ctranslate2_{quantization}"] = time.perf_counter() - started
            outputs[f"ctranslate2_{quantization}"] = [h.tokens for h in hypotheses]

    results = {}
    for name, token_lists in outputs.items():
        texts = [one_line(tokenizer.decode(tokens)) for tokens in token_lists]
        scores = score(texts, references, lang=cfg.data.tgt_lang)
        scores.pop("signatures")
        results[name] = {
            **scores,
            "same_as_ours": sum(a == b for a, b in zip(token_lists, ours)),
            "sentences_per_s": len(sources) / seconds[name],
        }
    float_name, quant_name = f"ctranslate2_{FLOAT}", f"ctranslate2_{args.quantization}"
    drop = {m: results[float_name][m] - results[quant_name][m] for m in TOLERANCE_METRICS}
    within = all(value <= args.max_drop for value in drop.values())

    print(f"{checkpoint} on {split}: {len(sources)} sentences, beam {e.beam_size}, length "
          f"penalty {e.length_penalty}, threads {torch.get_num_threads()}")  # fmt: skip
    print_table(
        ["system", "BLEU", "BLEU (lc)", "chrF", "same as ours", "sentences/s"],
        [[name, r["bleu"], r["bleu_lc"], r["chrf"], r["same_as_ours"], r["sentences_per_s"]]
         for name, r in results.items()],
    )  # fmt: skip
    print(f"{args.quantization} loses {drop['bleu']:.2f} BLEU, {drop['bleu_lc']:.2f} BLEU (lc) "
          f"against float32: {'within' if within else 'NOT within'} {args.max_drop}")  # fmt: skip
    payload = {
        "benchmark": "export_quality",
        "checkpoint": str(checkpoint),
        "split": split,
        "sentences": len(sources),
        "beam_size": e.beam_size,
        "quantization": args.quantization,
        "results": results,
        "drop_vs_float32": drop,
        "max_drop": args.max_drop,
        "within_max_drop": within,
        "provenance": made_with,
        "env": environment(torch.device("cpu")),
    }
    print_json(payload)
    return payload


if __name__ == "__main__":
    sys.exit(0 if main()["within_max_drop"] else 1)
