"""Batching efficiency on the real training split: our token batching
(`pipeline.data.batching.TokenBatchSampler`, budget train.max_tokens, length-bucketed) against
fixed-size sentence batches in random order with the same average number of sentences per
batch (what a plain `DataLoader(batch_size=..., shuffle=True)` gives).

    python -m benchmarks.batching [--max-tokens N] [overrides]

Tokens are counted as the batches hold them: source padded to the batch's longest source,
target padded to its longest target + 1 (bos in tgt_in, eos in tgt_out). Padding fraction =
pad positions / all positions, over the epoch. Also reported: batches per epoch, sentences
per batch, target tokens per batch (mean and standard deviation: what each batch's tokens weigh
in an update under `train.loss_normalization: batch`), and the largest padded batch (what sets
peak memory). The budget is counted as `train.batch_budget` says.
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.common import base_parser, bench_config, print_json, print_table, tokenized_corpus
from pipeline.data.batching import TARGET_SPECIALS, TokenBatchSampler, padded_size

SCHEMES = ("token_batching", "fixed_size_random")


def batch_stats(batches: list[list[int]], src_lens: np.ndarray, tgt_lens: np.ndarray) -> dict:
    """Padding and size statistics of one epoch's batches (tgt_lens without bos/eos)."""
    padded = np.array([padded_size(b, src_lens, tgt_lens) for b in batches])
    targets = np.array([(tgt_lens[b] + TARGET_SPECIALS).sum() for b in batches])
    real = np.array([src_lens[b].sum() for b in batches]) + targets
    sizes = np.array([len(b) for b in batches])
    return {
        "batches": len(batches),
        "padding_fraction": float(1 - real.sum() / padded.sum()),
        "sentences_per_batch": float(sizes.mean()),
        "real_tokens_per_batch": float(real.mean()),
        "target_tokens_per_batch": float(targets.mean()),
        "target_tokens_per_batch_std": float(targets.std()),
        "max_padded_tokens": int(padded.max()),
        "mean_padded_tokens": float(padded.mean()),
    }


def fixed_size_batches(num_examples: int, batch_size: int, seed: int) -> list[list[int]]:
    """A shuffled epoch cut into consecutive batches of `batch_size` (the last one smaller)."""
    order = np.random.default_rng(seed).permutation(num_examples)
    return [order[i : i + batch_size].tolist() for i in range(0, num_examples, batch_size)]


def main(argv: list[str] | None = None) -> dict:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="token budget; default: train.max_tokens")  # fmt: skip
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> dict:
    cfg = bench_config(args)
    max_tokens = args.max_tokens or cfg.train.max_tokens
    split = cfg.data.train_split
    with tokenized_corpus(cfg, args.tokenized) as (_, splits):
        src_lens = np.asarray(splits[split]["src_len"], dtype=np.int64)
        tgt_lens = np.asarray(splits[split]["tgt_len"], dtype=np.int64)

    sampler = TokenBatchSampler(src_lens, tgt_lens, max_tokens, seed=cfg.seed,
                                budget=cfg.train.batch_budget)  # fmt: skip
    token_batches = sampler.epoch_batches(0)
    batch_size = max(1, round(len(src_lens) / len(token_batches)))
    fixed = fixed_size_batches(len(src_lens), batch_size, cfg.seed)
    stats = {
        "token_batching": batch_stats(token_batches, src_lens, tgt_lens),
        "fixed_size_random": batch_stats(fixed, src_lens, tgt_lens),
    }

    print(
        f"{split}: {len(src_lens)} pairs, {int(src_lens.sum())} source + {int(tgt_lens.sum())} "
        f"target subword tokens; token budget {max_tokens} ({cfg.train.batch_budget}); fixed "
        f"batches of {batch_size} sentences (the same mean)"
    )
    header = ["scheme", "batches", "padding", "sentences/batch", "real tok/batch",
              "target tok/batch", "mean padded", "max padded"]  # fmt: skip
    rows = [
        [name, s["batches"], f"{s['padding_fraction']:.1%}", s["sentences_per_batch"],
         s["real_tokens_per_batch"],
         f"{s['target_tokens_per_batch']:.0f} +- {s['target_tokens_per_batch_std']:.0f}",
         s["mean_padded_tokens"], s["max_padded_tokens"]]
        for name, s in stats.items()
    ]  # fmt: skip
    print_table(header, rows)
    payload = {
        "benchmark": "batching",
        "split": split,
        "examples": len(src_lens),
        "max_tokens": max_tokens,
        "batch_budget": cfg.train.batch_budget,
        "fixed_batch_size": batch_size,
        "results": stats,
        "padding_ratio_fixed_vs_token": stats["fixed_size_random"]["padding_fraction"]
        / max(stats["token_batching"]["padding_fraction"], 1e-12),
    }
    print_json(payload)
    return payload


if __name__ == "__main__":
    main()
