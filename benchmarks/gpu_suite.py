"""The GPU suite: one run, one JSON of training and decoding speed against fairseq, torch and
CTranslate2 on the card at hand (the defaults are sized for about 5 minutes of an H100).

    python -m benchmarks.gpu_suite --out results/gpu/NAME.json [--device cuda]
        [--sizes tiny base] [--dtype float32 bfloat16] [--repeats 10]
        [--decode-batch-sizes 1 16 128] [--fairseq-venv VENV] [overrides]
    python -m benchmarks.gpu_suite --device cpu --sizes tiny ...   # the same on a CPU

Training (`benchmarks.train_throughput`'s systems and step, interleaved A, B, C, A, ...):
  ours, torch (torch.nn.Transformer in our embedding/output layer) and fairseq 0.12 (its own
  criterion and optimizer, in a worker of its venv: on CUDA once per precision mode it has,
  fairseq_float32, fairseq_fp16 (`--fp16`) and fairseq_amp (`--amp`); fairseq's `--bf16` is
  its TPU mode; on a CPU float32 only), at each size of SIZES, on the median-length batch of
  the project's token batching with about the size's target tokens, in float32 (TF32 matmuls
  on CUDA, `train.float32_matmul_precision: high`) and under bf16 autocast (what
  `bf16-mixed` does). Per system: step time, target tokens/s, peak memory (CUDA: the
  system's parameters, gradients and optimizer state plus the step's own peak above what was
  allocated before it; fairseq's worker reports its process's peak), and model FLOP
  utilisation (MFU): the step's model FLOPs / step time / the card's dense bf16 peak.

  FLOPs are counted as `train_throughput.training_flops` counts them (checked against torch's
  FlopCounterMode by the tests); the denominator is DENSE_BF16_PEAKS for the card's name
  (datasheet numbers, no sparsity), else (an unlisted card, a CPU) the bf16 matmul rate timed
  in this run.

Decoding, on the test split (test_2016_flickr), sentences sorted longest first and cut into
batches of each `--decode-batch-sizes` sentences (at most `--decode-batches` batches a size):
ours (beam search with its key/value cache, beam and length penalty from conf/eval, float32
and bf16 autocast), our model exported to CTranslate2 (CUDA: float16 and int8; CPU: float32
and int8) and fairseq's SequenceGenerator (our weights loaded into fairseq's model, its logits
checked against ours first; float32). The weights are untrained, so every system decodes the
same number of steps for every sentence: eos is banned until a fixed length, S = eval's
max_len_a x the median source length + max_len_b, then forced (decode_throughput's method).

Systems that cannot run (no fairseq venv, no CTranslate2 CUDA build, no GPU) are listed
under `skipped` with the reason, never dropped silently. The JSON holds the provenance
(commit, environment lock, hardware; `pipeline.environment`), versions and every number.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import math
import statistics
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import (
    DTYPES,
    add_timing_args,
    autocast,
    base_parser,
    environment,
    matmul_peak_flops,
    model_summary,
    print_json,
    print_table,
    resolve_device,
    synchronize,
    time_interleaved,
    tokenized_corpus,
)
from benchmarks.decode_throughput import CTRANSLATE2 as CTRANSLATE2_CPU
from benchmarks.decode_throughput import EosBanned, ctranslate2_decoder, ours_decoder
from benchmarks.fairseq import train_peer
from benchmarks.fairseq.decode_checkpoint import FAIRSEQ_GENERATION, decode_with_fairseq
from benchmarks.train_throughput import (
    BUILD_FAIRSEQ,
    FAIRSEQ_CUDA_PRECISIONS,
    FAIRSEQ_FLOAT32,
    batch_shape,
    build_systems,
    fairseq_unavailable,
    special_ids,
    start_fairseq,
    training_batch,
    training_flops,
    training_step_fn,
    write_fairseq_handover,
)
from pipeline import config as config_lib
from pipeline.atomic import write_json_atomic
from pipeline.config_schema import Config
from pipeline.environment import provenance
from pipeline.errors import ConfigError
from pipeline.evaluation.beam_decoding import pad_batch
from pipeline.model.transformer import Transformer

# The sizes the suite trains: a model group of conf/model, the joint vocabulary and the
# target tokens of a batch. tiny: Wu et al.'s Transformer-tiny as conf/experiment/
# multi30k_tiny trains it (fairseq --max-tokens 4096: ~3700 target tokens); base: the
# paper's base model and batches of ~25k target tokens (section 5.1).
SIZES = {
    "tiny": {"model": "tiny", "vocab": 10000, "target_tokens": 3700},
    "base": {"model": "base", "vocab": 10000, "target_tokens": 25000},
}
IN_PROCESS = ("ours", "torch")
# Dense (no sparsity) bf16 tensor-core peaks from NVIDIA's datasheets, FLOP/s, by a substring
# of torch.cuda.get_device_name; the first match wins, so the longer names come first.
DENSE_BF16_PEAKS = {
    "H100 PCIe": 756e12,
    "H100 NVL": 835e12,
    "H100": 989e12,  # SXM5 (HBM3)
    "H200": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "L4": 121e12,
    "A10G": 70e12,
    "A10": 125e12,
}
CTRANSLATE2_CUDA = {"ctranslate2_float16": "float16", "ctranslate2_int8": "int8"}


# ---------------------------------------------------------------- hardware


def card_peak(device: torch.device, repeats: int) -> dict:
    """The MFU denominator: the datasheet's dense bf16 peak of this card, or (CPU, a card not
    in DENSE_BF16_PEAKS) the bf16 matmul rate timed here."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in DENSE_BF16_PEAKS.items():
            if key in name:
                return {"dense_bf16_flops_per_s": peak, "source": f"datasheet ({key})"}
    size = 8192 if device.type == "cuda" else 1024
    measured = matmul_peak_flops(device, torch.bfloat16, size, repeats)
    return {"dense_bf16_flops_per_s": measured, "source": f"timed bf16 matmul {size}^3"}


def versions(device: torch.device) -> dict:
    """torch, CUDA, cuDNN, the NVIDIA driver and CTranslate2 (None where not installed)."""
    try:
        import ctranslate2
    except ImportError:
        ctranslate2 = None
    found = {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": None,
             "ctranslate2": ctranslate2 and ctranslate2.__version__}  # fmt: skip
    if device.type == "cuda":
        found["cudnn"] = torch.backends.cudnn.version()
        found["driver"] = nvidia_driver()
        if ctranslate2 is not None:
            found["ctranslate2_cuda_devices"] = ctranslate2.get_cuda_device_count()
    return found


def nvidia_driver() -> str | None:
    """The NVIDIA driver's version, from NVML (None where it cannot be read)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # no NVML library, no driver: the record says so with None
        return None
    return version.decode() if isinstance(version, bytes) else version


def set_float32_matmuls(device: torch.device, cfg: Config) -> None:
    """float32 rounds on CUDA use TF32 tensor cores, as training does (`32-true` with
    `train.float32_matmul_precision`)."""
    if device.type == "cuda":
        torch.set_float32_matmul_precision(cfg.train.float32_matmul_precision)
        torch.backends.cudnn.allow_tf32 = True


# ---------------------------------------------------------------- training


def size_config(args: argparse.Namespace, size: str) -> Config:
    spec = SIZES[size]
    return config_lib.compose(["~experiment", f"model={spec['model']}",
                               f"data.tokenizer.vocab_size={spec['vocab']}", *args.overrides])  # fmt: skip


def state_bytes(module: torch.nn.Module) -> int:
    """Parameters, their gradients and Adam's two moments."""
    return 4 * sum(p.numel() * p.element_size() for p in module.parameters())


def step_peak_bytes(device: torch.device, step, module: torch.nn.Module) -> int | None:
    """One more step of `step`: the module's state plus the step's peak above what was
    allocated before it (CUDA; None elsewhere)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    synchronize(device)
    return state_bytes(module) + torch.cuda.max_memory_allocated(device) - before


def fairseq_workers(stack: contextlib.ExitStack, args, cfg, batch, tokens, vocab, device,
                    parameters: int, skipped: dict, size: str) -> dict:  # fmt: skip
    """{name: running fairseq step worker} of every precision fairseq has on `device`."""
    key = f"train/{size}/fairseq"
    if (reason := fairseq_unavailable(args.fairseq_venv, device, cuda=True)) is not None:
        skipped[key] = reason
        return {}
    names = list(FAIRSEQ_CUDA_PRECISIONS) if device.type == "cuda" else [FAIRSEQ_FLOAT32]
    workers = {}
    for name in names:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fairseq-step-")))
        spec = write_fairseq_handover(folder, cfg, batch, tokens, vocab, device.type, name)
        try:
            worker = stack.enter_context(start_fairseq(args.fairseq_venv, spec))
        except RuntimeError as error:
            skipped[f"train/{size}/{name}"] = f"its worker did not start: {error}"
            continue
        if worker.info["parameters"] != parameters:
            skipped[f"train/{size}/{name}"] = (f"its model has {worker.info['parameters']:,} "
                                               f"parameters, ours {parameters:,}")  # fmt: skip
            continue
        workers[name] = worker
    return workers


def train_size(args, size: str, device: torch.device, peak: float, skipped: dict) -> dict:
    """Every system's step at one size, in every dtype; see the module docstring."""
    cfg = size_config(args, size)
    set_float32_matmuls(device, cfg)
    target_tokens = args.target_tokens or SIZES[size]["target_tokens"]
    with tokenized_corpus(cfg, args.tokenized) as (tokenizer, splits):
        batch = training_batch(cfg, tokenizer, splits, target_tokens, device)
    tokens, vocab = special_ids(tokenizer), tokenizer.vocab_size
    shape = batch_shape(batch)
    flops = training_flops(cfg.model, vocab, shape["sentences"], shape["src_len"], shape["tgt_len"])
    systems = build_systems(cfg, vocab, tokens, device, list(IN_PROCESS))
    parameters = {name: sum(p.numel() for p in module.parameters())
                  for name, (module, _) in systems.items()}  # fmt: skip
    results = {}
    with contextlib.ExitStack() as stack:
        fairseq = {}
        if not args.no_fairseq:
            fairseq = fairseq_workers(stack, args, cfg, batch, tokens, vocab, device,
                                      parameters["ours"], skipped, size)  # fmt: skip
        for name, worker in fairseq.items():
            parameters[name] = worker.info["parameters"]
        for dtype_name in args.dtype:
            steps = {name: training_step_fn(module, loss_fn, batch, cfg, device, DTYPES[dtype_name])
                     for name, (module, loss_fn) in systems.items()}  # fmt: skip
            memory = {name: step_peak_bytes(device, steps[name], systems[name][0])
                      for name in steps}  # fmt: skip
            timing = functools.partial(time_interleaved, repeats=args.repeats, warmup=args.warmup,
                                       device=device, progress=f"train {size} {dtype_name}")  # fmt: skip
            try:
                seconds = timing({**steps, **fairseq})
            except RuntimeError as error:  # a fairseq worker that ended: the others still count
                if not fairseq:
                    raise
                for name in fairseq:
                    skipped[f"train/{size}/{name}"] = f"a worker ended while timed: {error}"
                fairseq = {}
                seconds = timing(steps)
            memory.update({name: worker.peak_memory_bytes for name, worker in fairseq.items()})
            per_system = {}
            for name, times in seconds.items():
                step_s = statistics.median(times)
                per_system[name] = {
                    "step_ms": 1000 * step_s,
                    "tgt_tokens_per_s": batch["num_tgt_tokens"] / step_s,
                    "mfu": flops / step_s / peak,
                    "peak_memory_bytes": memory[name],
                }
            ours = per_system["ours"]["tgt_tokens_per_s"]
            over = {n: ours / r["tgt_tokens_per_s"] for n, r in per_system.items() if n != "ours"}
            results[dtype_name] = {"systems": per_system, "ours_over": over}
        versions_seen = {name: w.info for name, w in fairseq.items()}
    return {
        "model": model_summary(cfg.model, vocab),
        "batch": shape,
        "model_flops_per_step": flops,
        "parameters": parameters,
        "fairseq_workers": versions_seen,
        "results": results,
    }


# ---------------------------------------------------------------- decoding


def decode_suite(args, device: torch.device, skipped: dict) -> dict:
    """Sentences/s of every decoder at every batch size; see the module docstring."""
    from pipeline.export import export_ctranslate2, load_exported

    size = args.decode_size
    cfg = size_config(args, size)
    set_float32_matmuls(device, cfg)
    e = cfg.eval
    with tokenized_corpus(cfg, args.tokenized) as (tokenizer, splits):
        split = cfg.data.test_splits[0]
        sources = list(splits[split]["src_ids"])
    tokens, vocab = special_ids(tokenizer), tokenizer.vocab_size
    pad, bos, eos = tokens["pad_id"], tokens["bos_id"], tokens["eos_id"]
    order = sorted(range(len(sources)), key=lambda i: (-len(sources[i]), i))  # fairseq's order
    lengths = [len(s) for s in sources]
    steps = min(int(math.floor(e.max_len_a * float(np.median(lengths)) + e.max_len_b)),
                cfg.model.max_positions - 1)  # fmt: skip
    torch.manual_seed(cfg.seed)
    model = Transformer(cfg.model, vocab, pad).eval()
    ours = EosBanned(model, eos, bos).to(device)

    kinds = CTRANSLATE2_CUDA if device.type == "cuda" else CTRANSLATE2_CPU
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpu-suite-ct2-") as scratch:
        exported = {}
        for name, quantization in kinds.items():
            try:
                folder = Path(scratch) / name
                export_ctranslate2(model.cpu(), tokenizer, folder, quantization=quantization)
                loaded = load_exported(folder, device=device.type,
                                       threads=torch.get_num_threads())  # fmt: skip
                # a CUDA build that cannot find its CUDA libraries fails only when it translates
                loaded.translator.translate_batch([[tokenizer.piece(t) for t in sources[0]]],
                                                  beam_size=1, max_decoding_length=2)  # fmt: skip
                exported[name] = loaded
            # ConfigError: CTranslate2 is not installed
            except (RuntimeError, ValueError, OSError, ConfigError) as error:
                skipped[f"decode/{name}"] = f"CTranslate2 cannot run it on {device}: {error}"
        ours.to(device)
        for batch_size in args.decode_batch_sizes:
            chosen = order[: batch_size * args.decode_batches]
            chunks = [chosen[i : i + batch_size] for i in range(0, len(chosen), batch_size)]
            tensors = [pad_batch([sources[i] for i in c], pad).to(device) for c in chunks]
            pieces = [[[tokenizer.piece(t) for t in sources[i]] for i in c] for c in chunks]
            timed = {}
            for dtype_name in args.dtype:
                decoder = ours_decoder(ours, [(src, steps) for src in tensors], e)
                timed[f"ours_{dtype_name}"] = _under(decoder, device, dtype_name)
            for name, loaded in exported.items():
                timed[name] = ctranslate2_decoder(loaded.translator,
                                                  [(rows, steps) for rows in pieces], e)  # fmt: skip
            seconds = time_interleaved(timed, repeats=args.decode_repeats, warmup=1,
                                       device=device, progress=f"decode batch {batch_size}")  # fmt: skip
            if not args.no_fairseq:
                fairseq_s = _fairseq_decode(args, model, cfg, tokens, [sources[i] for i in chosen],
                                            batch_size, steps, device, skipped)  # fmt: skip
                if fairseq_s is not None:
                    seconds["fairseq"] = fairseq_s
            per_s = {name: len(chosen) / statistics.median(t) for name, t in seconds.items()}
            over = {name: per_s["ours_float32"] / rate for name, rate in per_s.items()
                    if not name.startswith("ours") and "ours_float32" in per_s}  # fmt: skip
            results[str(batch_size)] = {"sentences": len(chosen), "sentences_per_s": per_s,
                                        "ours_over": over}  # fmt: skip
    return {"split": split, "size": size, "model": model_summary(cfg.model, vocab),
            "beam_size": e.beam_size, "decoder_steps_per_sentence": steps + 1,
            "results": results}  # fmt: skip


def _under(fn, device: torch.device, dtype_name: str):
    def run() -> None:
        with autocast(device, DTYPES[dtype_name]):
            fn()

    return run


def _fairseq_decode(args, model, cfg, tokens, sources, batch_size, steps, device,
                    skipped) -> list[float] | None:  # fmt: skip
    """fairseq's seconds per decode of `sources`, timed in its worker (after a warm-up decode
    that also checks its logits against ours); None, with the reason in `skipped`."""
    key = f"decode/{batch_size}/fairseq"
    if (reason := fairseq_unavailable(args.fairseq_venv, device, cuda=True)) is not None:
        skipped["decode/fairseq"] = reason
        return None
    generation = {**FAIRSEQ_GENERATION, "beam_size": cfg.eval.beam_size,
                  "length_penalty": cfg.eval.length_penalty, "batch_size": batch_size,
                  "max_len_a": 0.0, "max_len_b": steps, "min_len": steps}  # fmt: skip
    try:
        _, _, seconds = decode_with_fairseq(
            model.cpu(), cfg, tokens, sources, generation, venv=args.fairseq_venv,
            threads=torch.get_num_threads(), device=device.type, timing_repeats=args.decode_repeats,
        )  # fmt: skip
    except (SystemExit, RuntimeError, OSError) as error:
        skipped[key] = f"fairseq's decoding failed: {error}"
        return None
    finally:
        model.to(device)
    return seconds


# ---------------------------------------------------------------- command line


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = base_parser(__doc__.splitlines()[0])
    add_timing_args(parser, repeats=10, warmup=3)
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--target-tokens", type=int, default=None,
                        help="target tokens a training batch (default: each size's own)")  # fmt: skip
    parser.add_argument("--decode-size", choices=list(SIZES), default="tiny")
    parser.add_argument("--decode-batch-sizes", type=int, nargs="+", default=[1, 16, 128])
    parser.add_argument("--decode-batches", type=int, default=50,
                        help="at most this many batches of each batch size (all of the "
                        "split's sentences when they make fewer)")  # fmt: skip
    parser.add_argument("--decode-repeats", type=int, default=3)
    parser.add_argument("--fairseq-venv", type=Path, default=train_peer.DEFAULT_VENV,
                        help=f"fairseq's venv, built by `{BUILD_FAIRSEQ}`")  # fmt: skip
    parser.add_argument("--no-fairseq", action="store_true", help="time fairseq nowhere")
    parser.add_argument("--no-decode", action="store_true")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = resolve_device(args, config_lib.compose(["~experiment", *args.overrides]))
    skipped: dict[str, str] = {}
    if args.no_fairseq:
        skipped["fairseq"] = "--no-fairseq"
    peak = card_peak(device, repeats=max(3, args.repeats // 3))
    payload = {
        "benchmark": "gpu_suite",
        "provenance": provenance(),
        "versions": versions(device),
        "env": environment(device),
        "peak": peak,
        "repeats": args.repeats,
        "train": {},
        "decode": None,
        "skipped": skipped,
    }

    # Each part is written as it ends, and a part that fails is named under `skipped` with its
    # error: a run cut short by a time limit or by one part's failure keeps the other figures.
    def train_part(size: str) -> None:
        payload["train"][size] = train_size(args, size, device, peak["dense_bf16_flops_per_s"],
                                            skipped)  # fmt: skip

    def decode_part() -> None:
        payload["decode"] = decode_suite(args, device, skipped)

    parts = [(f"train/{size}", functools.partial(train_part, size)) for size in args.sizes]
    if not args.no_decode:
        parts.append(("decode", decode_part))
    for name, run_part in parts:
        try:
            run_part()
        except Exception as error:  # noqa: BLE001 - recorded, and the run goes on
            traceback.print_exc()
            skipped[name] = f"failed: {error!r}"
        if args.out is not None:
            write_json_atomic(args.out, payload, sort_keys=True)
    report(payload)
    print_json(payload)
    return payload


def report(payload: dict) -> None:
    """The tables a reader checks before the JSON."""
    print(f"{payload['provenance']['hardware']}; peak {payload['peak']}")
    rows = []
    for size, result in payload["train"].items():
        for dtype_name, r in result["results"].items():
            for name, s in r["systems"].items():
                memory = s["peak_memory_bytes"]
                rows.append([size, dtype_name, name, s["step_ms"], s["tgt_tokens_per_s"],
                             f"{s['mfu']:.1%}", "-" if memory is None else memory / 2**20,
                             r["ours_over"].get(name, 1.0)])  # fmt: skip
    print_table(["size", "dtype", "system", "step ms", "tgt tok/s", "MFU", "peak MiB",
                 "ours / system"], rows)  # fmt: skip
    if payload["decode"]:
        rows = [[size, name, rate, r["ours_over"].get(name, "-")]
                for size, r in payload["decode"]["results"].items()
                for name, rate in r["sentences_per_s"].items()]  # fmt: skip
        print_table(["batch", "decoder", "sentences/s", "ours fp32 / decoder"], rows)
    for key, reason in payload["skipped"].items():
        print(f"skipped {key}: {reason}", file=sys.stderr)


if __name__ == "__main__":
    main()
