"""Decoding throughput: beam search on the real test set (test_2016_flickr sources) with our
incremental-decoding cache, ours re-decoding the whole prefix at every step, Hugging Face
Marian's `generate`, and our model exported to CTranslate2 (`pipeline.export`) with float32 and
with int8 weights, all with the same sizes and untrained weights.

    python -m benchmarks.decode_throughput [--sentences 1000] [--repeats 3] [overrides]

Same work for every system. Untrained weights stop at random lengths, so a system's speed
would depend on where its random eos falls. Instead every system decodes exactly the same
number of steps: eos is banned until the length limit, and the limit is one number per batch,
L = floor(eval.max_len_a * S_max + eval.max_len_b) (the project's rule, applied to the
batch's longest source, capped by model.max_positions - 1). Ours gets max_len_a=0,
max_len_b=L and a model wrapper that puts eos at -1e9 in the logits (a finite value, so the
forced eos at the limit still finishes the hypotheses); Marian gets min_new_tokens =
max_new_tokens = L + 1 (its MinNewTokensLength processor bans eos the same way); CTranslate2
gets min_decoding_length = max_decoding_length = L + 1 (eos disabled until its last step, which
ends every hypothesis). All run L + 1 decoder steps for every sentence and beam. The batches
are the project's evaluation batches (`pipeline.data.batching.eval_batches`, eval.max_tokens
source tokens, sorted by length), identical for all systems; beam size and length penalty come
from conf/eval. CTranslate2 uses as many threads as torch (`--threads`) and computes in its
stored weight type, so its systems are timed in the float32 round only (not under autocast).

Our beam search normally also stops each sentence at its own a * src_len + b, which saves work
the fixed per-batch limit does not count; this benchmark measures the cost per decoding step.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from benchmarks import common
from pipeline.data.batching import eval_batches
from pipeline.environment import provenance
from pipeline.evaluation.beam_decoding import pad_batch
from pipeline.export import export_ctranslate2, load_exported
from pipeline.kernels import SpeedPaths, install_speed_paths
from pipeline.model.decoding import beam_search
from pipeline.model.transformer import Transformer

SYSTEMS = ("cached", "uncached", "marian", "ctranslate2", "ctranslate2_int8")
# The exported systems and their stored weight types (pipeline.export's --quantization).
CTRANSLATE2 = {"ctranslate2": "float32", "ctranslate2_int8": "int8"}
BANNED_LOGIT = -1e9  # eos logit before the length limit: never among the top 2k candidates


class EosBanned(nn.Module):
    """Our model with the eos logit pushed to BANNED_LOGIT (the peer's min_new_tokens)."""

    def __init__(self, model: Transformer, eos_id: int, bos_id: int | None = None) -> None:
        super().__init__()
        self.model, self.eos_id, self.bos_id = model, eos_id, bos_id
        self.pad_id, self.cfg = model.pad_id, model.cfg

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        return self.model.encode(src)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor, cache=None) -> Tensor:
        logits = self.model.decode(tgt_in, memory, src_pad_mask, cache)
        logits[..., self.eos_id] = BANNED_LOGIT
        return logits


def ours_decoder(model: EosBanned, batches: list[tuple[Tensor, int]], e, use_cache: bool = True):
    """Decodes every (padded source batch, L) with our beam search, L + 1 steps each (`e`:
    the config's eval block: beam size, length penalty)."""

    def decode_all() -> None:
        for src, steps in batches:
            beam_search(model, src, bos_id=model.bos_id, eos_id=model.eos_id,
                        beam_size=e.beam_size, length_penalty=e.length_penalty, max_len_a=0.0,
                        max_len_b=steps, use_cache=use_cache)  # fmt: skip

    return decode_all


def ctranslate2_decoder(translator, pieces: list[tuple[list[list[str]], int]], e):
    """Decodes every (batch of source pieces, L) with a CTranslate2 translator, L + 1 steps
    each: eos disabled until the last, which ends every hypothesis."""

    def decode_all() -> None:
        for rows, steps in pieces:
            translator.translate_batch(
                rows, beam_size=e.beam_size, length_penalty=e.length_penalty,
                min_decoding_length=steps + 1, max_decoding_length=steps + 1, max_input_length=0,
            )  # fmt: skip

    return decode_all


def decode_steps(src_lens: list[int], a: float, b: int, max_positions: int) -> int:
    """L of the module docstring: the project's length rule on the batch's longest source."""
    return min(int(np.floor(a * max(src_lens) + b)), max_positions - 1)


def main(argv: list[str] | None = None) -> dict:
    parser = common.base_parser(__doc__.splitlines()[0])
    common.add_model_args(parser)
    common.add_timing_args(parser, repeats=3, warmup=1)
    common.add_dtype_arg(parser)
    parser.add_argument("--split", default=None, help="default: the config's first test split")
    parser.add_argument("--sentences", type=int, default=1000, help="a seeded random sample of "
                        "this many sentences (all when >= the split size)")  # fmt: skip
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    made_with = provenance()  # at the start: commits made while it runs are not its code
    cfg = common.bench_config(args)
    device = common.resolve_device(args, cfg)
    env = common.environment(device)
    split = args.split or cfg.data.test_splits[0]
    with common.tokenized_corpus(cfg, args.tokenized) as (tokenizer, splits):
        sources = splits[split]["src_ids"]
    if args.sentences < len(sources):
        chosen = np.random.default_rng(cfg.seed).choice(len(sources), args.sentences, False)
        sources = [sources[i] for i in sorted(chosen)]
    e, pad, bos, eos = cfg.eval, tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    vocab = tokenizer.vocab_size
    batches, pieces = [], []  # the same batches as tensors, and as CTranslate2's tokens
    for indices in eval_batches([len(s) for s in sources], e.max_tokens):
        rows = [sources[i] for i in indices]
        steps = decode_steps([len(r) for r in rows], e.max_len_a, e.max_len_b,
                             cfg.model.max_positions)  # fmt: skip
        batches.append((pad_batch(rows, pad).to(device), steps))
        pieces.append(([[tokenizer.piece(t) for t in row] for row in rows], steps))

    torch.manual_seed(cfg.seed)
    speed_paths = SpeedPaths.on_cpu(cfg.runtime.cpu_speed_paths)  # as training installs it
    ours = install_speed_paths(Transformer(cfg.model, vocab, pad), speed_paths)
    ours = EosBanned(ours, eos, bos).to(device).eval()
    marian = common.marian_model(cfg.model, vocab, {"pad_id": pad, "bos_id": bos, "eos_id": eos})
    marian = marian.to(device).eval()

    @torch.no_grad()
    def marian_fn() -> None:
        for src, steps in batches:
            marian.generate(input_ids=src, attention_mask=src.ne(pad), num_beams=e.beam_size,
                            length_penalty=e.length_penalty, max_new_tokens=steps + 1,
                            min_new_tokens=steps + 1, do_sample=False, early_stopping=False)  # fmt: skip

    def ctranslate2_fn(folder: Path):
        exported = load_exported(folder, device=device.type, threads=torch.get_num_threads())
        return ctranslate2_decoder(exported.translator, pieces, e)

    every = {"cached": ours_decoder(ours, batches, e, use_cache=True),
             "uncached": ours_decoder(ours, batches, e, use_cache=False), "marian": marian_fn}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-ctranslate2-") as scratch:  # loaded, removed
        for name, quantization in CTRANSLATE2.items():
            if name in args.systems:
                folder = Path(scratch) / name
                export_ctranslate2(ours.model.cpu(), tokenizer, folder, quantization=quantization)
                every[name] = ctranslate2_fn(folder)
    ours.to(device)
    systems = {name: every[name] for name in SYSTEMS if name in args.systems}
    results = {}
    for dtype_name in common.chosen_dtypes(args, device, cfg):
        timed = {name: fn for name, fn in systems.items()
                 if dtype_name == "float32" or name not in CTRANSLATE2}  # fmt: skip
        with common.autocast(device, common.DTYPES[dtype_name]):
            seconds = common.time_interleaved(timed, repeats=args.repeats, warmup=args.warmup,
                                       device=device, progress=f"decode {dtype_name}")  # fmt: skip
        total = {name: statistics.median(times) for name, times in seconds.items()}
        per_s = {name: len(sources) / s for name, s in total.items()}
        ratio = {f"cached_vs_{name}": per_s["cached"] / per_s[name] for name in per_s
                 if "cached" in per_s and name != "cached"}  # fmt: skip
        results[dtype_name] = {"seconds": total, "sentences_per_s": per_s, "ratio": ratio}

    steps_total = sum(steps + 1 for _, steps in batches)
    print(
        f"{split}: {len(sources)} sentences in {len(batches)} batches (eval.max_tokens="
        f"{e.max_tokens}), beam {e.beam_size}, {steps_total} decoder steps per system; "
        f"vocab {vocab}; {env}"
    )
    table = []
    for dtype_name, r in results.items():
        for name in r["seconds"]:
            ratio = r["sentences_per_s"].get("cached", math.nan) / r["sentences_per_s"][name]
            table.append([dtype_name, name, r["seconds"][name], r["sentences_per_s"][name], ratio])
    common.print_table(["dtype", "system", "seconds", "sentences/s", "cached / system"], table)
    payload = {
        "benchmark": "decode_throughput",
        "split": split,
        "sentences": len(sources),
        "batches": len(batches),
        "decoder_steps": steps_total,
        "beam_size": e.beam_size,
        "model": common.model_summary(cfg.model, vocab),
        "repeats": args.repeats,
        "results": results,
        "provenance": made_with,
        "env": env,
    }
    common.print_json(payload)
    return payload


if __name__ == "__main__":
    main()
