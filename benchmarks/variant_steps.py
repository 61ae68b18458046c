"""A study's variants' training-step time against its base, to size the study (`trial_hours`).

    python -m benchmarks.variant_steps ablations/table3_bc.yaml [--steps 25] [--threads 1]

Every variant's model is built from the spec (base experiment, budget, its overrides; dropout and
CPU speed paths as its trials train) and takes optimizer steps (`benchmarks.train_throughput`'s
step: forward and loss under bf16 autocast where the base's precision resolves to bf16-mixed
here, backward, Adam) on the same real batch, the median-length batch of the project's token
batching with about the recipe's target tokens. The variants run in turn, one step each per round
(`time_interleaved`), so a machine busy with other work slows all of them alike and their
ratios to the base hold. Reported: parameters, the median step and its ratio to the base.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from benchmarks.common import time_interleaved, tokenized_corpus
from benchmarks.train_throughput import (
    build_systems,
    special_ids,
    training_batch,
    training_step_fn,
)
from pipeline import sweep
from pipeline.sweep.spec import BASE_VARIANT, point_config
from pipeline.training.precision import resolve_precision

# About the target tokens of the tiny recipe's batches (train.max_tokens 8192, "sum" budget)
TARGET_TOKENS = 3700
WARMUP_STEPS = 3


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="a grid study spec (ablations/*.yaml)")
    parser.add_argument("--steps", type=int, default=25, help="timed steps per variant")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads, as one worker")
    parser.add_argument("--target-tokens", type=int, default=TARGET_TOKENS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = sweep.load_spec(args.spec)
    configs = {name: point_config(spec, overrides) for name, overrides in spec.variants.items()}
    base = configs[BASE_VARIANT]
    device = torch.device("cpu")
    precision = resolve_precision(
        base.train.precision, "cpu", d_model=base.model.d_model, d_ff=base.model.d_ff,
        min_speedup=base.runtime.bf16_min_speedup,
    )  # fmt: skip
    dtype = torch.bfloat16 if precision == "bf16-mixed" else torch.float32  # as the base trains
    with tokenized_corpus(base, None) as (tokenizer, splits):
        batch = training_batch(base, tokenizer, splits, args.target_tokens, device)
    tokens = special_ids(tokenizer)
    steps, parameters = {}, {}
    for name, cfg in configs.items():
        systems = build_systems(cfg, tokenizer.vocab_size, tokens, device, ["ours"])
        module, loss_fn = systems["ours"]
        parameters[name] = sum(p.numel() for p in module.parameters())
        steps[name] = training_step_fn(module, loss_fn, batch, cfg, device, dtype)
    seconds = time_interleaved(steps, repeats=args.steps, warmup=WARMUP_STEPS, device=device)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    print(f"batch: {batch['num_tgt_tokens']} target tokens; {args.steps} steps per variant, "
          f"{args.threads} thread(s), {dtype}", file=sys.stderr)  # fmt: skip
    for name in configs:
        print(f"{name:16s} {parameters[name]:>11,} parameters  median step "
              f"{median[name] * 1000:8.1f} ms  x base {median[name] / median[BASE_VARIANT]:.2f}")  # fmt: skip
    result = {"median_s": median, "parameters": parameters, "steps": args.steps,
              "threads": args.threads}  # fmt: skip
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
