"""Shared helpers of the benchmarks: the command line, the real Multi30k token lengths, the
peer model (Hugging Face Marian) built to our sizes, interleaved timing, the table and the
JSON line.

Every benchmark prints a human-readable table and, as its last line of stdout, one JSON object
(`print_json`), so a run can be compared, plotted or checked by a test without parsing tables.

Timings are taken interleaved (system A, B, C, A, B, C, ...) after a warm-up, and the median
over the rounds is reported: on a shared or throttling machine every system sees the same
slow-downs, so the *ratios* of one run are meaningful even when the absolute numbers drift.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch

from pipeline import config as config_lib
from pipeline import environment as environment_lib
from pipeline.config_schema import Config, ModelConfig
from pipeline.training.cpu_memory import configure_cpu_memory
from pipeline.training.precision import has_fast_bf16

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


# ---------------------------------------------------------------- command line and config


def base_parser(description: str) -> argparse.ArgumentParser:
    """Flags every benchmark shares; positional arguments are Hydra overrides of conf/
    (`data.raw_dir=...`, `model.dropout=0.3`, ...) applied before the explicit flags."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of conf/ (key=value)")
    parser.add_argument("--tokenized", default=None,
                        help="output folder of the tokenize stage (spm.model + splits/); default: "
                        "paths.tokenized when it exists, else prepare + tokenize the corpus in a "
                        "temp dir")  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="default: the config's seed")
    return parser


def add_timing_args(parser: argparse.ArgumentParser, repeats: int, warmup: int) -> None:
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    parser.add_argument("--repeats", type=int, default=repeats, help="timed rounds (median)")
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (torch default)")


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """Model sizes (the defaults are the issue's benchmark model, not conf/'s model)."""
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8000,
                        help="joint subword vocabulary (data.tokenizer)")  # fmt: skip


def bench_config(args: argparse.Namespace) -> Config:
    """conf/ without an experiment preset, with the paper's model group (conf/model/base.yaml:
    dropout 0.1, ...), the positional overrides, then the explicit size flags."""
    overrides = ["~experiment", "model=base", *args.overrides]
    if hasattr(args, "d_model"):
        overrides += [
            f"model.d_model={args.d_model}",
            f"model.encoder_layers={args.layers}",
            f"model.decoder_layers={args.layers}",
            f"model.heads={args.heads}",
            f"model.d_ff={args.d_ff}",
            f"data.tokenizer.vocab_size={args.vocab}",
        ]
    cfg = config_lib.compose(overrides)
    if args.seed is not None:
        cfg.seed = args.seed
    return cfg


def resolve_device(args: argparse.Namespace, cfg: Config) -> torch.device:
    """The device of `--device` (auto: cuda when available); applies `--threads` and, on a
    CPU, the host memory settings training uses (`cfg.train`), for every system alike."""
    if args.threads:
        torch.set_num_threads(args.threads)
    name = args.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cpu":
        configure_cpu_memory(cfg.runtime.cpu_mmap_threshold_mb, cfg.runtime.onednn_primitive_cache)
    return device


def add_dtype_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=None,
                        help="default: float32, and bfloat16 (autocast) where training's "
                        "`precision: auto` would pick it (pipeline.training.precision)")  # fmt: skip


def chosen_dtypes(args: argparse.Namespace, device: torch.device, cfg: Config) -> list[str]:
    if args.dtype:
        return list(args.dtype)
    m = cfg.model
    if has_fast_bf16(device.type, m.d_model, m.d_ff, cfg.runtime.bf16_min_speedup):
        return ["float32", "bfloat16"]
    print(f"note: bf16 matmuls are not faster than float32 on {device} (no AVX512-BF16/AMX, "
          "or timed slower); bfloat16 skipped, pass --dtype bfloat16 to time it anyway",
          file=sys.stderr)  # fmt: skip
    return ["float32"]


def autocast(device: torch.device, dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """bf16 autocast (what Lightning's `bf16-mixed` does), or nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


# ---------------------------------------------------------------- data


@contextlib.contextmanager
def tokenized_corpus(cfg: Config, tokenized: str | None) -> Iterator[tuple[object, object]]:
    """(tokenizer, DatasetDict of the splits) of the real corpus: from `tokenized` (the
    tokenize stage's output folder) as it is; without it, from `paths.tokenized` when that
    holds a vocabulary of the asked size (`--vocab`, data.tokenizer.vocab_size), else the
    project's own prepare and tokenize stages run into a temporary folder (about 10 s for
    Multi30k), removed afterwards."""
    from pipeline.data.prepared import prepare
    from pipeline.data.tokenized import load_tokenized, tokenize
    from pipeline.data.tokenizer import MODEL_FILE, Tokenizer

    folder = Path(tokenized or cfg.paths.tokenized)
    with tempfile.TemporaryDirectory(prefix="bench-tokenized-") as scratch:
        if tokenized is None and not _holds_vocabulary(folder, cfg.data.tokenizer.vocab_size):
            for name in vars(cfg.paths):  # every output of the stages inside the scratch dir
                setattr(cfg.paths, name, str(Path(scratch) / name))
            print(f"tokenizing {cfg.data.raw_dir} into {scratch}", file=sys.stderr)
            prepare(cfg)
            tokenize(cfg)
            folder = Path(cfg.paths.tokenized)
        yield Tokenizer.load(folder / MODEL_FILE), load_tokenized(folder)


def _holds_vocabulary(folder: Path, vocab_size: int) -> bool:
    from pipeline.data.tokenizer import MODEL_FILE, Tokenizer

    if not (folder / MODEL_FILE).exists():
        return False
    found = Tokenizer.load(folder / MODEL_FILE).vocab_size
    if found != vocab_size:
        print(f"note: {folder} holds a vocabulary of {found}, not {vocab_size}; "
              "pass --tokenized to use it as it is", file=sys.stderr)  # fmt: skip
    return found == vocab_size


# ---------------------------------------------------------------- the peer model


def peer_package(name: str):
    """The module `name` of a peer: from the environment where it is installed there (`pip
    install .[bench]`, a GPU box's carried packages), else from the peers' folder `make setup`
    installs beside it (`pipeline.environment.PEERS_DIR`), added to the end of the path."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as missing:
        folder = str(environment_lib.PEERS_DIR)
        if environment_lib.PEERS_DIR.is_dir() and folder not in sys.path:
            sys.path.append(folder)
            return peer_package(name)
        raise ModuleNotFoundError(
            f"{missing}: a peer's package, installed neither here nor in {folder} "
            "(`make setup` puts it there; or `pip install .[bench]`)",
            name=missing.name,
        ) from None


def marian_model(model: ModelConfig, vocab_size: int, tokens: dict[str, int]):
    """Hugging Face `MarianMTModel` (untrained) with our sizes: post-norm encoder-decoder,
    ReLU FFN, sinusoidal positions, sqrt(d_model) embedding scale, one shared embedding
    matrix tied to the output layer, the same dropouts; torch's SDPA attention kernels.
    `tokens`: pad_id, bos_id, eos_id (the decoder starts from bos like ours)."""
    transformers = peer_package("transformers")

    config = transformers.MarianConfig(
        vocab_size=vocab_size, d_model=model.d_model,
        encoder_layers=model.encoder_layers, decoder_layers=model.decoder_layers,
        encoder_attention_heads=model.heads, decoder_attention_heads=model.heads,
        encoder_ffn_dim=model.d_ff, decoder_ffn_dim=model.d_ff, activation_function="relu",
        dropout=model.dropout, attention_dropout=model.attention_dropout,
        activation_dropout=model.activation_dropout, max_position_embeddings=model.max_positions,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=tokens["pad_id"], bos_token_id=tokens["bos_id"],
        eos_token_id=tokens["eos_id"], decoder_start_token_id=tokens["bos_id"],
        forced_eos_token_id=None, attn_implementation="sdpa",
    )  # fmt: skip
    return transformers.MarianMTModel(config)


# ---------------------------------------------------------------- timing and output


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    systems: dict[str, Callable[[], object]],
    *,
    repeats: int,
    warmup: int,
    device: torch.device,
    progress: str = "",
) -> dict[str, list[float]]:
    """Run each system once per round, in turn (A, B, C, A, B, C, ...): `warmup` untimed
    rounds, then `repeats` timed ones. Returns the seconds of every timed call per system."""
    seconds: dict[str, list[float]] = {name: [] for name in systems}
    for round_index in range(warmup + repeats):
        for name, run in systems.items():
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            if round_index >= warmup:
                seconds[name].append(time.perf_counter() - start)
        if progress:
            kind = "warm-up" if round_index < warmup else "timed"
            print(f"{progress}: {kind} round {round_index + 1}/{warmup + repeats}",
                  file=sys.stderr, flush=True)  # fmt: skip
    return seconds


def matmul_peak_flops(device: torch.device, dtype: torch.dtype, size: int, repeats: int) -> float:
    """Achievable matrix-multiply FLOP/s in this run: the median time of a (size x size) @
    (size x size) `torch.matmul` in `dtype`, 2 size^3 FLOPs each (the denominator of MFU)."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    b = torch.randn(size, size, generator=generator).to(device=device, dtype=dtype)
    times = time_interleaved({"matmul": lambda: a @ b}, repeats=repeats, warmup=1, device=device)
    return 2 * size**3 / statistics.median(times["matmul"])


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A plain aligned table (numbers right-aligned) on stdout."""
    cells = [[_format(c) for c in row] for row in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("  ".join(str(h).ljust(w) for h, w in zip(headers, widths)))
    print("  ".join("-" * w for w in widths))
    for row, raw in zip(cells, rows):
        print("  ".join(c.rjust(w) if isinstance(v, (int, float)) else c.ljust(w)
                        for c, v, w in zip(row, raw, widths)))  # fmt: skip


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def print_json(payload: dict) -> None:
    """The machine-readable result: one JSON object on the last line of stdout."""
    print(json.dumps(payload, sort_keys=True), flush=True)


def model_summary(model: ModelConfig, vocab: int) -> dict:
    """The sizes a result was measured at."""
    keys = ("d_model", "heads", "encoder_layers", "decoder_layers", "d_ff", "dropout")
    return {**{key: getattr(model, key) for key in keys}, "vocab": vocab}


def environment(device: torch.device) -> dict:
    """What the numbers depend on, recorded beside them."""
    info = {
        "device": str(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        # libgomp's barrier policy: PASSIVE keeps timings sane when other processes share the cores
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info
