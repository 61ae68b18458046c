"""Training throughput: one optimizer step of our Transformer against three peers of the same
sizes, on the same real Multi30k batch, in float32 and under bf16 autocast.

    python -m benchmarks.train_throughput [--repeats 20] [--dtype float32 bfloat16]
        [--systems ours torch marian fairseq] [overrides]

Systems (all untrained, in training mode, dropout as configured):
  ours    pipeline.model.transformer.Transformer(ModelConfig)
  torch   torch.nn.Transformer (batch_first, post-norm, ReLU) inside the same embedding
          (shared, x sqrt(d_model)), sinusoidal positions and tied output layer as ours.
          nn.Transformer always adds a final LayerNorm to each stack (two more than ours).
  marian  Hugging Face MarianMTModel built from a MarianConfig of the same sizes (see
          `benchmarks.common.marian_model`); SDPA attention.
  fairseq fairseq 0.12's `--arch transformer` with every size explicit, post-norm,
          sinusoidal positions, `--share-all-embeddings`, our dropouts, its label-smoothed
          cross-entropy and its Adam, in a worker process of its own venv
          (`benchmarks.fairseq.step_speed`; built by `python -m benchmarks.fairseq.train_peer
          --build-venv-only`, skipped with that hint when absent), CPU only. Its parameter
          count must equal ours (sinusoidal positions are no parameters in either, the
          output layer is the tied embedding). fairseq has no bf16 mode on a CPU, so in the
          bfloat16 round it runs its float32 step, reported as `fairseq_float32`: that ratio
          is ours in bf16 against fairseq in float32, what a fairseq user gets on this CPU.
A step is: zero grads, forward, label-smoothed cross-entropy (ours: as training computes it,
the output layer fused with the loss, `pipeline.training.loss.output_layer_loss`; the peers:
what their users write, logits then `F.cross_entropy(label_smoothing=...)`; the same values),
backward, Adam step (betas/eps from conf/train). The batch is the median-length batch of the project's
`TokenBatchSampler` over the real training split, with a token budget chosen to give about
`--target-tokens` target tokens.

Reported per dtype: target tokens (non-pad tokens of tgt_out, eos included) per second, the
median over interleaved rounds; our ratio to each peer; and our model FLOP/s as a fraction of
a large `torch.matmul` timed in the same run and dtype. Model FLOPs are counted analytically on
the padded batch (the work the kernels are given): every matmul of the attention projections,
attention scores and weighted values (causal self-attention counted in full), FFN and output
projection, 2 FLOPs per multiply-add, x3 for forward + backward.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from benchmarks import common
from benchmarks.fairseq import train_peer
from benchmarks.fairseq.step_speed import NO_CPU_BF16, FairseqStepWorker, write_handover
from pipeline.config_schema import Config, ModelConfig
from pipeline.data.batching import TokenBatchSampler
from pipeline.data.datamodule import Collate
from pipeline.environment import provenance
from pipeline.kernels import SpeedPaths, install_speed_paths
from pipeline.model.positional import SinusoidalPositionalEncoding
from pipeline.model.transformer import Transformer
from pipeline.training.loss import output_layer_loss

SYSTEMS = ("ours", "torch", "marian", "fairseq")
LEARNING_RATE = 1e-4  # any: a step's cost does not depend on it
BUILD_FAIRSEQ = "python -m benchmarks.fairseq.train_peer --build-venv-only"
FAIRSEQ_FLOAT32 = "fairseq_float32"  # fairseq's float32 step, timed in a bf16 round


class TorchSeq2Seq(nn.Module):
    """`torch.nn.Transformer` with our embedding, positions and output layer around it."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.pad_id = pad_id
        self.scale = cfg.d_model**0.5
        self.embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        nn.init.normal_(self.embed.weight, std=cfg.d_model**-0.5)
        self.positional = SinusoidalPositionalEncoding(cfg.d_model, cfg.max_positions)
        self.dropout = nn.Dropout(cfg.dropout)
        self.transformer = nn.Transformer(
            d_model=cfg.d_model, nhead=cfg.heads, num_encoder_layers=cfg.encoder_layers,
            num_decoder_layers=cfg.decoder_layers, dim_feedforward=cfg.d_ff, dropout=cfg.dropout,
            activation="relu", batch_first=True, norm_first=cfg.norm_first,
        )  # fmt: skip
        # nn.Transformer's one `dropout` also drops attention weights and FFN activations;
        # give those sites our config's own rates so every system drops the same things.
        for layer in (*self.transformer.encoder.layers, *self.transformer.decoder.layers):
            layer.dropout = nn.Dropout(cfg.activation_dropout)  # inside the FFN, after ReLU
            for attention in (layer.self_attn, getattr(layer, "multihead_attn", None)):
                if attention is not None:
                    attention.dropout = cfg.attention_dropout
        self.output = nn.Linear(cfg.d_model, vocab_size, bias=False)
        self.output.weight = self.embed.weight

    def _embed(self, tokens: Tensor) -> Tensor:
        return self.dropout(self.embed(tokens) * self.scale + self.positional(tokens.size(1)))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        src_pad = src.eq(self.pad_id)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), src.device)
        hidden = self.transformer(
            self._embed(src), self._embed(tgt_in), tgt_mask=causal, src_key_padding_mask=src_pad,
            memory_key_padding_mask=src_pad, tgt_is_causal=True,
        )  # fmt: skip
        return self.output(hidden)


def training_flops(model: ModelConfig, vocab: int, batch: int, src_len: int, tgt_len: int) -> int:
    """Matmul FLOPs of one training step (forward x3) on a (batch, src_len) / (batch, tgt_len)
    padded batch; see the module docstring for what is counted."""
    d, ff = model.d_model, model.d_ff
    src_tokens, tgt_tokens = batch * src_len, batch * tgt_len
    attention_core = 2 * 2 * d  # scores Q K^T and weights @ V, per (query, key) pair
    encoder = model.encoder_layers * (
        2 * src_tokens * (4 * d * d + 2 * d * ff)  # Q, K, V, O projections; FFN
        + batch * src_len * src_len * attention_core
    )
    decoder = model.decoder_layers * (
        2 * tgt_tokens * (4 * d * d)  # self-attention projections
        + batch * tgt_len * tgt_len * attention_core
        + 2 * tgt_tokens * (2 * d * d)
        + 2 * src_tokens * (2 * d * d)  # cross: Q, O; K, V
        + batch * tgt_len * src_len * attention_core
        + 2 * tgt_tokens * (2 * d * ff)  # FFN
    )
    output = 2 * tgt_tokens * d * vocab
    return 3 * (encoder + decoder + output)


def median_batch(train, target_tokens: int, seed: int) -> list[int]:
    """Example indices of the middle (median-length) batch of the project's token batching,
    with a budget that gives about `target_tokens` target tokens (tgt + eos)."""
    src_lens, tgt_lens = np.asarray(train["src_len"]), np.asarray(train["tgt_len"])
    per_pair = src_lens.mean() + tgt_lens.mean() + 1
    budget = int(round(target_tokens * per_pair / (tgt_lens.mean() + 1)))
    sampler = TokenBatchSampler(src_lens, tgt_lens, budget, seed=seed, shuffle=False)
    return sampler.batches[len(sampler.batches) // 2]


def build_systems(cfg: Config, vocab: int, tokens: dict[str, int], device: torch.device,
                  names: list[str]):  # fmt: skip
    """{name: (module, loss function)} of the in-process systems among `names`."""
    torch.manual_seed(cfg.seed)
    speed_paths = SpeedPaths.on_cpu(cfg.runtime.cpu_speed_paths)  # as training installs it
    ours = install_speed_paths(Transformer(cfg.model, vocab, tokens["pad_id"]), speed_paths)
    peer = TorchSeq2Seq(cfg.model, vocab, tokens["pad_id"]) if "torch" in names else None
    marian = common.marian_model(cfg.model, vocab, tokens) if "marian" in names else None
    pad_id, epsilon = tokens["pad_id"], cfg.train.label_smoothing

    def our_loss(batch: dict) -> Tensor:  # as TranslationModule._loss computes it
        states = ours.teacher_forced_states(batch["src"], batch["tgt_in"])
        return output_layer_loss(
            states, ours.output_projection, batch["tgt_out"], epsilon=epsilon, pad_id=pad_id,
            chunk_rows=cfg.runtime.loss_chunk_rows, compiled=cfg.runtime.compile_loss,
        )[0]  # fmt: skip

    def marian_logits(src: Tensor, tgt_in: Tensor) -> Tensor:
        return marian(input_ids=src, attention_mask=src.ne(pad_id), decoder_input_ids=tgt_in).logits

    every = {
        "ours": (ours, our_loss),
        "torch": (peer, lambda batch: peer_loss(peer, batch, epsilon, pad_id)),
        "marian": (marian, lambda batch: peer_loss(marian_logits, batch, epsilon, pad_id)),
    }
    systems = {name: system for name, system in every.items() if name in names}
    for module, _ in systems.values():
        module.to(device).train()
    return systems


def peer_loss(forward, batch: dict, epsilon: float, pad_id: int) -> Tensor:
    """What a user of a peer writes: logits, then PyTorch's own label-smoothed cross-entropy
    in float32."""
    logits = forward(batch["src"], batch["tgt_in"])
    return F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)), batch["tgt_out"].reshape(-1),
        ignore_index=pad_id, label_smoothing=epsilon, reduction="sum",
    )  # fmt: skip


def training_step_fn(module: nn.Module, loss_fn, batch: dict, cfg: Config, device, dtype):
    """One optimizer step as the training module takes it (forward and loss inside autocast,
    as Lightning's bf16-mixed does; the softmax of every loss in float32)."""
    t = cfg.train
    optimizer = torch.optim.Adam(
        module.parameters(), lr=LEARNING_RATE, betas=tuple(t.adam_betas), eps=t.adam_eps
    )

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with common.autocast(device, dtype):
            loss = loss_fn(batch)
        (loss / batch["num_tgt_tokens"]).backward()
        optimizer.step()

    return step


# fairseq-train's precision flags on CUDA, by the name a result reports them under. Its
# `--bf16` is not among them: fairseq 0.12 turns it into `--tpu` (options.parse_args_and_arch).
FAIRSEQ_CUDA_PRECISIONS = {"fairseq_float32": [], "fairseq_fp16": ["--fp16"],
                           "fairseq_amp": ["--amp"]}  # fmt: skip


def fairseq_flags(cfg: Config, device: str = "cpu", precision: str = FAIRSEQ_FLOAT32) -> list[str]:
    """fairseq-train's flags for our model and step: the sizes and dropouts of `cfg.model`
    (`benchmarks.fairseq.train_peer.model_flags`), label smoothing and Adam of `cfg.train`; `--cpu`
    on a CPU, on CUDA the precision flags of `precision` (FAIRSEQ_CUDA_PRECISIONS)."""
    m, t = cfg.model, cfg.train
    sizes = SimpleNamespace(
        layers=m.encoder_layers, embed_dim=m.d_model, ffn_dim=m.d_ff, heads=m.heads,
        dropout=m.dropout, attention_dropout=m.attention_dropout,
        activation_dropout=m.activation_dropout,
    )  # fmt: skip
    pre_norm = ["--encoder-normalize-before", "--decoder-normalize-before"] if m.norm_first else []
    step = {
        "--criterion": "label_smoothed_cross_entropy", "--label-smoothing": t.label_smoothing,
        "--optimizer": "adam", "--adam-betas": str(tuple(t.adam_betas)), "--adam-eps": t.adam_eps,
        "--lr": LEARNING_RATE, "--seed": cfg.seed,
    }  # fmt: skip
    where = ["--cpu"] if device == "cpu" else FAIRSEQ_CUDA_PRECISIONS[precision]
    return [*train_peer.model_flags(sizes), *pre_norm, *train_peer.flag_list(step), *where]


def write_fairseq_handover(folder: Path, cfg: Config, batch: dict, tokens: dict[str, int],
                           vocab: int, device: str = "cpu",
                           precision: str = FAIRSEQ_FLOAT32) -> Path:  # fmt: skip
    """What fairseq's worker reads (`benchmarks.fairseq.step_speed`): this run's batch, our sizes
    and step as fairseq flags, our vocabulary and special ids, the device, threads and host
    settings."""
    spec = {
        "flags": fairseq_flags(cfg, device, precision),
        "device": device,
        "vocab_size": vocab,
        "special_ids": tokens,
        "threads": torch.get_num_threads(),
        "cpu_memory": {
            "mmap_threshold_mb": cfg.runtime.cpu_mmap_threshold_mb,
            "onednn_primitive_cache": cfg.runtime.onednn_primitive_cache,
        },
    }
    return write_handover(folder, batch, spec)


def fairseq_unavailable(venv: Path, device: torch.device, cuda: bool = False) -> str | None:
    """Why the fairseq system cannot run here, or None. `cuda`: the caller times fairseq on
    CUDA too (a venv built with `--device cuda --system-site-packages` over a CUDA torch)."""
    if device.type != "cpu" and not (cuda and device.type == "cuda"):
        return f"its venv has a CPU build of torch: fairseq is timed on a CPU, not {device}"
    if train_peer.built_venv(venv) is None:
        hint = BUILD_FAIRSEQ + ("" if venv == train_peer.DEFAULT_VENV else f" --venv {venv}")
        return f"no fairseq venv at {venv}; build it with `{hint}`"
    return None


def start_fairseq(venv: Path, spec_path: Path) -> FairseqStepWorker:
    """fairseq's worker in its venv, with train_peer's environment and our thread count."""
    harness = train_peer.build_parser().parse_args(
        ["--venv", str(venv), "--threads", str(torch.get_num_threads())]
    )
    return FairseqStepWorker(train_peer.venv_bin(harness, "python"), spec_path,
                             env=train_peer.tool_env(harness), cwd=train_peer.REPO_ROOT)  # fmt: skip


def skip(skipped: dict[str, str], name: str, reason: str) -> None:
    skipped[name] = reason
    print(f"note: {name} skipped: {reason}", file=sys.stderr)


def timed_name(system: str, dtype_name: str) -> str:
    """fairseq runs its float32 step in every round (no bf16 mode on a CPU): named so."""
    return FAIRSEQ_FLOAT32 if system == "fairseq" and dtype_name != "float32" else system


def main(argv: list[str] | None = None) -> dict:
    parser = common.base_parser(__doc__.splitlines()[0])
    common.add_model_args(parser)
    common.add_timing_args(parser, repeats=20, warmup=3)
    parser.add_argument("--target-tokens", type=int, default=3000)
    common.add_dtype_arg(parser)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS),
                        help="systems to time; ours always runs (the ratios are ours / system)")  # fmt: skip
    parser.add_argument("--fairseq-venv", type=Path, default=train_peer.DEFAULT_VENV,
                        help=f"fairseq's venv, built by `{BUILD_FAIRSEQ}`")  # fmt: skip
    parser.add_argument("--peak-size", type=int, default=None,
                        help="matmul size for the peak (default 2048 on CPU, 8192 on GPU)")  # fmt: skip
    args = parser.parse_args(argv)
    if "ours" not in args.systems:
        args.systems.insert(0, "ours")
    return run(args)


def special_ids(tokenizer) -> dict[str, int]:
    return {"pad_id": tokenizer.pad_id, "bos_id": tokenizer.bos_id,
            "eos_id": tokenizer.eos_id, "unk_id": tokenizer.unk_id}  # fmt: skip


def training_batch(cfg: Config, tokenizer, splits, target_tokens: int,
                   device: torch.device) -> dict:  # fmt: skip
    """The median batch of about `target_tokens` target tokens (`median_batch`) on `device`, as
    training collates it: src, tgt_in (bos + target), tgt_out (target + eos) and
    num_tgt_tokens (non-pad tgt_out)."""
    train = splits[cfg.data.train_split]
    rows = train.select(median_batch(train, target_tokens, cfg.seed))
    collate = Collate(tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id)
    batch = collate(list(zip(range(len(rows)), rows["src_ids"], rows["tgt_ids"])))
    del batch["ids"]  # positions in this batch, not example ids
    return {key: v.to(device) if torch.is_tensor(v) else v for key, v in batch.items()}


def batch_shape(batch: dict) -> dict[str, int]:
    """A training batch's sentences, padded lengths and target tokens, as results report them."""
    (sentences, src_len), tgt_len = batch["src"].shape, batch["tgt_in"].size(1)
    return {"sentences": sentences, "src_len": src_len, "tgt_len": tgt_len,
            "tgt_tokens": batch["num_tgt_tokens"]}  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    made_with = provenance()  # at the start: commits made while it runs are not its code
    cfg = common.bench_config(args)
    device = common.resolve_device(args, cfg)
    env = common.environment(device)
    with common.tokenized_corpus(cfg, args.tokenized) as (tokenizer, splits):
        batch = training_batch(cfg, tokenizer, splits, args.target_tokens, device)
    tokens = special_ids(tokenizer)
    pad = tokens["pad_id"]
    shape = batch_shape(batch)
    num_sentences, src_len, tgt_len = shape["sentences"], shape["src_len"], shape["tgt_len"]
    vocab = tokenizer.vocab_size
    flops = training_flops(cfg.model, vocab, num_sentences, src_len, tgt_len)
    padded = batch["src"].numel() + batch["tgt_out"].numel()
    real = int(batch["src"].ne(pad).sum()) + batch["num_tgt_tokens"]

    systems = build_systems(cfg, vocab, tokens, device, args.systems)
    parameters = {"ours": sum(p.numel() for p in systems["ours"][0].parameters())}
    skipped: dict[str, str] = {}
    peak_size = args.peak_size or (8192 if device.type == "cuda" else 2048)
    results = {}
    with contextlib.ExitStack() as stack:
        fairseq = None
        if "fairseq" in args.systems:
            if (reason := fairseq_unavailable(args.fairseq_venv, device)) is not None:
                skip(skipped, "fairseq", reason)
            else:
                handover = Path(stack.enter_context(tempfile.TemporaryDirectory(
                    prefix="fairseq-step-")))  # fmt: skip
                spec = write_fairseq_handover(handover, cfg, batch, tokens, vocab)
                fairseq = stack.enter_context(start_fairseq(args.fairseq_venv, spec))
                parameters["fairseq"] = fairseq.info["parameters"]
                if parameters["fairseq"] != parameters["ours"]:
                    skip(skipped, "fairseq", f"its model has {parameters['fairseq']:,} "
                         f"parameters, ours {parameters['ours']:,}: not the same sizes")  # fmt: skip
                    fairseq = None
        for dtype_name in common.chosen_dtypes(args, device, cfg):
            dtype = common.DTYPES[dtype_name]
            steps = {
                name: training_step_fn(module, loss_fn, batch, cfg, device, dtype)
                for name, (module, loss_fn) in systems.items()
            }
            if fairseq is not None:
                steps[timed_name("fairseq", dtype_name)] = fairseq
            seconds = common.time_interleaved(
                steps, repeats=args.repeats, warmup=args.warmup, device=device,
                progress=f"train {dtype_name}",
            )  # fmt: skip
            peak = common.matmul_peak_flops(
                device, dtype, peak_size, repeats=max(3, args.repeats // 4)
            )
            step_s = {name: statistics.median(times) for name, times in seconds.items()}
            tokens_per_s = {name: batch["num_tgt_tokens"] / s for name, s in step_s.items()}
            achieved = flops / step_s["ours"]
            ratio = {p: tokens_per_s["ours"] / tokens_per_s[p] for p in step_s if p != "ours"}
            results[dtype_name] = {
                "step_ms": {name: 1000 * s for name, s in step_s.items()},
                "tgt_tokens_per_s": tokens_per_s,
                "ratio": ratio,
                "model_flops_per_step": flops,
                "achieved_flops_per_s": achieved,
                "matmul_peak_flops_per_s": peak,
                "fraction_of_matmul_peak": achieved / peak,
            }

    header = ["dtype", "system", "step ms", "tgt tok/s", "ours / system", "GFLOP/s", "of peak"]
    table = []
    for dtype_name, r in results.items():
        for name, step_ms in r["step_ms"].items():
            achieved = r["model_flops_per_step"] / (step_ms / 1000)
            of_peak = f"{achieved / r['matmul_peak_flops_per_s']:.1%}"
            if name == FAIRSEQ_FLOAT32:  # a float32 step against the bf16 peak says nothing
                of_peak = "-"
            table.append([
                dtype_name, name, step_ms, r["tgt_tokens_per_s"][name],
                r["ratio"].get(name, 1.0), achieved / 1e9, of_peak,
            ])  # fmt: skip
    print(
        f"batch: {num_sentences} sentences, src {num_sentences}x{src_len}, tgt {num_sentences}x"
        f"{tgt_len}, {batch['num_tgt_tokens']} target tokens, padding {1 - real / padded:.1%}; "
        f"vocab {vocab}; {flops / 1e9:.1f} GFLOP per step; {env}"
    )
    print("parameters: " + ", ".join(f"{name} {n:,}" for name, n in parameters.items()))
    if fairseq is not None:
        print(f"fairseq {fairseq.info['fairseq']} (torch {fairseq.info['torch']}, "
              f"{fairseq.info['threads']} thread(s)): {NO_CPU_BF16}")  # fmt: skip
    print(f"matmul peak ({peak_size}^3): " + ", ".join(
        f"{d} {r['matmul_peak_flops_per_s'] / 1e9:,.0f} GFLOP/s" for d, r in results.items()))  # fmt: skip
    common.print_table(header, table)
    payload = {
        "benchmark": "train_throughput",
        "model": common.model_summary(cfg.model, vocab),
        "batch": {**shape, "padding_fraction": 1 - real / padded},
        "repeats": args.repeats,
        "parameters": parameters,
        "results": results,
        "skipped": skipped,
        "provenance": made_with,
        "env": env,
    }
    common.print_json(payload)
    return payload


if __name__ == "__main__":
    main()
