"""Export a trained model for use outside the pipeline: CTranslate2 (a C++ inference engine).

    python -m pipeline.export --to ctranslate2 --checkpoint eval/model.ckpt \\
        --tokenizer data/tokenized/spm.model --out exported/ct2 [--quantization int8]

The checkpoint is the one the evaluate stage writes (`eval/model.ckpt`, the averaged weights)
or any training checkpoint. `--out` becomes a CTranslate2 model folder (`model.bin`,
`config.json`, `shared_vocabulary.json`, or source and target vocabularies when the embeddings
are not tied) plus the subword model (`spm.model`) and `export.json` (the checkpoint, the
weight type, `source_eos`, `max_positions`), so that the folder alone translates:

    translator = ctranslate2.Translator("exported/ct2")
    sp = sentencepiece.SentencePieceProcessor(model_file="exported/ct2/spm.model")
    result = translator.translate_batch([sp.encode("A dog runs.", out_type=str)], beam_size=5)
    print(sp.decode(result[0].hypotheses[0]))

A model trained on Moses-tokenized text (`data.tokenizer.pretokenizer: moses`) is exported with
its pre-tokenization: `spm.pretokenizer.json` beside `spm.model` (which `load_exported` and
`Tokenizer.load` read) and the same record as `pretokenizer` in export.json. Outside this
package, text then goes through sacremoses as `pipeline.data.moses` does before `sp.encode`
(`moses_tokenize(lines, src_lang, lowercase=...)`) and after `sp.decode`
(`moses_detokenize(lines, tgt_lang)`). A model on subword-nmt's BPE (`data.tokenizer.model_type:
subword_nmt`) carries its merges and vocabularies too (`spm.bpe-codes`, `spm.bpe-vocab.src`,
`spm.bpe-vocab.tgt`, `pipeline.data.subword_nmt`): outside this package text goes through
`subword-nmt apply-bpe -c spm.bpe-codes --vocabulary spm.bpe-vocab.src` after Moses, and the
`@@ ` joiners are removed after `sp.decode`.

Mapping onto `ctranslate2.specs.TransformerSpec`: layers and heads as configured; post-norm
(the paper) or pre-norm with the final encoder/decoder LayerNorm (`model.norm_first`); ReLU
feed-forward; embeddings scaled by sqrt(d_model); our position table, sinusoidal or learned,
copied as `position_encodings` (CTranslate2's own sinusoids are laid out differently); the fused
[W^Q; W^K; W^V] self-attention projection as it is, cross-attention's split into W^Q and
[W^K; W^V]; tied embeddings stay one matrix (CTranslate2 stores equal weights once); our
LayerNorm epsilon; the vocabulary is the sentencepiece pieces in id order, so ids map 1:1; bos
starts the decoder and `data.tokenizer.source_eos` (read from the checkpoint) becomes
`add_source_eos`. What the spec cannot express (a weight with no counterpart, LayerNorms with
different epsilons, a vocabulary or special pieces that do not fit) is refused, naming the key
or file, before anything is written.

`translate_with_ctranslate2` decodes as `pipeline.model.decoding` does: greedy search for beam
1, else CTranslate2's beam search, which keeps the same candidates as ours (the best 2k, eos
among the best k finishes a hypothesis, a sentence ends with k finished), and our length limit
a * src_len + b per sentence (`max_decoding_length` is one number per call, so sentences are
grouped by their limit). Three of our rules are not CTranslate2 options, and are matched so:

- length penalty: CTranslate2 ranks by log P / |Y| ** alpha, we by GNMT's
  log P / ((5 + |Y|) / 6) ** alpha (|Y| counting eos in both). Its search does not depend on
  alpha (unless 0: it then stops at the first finished beam), so all k finished hypotheses are
  asked for and re-ranked by GNMT.
- the length limit: our beam search appends eos to the live beams there (scoring log P(eos));
  CTranslate2 ends them without. Those hypotheses are rescored with eos (`score_batch`).
- pad and bos: we never generate them, but our scores keep the softmax over the whole
  vocabulary. CTranslate2's `suppress_sequences` renormalises without them, which shifts every
  score, so they are not suppressed: never targets, a trained model gives them next to no
  probability (a translation that contains one is logged as a warning).
Left unmatched: which hypotheses CTranslate2 returns is decided by its own penalty (k of up to
2k - 1 finished), and the live beams that a finished one displaces at the limit are not
returned; both change the result only when CTranslate2's and GNMT's rankings disagree near the
top. Sources longer than `model.max_positions` tokens are cut there by both, but CTranslate2
keeps the source eos last (we cut it). `tests/test_export.py` checks that every hypothesis
either search returns gets the same score from both models, and that the translations are the
same or differ only in these ways or on a tie of the float32 arithmetic.
`nbest_with_ctranslate2` returns CTranslate2's k hypotheses so ranked, `score_with_ctranslate2`
the exported model's log-probs of given hypotheses.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pipeline.atomic import refuse_replacing
from pipeline.cli import main
from pipeline.data.tokenizer import MODEL_FILE, Tokenizer, pretokenizer_path
from pipeline.errors import ConfigError, DataError, not_a_file

log = logging.getLogger(__name__)

FORMATS = ("ctranslate2",)
DEFAULT_QUANTIZATION = "float32"
EXPORT_INFO = "export.json"  # in the output folder, beside CTranslate2's files
INSTALL_HINT = "install it with `pip install -e '.[export]'`"
# CTranslate2's length penalty for alpha = 0: its own 0 stops at the first finished beam;
# |Y| ** 1e-6 is 1 to within 1e-5, so it ranks by log P, as GNMT's formula with alpha = 0.
MIN_CT2_LENGTH_PENALTY = 1e-6


def _ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError(f"ctranslate2 is not installed; {INSTALL_HINT}") from None
    return ctranslate2


# --------------------------------------------------------------------------- the spec


class _Weights:
    """The model's state_dict as float32 arrays, remembering which keys were copied."""

    def __init__(self, model) -> None:
        self.tensors = model.state_dict()
        self.unused = set(self.tensors)

    def take(self, key: str) -> np.ndarray:
        if key not in self.tensors:
            raise ConfigError(
                f"the model has no weight '{key}', which CTranslate2's Transformer needs "
                "(every linear layer and LayerNorm there has a bias)"
            )
        self.unused.discard(key)
        return np.ascontiguousarray(self.tensors[key].detach().float().cpu().numpy())

    def linear(self, spec, prefix: str) -> None:
        spec.weight = self.take(f"{prefix}.weight")
        spec.bias = self.take(f"{prefix}.bias")

    def norm(self, spec, prefix: str) -> None:
        spec.gamma = self.take(f"{prefix}.weight")
        spec.beta = self.take(f"{prefix}.bias")

    def attention(self, spec, prefix: str, cross: bool = False) -> None:
        """Ours: one `in_proj` [W^Q; W^K; W^V]. CTranslate2: the same fused matrix for
        self-attention; W^Q and [W^K; W^V] as two linear layers for cross-attention."""
        weight, bias = self.take(f"{prefix}.in_proj.weight"), self.take(f"{prefix}.in_proj.bias")
        if cross:
            d_model = weight.shape[1]
            spec.linear[0].weight, spec.linear[0].bias = weight[:d_model], bias[:d_model]
            spec.linear[1].weight, spec.linear[1].bias = weight[d_model:], bias[d_model:]
        else:
            spec.linear[0].weight, spec.linear[0].bias = weight, bias
        self.linear(spec.linear[-1], f"{prefix}.out_proj")

    def ffn(self, spec, layer: str) -> None:
        self.linear(spec.linear_0, f"{layer}.ffn.linear1")
        self.linear(spec.linear_1, f"{layer}.ffn.linear2")
        self.norm(spec.layer_norm, f"{layer}.ffn_residual.norm")


def layer_norm_epsilon(model) -> float:
    """The epsilon of every LayerNorm (CTranslate2 has one for the whole model)."""
    from torch import nn

    epsilons = {name: m.eps for name, m in model.named_modules() if isinstance(m, nn.LayerNorm)}
    if len(set(epsilons.values())) != 1:
        raise ConfigError(
            f"LayerNorm epsilons differ ({epsilons}); CTranslate2 has one for the whole model"
        )
    return next(iter(epsilons.values()))


def check_tokenizer(tokenizer: Tokenizer, vocab_size: int, path: str | Path) -> None:
    if tokenizer.vocab_size != vocab_size:
        raise DataError(
            f"{path}: vocabulary of {tokenizer.vocab_size} pieces but the model has "
            f"{vocab_size}; pass the tokenizer the model was trained with"
        )
    for name in ("unk_id", "bos_id", "eos_id"):
        if getattr(tokenizer, name) < 0:
            raise DataError(
                f"{path}: no {name.removesuffix('_id')} piece (data.tokenizer.{name} < 0), "
                "which the exported model needs"
            )


def transformer_spec(model, tokenizer: Tokenizer):
    """Our Transformer as a `ctranslate2.specs.TransformerSpec` holding its weights, the
    vocabulary and the special tokens; ConfigError for what the spec cannot express."""
    from ctranslate2.specs import common_spec
    from ctranslate2.specs.transformer_spec import TransformerSpec

    from pipeline.model.positional import LearnedPositionalEmbedding

    cfg = model.cfg
    check_tokenizer(tokenizer, model.vocab_size, "the tokenizer")
    epsilon = layer_norm_epsilon(model)
    spec = TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.heads,
        pre_norm=cfg.norm_first,
        activation=common_spec.Activation.RELU,  # PositionwiseFeedForward: max(0, x W_1 + b_1)
    )
    weights = _Weights(model)
    if isinstance(model.positional, LearnedPositionalEmbedding):
        positions = weights.take("positional.table.weight")
    else:  # the sinusoids are a buffer, not a weight: rows for positions 0 .. max_positions - 1
        positions = model.positional(cfg.max_positions).float().cpu().numpy()

    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = weights.take("src_embed.weight")
    decoder.embeddings.weight = weights.take("tgt_embed.weight")
    decoder.projection.weight = weights.take("output_projection.weight")
    for stack in (encoder, decoder):
        stack.scale_embeddings = model.embed_scale  # sqrt(d_model), section 3.4
        stack.position_encodings.encodings = positions
    for i, layer in enumerate(encoder.layer):
        weights.attention(layer.self_attention, f"encoder_layers.{i}.self_attn")
        weights.norm(layer.self_attention.layer_norm, f"encoder_layers.{i}.self_attn_residual.norm")
        weights.ffn(layer.ffn, f"encoder_layers.{i}")
    for i, layer in enumerate(decoder.layer):
        weights.attention(layer.self_attention, f"decoder_layers.{i}.self_attn")
        weights.norm(layer.self_attention.layer_norm, f"decoder_layers.{i}.self_attn_residual.norm")
        weights.attention(layer.attention, f"decoder_layers.{i}.cross_attn", cross=True)
        weights.norm(layer.attention.layer_norm, f"decoder_layers.{i}.cross_attn_residual.norm")
        weights.ffn(layer.ffn, f"decoder_layers.{i}")
    if cfg.norm_first:  # a pre-norm stack ends with a LayerNorm
        weights.norm(encoder.layer_norm, "encoder_norm")
        weights.norm(decoder.layer_norm, "decoder_norm")
    if weights.unused:
        raise ConfigError(
            f"model weights {sorted(weights.unused)} have no counterpart in CTranslate2's "
            "Transformer; this model cannot be exported"
        )

    pieces = [tokenizer.piece(i) for i in range(tokenizer.vocab_size)]
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    config = spec.config
    config.layer_norm_epsilon = epsilon
    config.unk_token = tokenizer.piece(tokenizer.unk_id)
    config.bos_token = config.decoder_start_token = tokenizer.piece(tokenizer.bos_id)
    config.eos_token = tokenizer.piece(tokenizer.eos_id)
    config.add_source_eos = tokenizer.source_eos
    return spec


def export_ctranslate2(
    model,
    tokenizer: Tokenizer,
    out: str | Path,
    *,
    quantization: str = DEFAULT_QUANTIZATION,
    provenance: dict | None = None,
    keep: dict | None = None,
) -> Path:
    """Write `model` (eval mode) with `tokenizer` (its `source_eos` and pre-tokenization as the
    model was trained) as a CTranslate2 folder `out`, weights stored as `quantization`. `out`
    is replaced whole, atomically, unless it holds something in `keep` ({what: path}, see
    `pipeline.atomic.refuse_replacing`); `provenance` goes into export.json."""
    from pipeline.atomic import atomic_directory

    spec = transformer_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    info = {
        **(provenance or {}),
        "format": "ctranslate2",
        "quantization": quantization,
        "tokenizer": MODEL_FILE,
        "source_eos": tokenizer.source_eos,
        "pretokenizer": asdict(tokenizer.pretokenizer),  # what text goes through around spm
        "max_positions": model.cfg.max_positions,
    }
    with atomic_directory(out, keep) as staging:
        spec.save(str(staging))
        tokenizer.save(staging / MODEL_FILE)
        (staging / EXPORT_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return Path(out)


# --------------------------------------------------------------------------- decoding


@dataclass
class ExportedModel:
    """An export folder loaded for decoding."""

    translator: object  # ctranslate2.Translator
    tokenizer: Tokenizer  # with the model's source_eos and pre-tokenization
    max_positions: int  # the length rule's cap


def load_exported(
    model_dir: str | Path, *, device: str = "cpu", compute_type: str = "default", threads: int = 1
) -> ExportedModel:
    """`compute_type` "default" computes in the stored weight type (float32, int8, ...)."""
    info_path = Path(model_dir) / EXPORT_INFO
    if not info_path.is_file():
        raise DataError(f"{info_path} not found: export a model with `python -m pipeline.export`")
    info = json.loads(info_path.read_text(encoding="utf-8"))
    translator = _ctranslate2().Translator(
        str(model_dir), device=device, compute_type=compute_type, intra_threads=threads
    )
    spm_model = Path(model_dir) / info["tokenizer"]
    tokenizer = Tokenizer.load(spm_model, source_eos=info["source_eos"])
    recorded = info.get("pretokenizer")  # absent from folders exported before it was recorded
    if recorded is not None and recorded != asdict(tokenizer.pretokenizer):
        raise DataError(
            f"{pretokenizer_path(spm_model)}: the folder's subword model reads "
            f"{tokenizer.pretokenizer.describe()}, but {info_path} records {recorded}; export "
            "the model again"
        )
    return ExportedModel(translator, tokenizer, info["max_positions"])


def max_output_length(src_len: int, max_len_a: float, max_len_b: int, max_positions: int) -> int:
    """`pipeline.model.decoding.max_output_lengths` of one sentence (src_len with its eos)."""
    return min(max(int(np.floor(max_len_a * src_len + max_len_b)), 0), max_positions - 1)


def translate_with_ctranslate2(
    exported: ExportedModel,
    src_ids: Sequence[Sequence[int]],
    *,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: int,
    max_tokens: int = 0,
    length_normalization: str = "gnmt",
) -> list:
    """`src_ids` as `Tokenizer.encode_sources` returns them (what our `translate_ids` reads)
    -> one `pipeline.model.decoding.Hypothesis` per sentence: the tokens (no bos/eos) and
    length-normalised score our beam search (greedy search for beam 1) gives it, settings as in
    conf/eval (`length_penalty` is alpha of `length_normalization`). `max_tokens`: source
    tokens per CTranslate2 batch (0: each group of sentences with one length limit is one
    batch)."""
    from pipeline.model.decoding import Hypothesis

    nbest = nbest_with_ctranslate2(
        exported, src_ids, beam_size=beam_size, length_penalty=length_penalty,
        max_len_a=max_len_a, max_len_b=max_len_b, max_tokens=max_tokens,
        length_normalization=length_normalization,
    )  # fmt: skip
    results = [hypotheses[0] if hypotheses else Hypothesis([], 0.0) for hypotheses in nbest]
    tokenizer = exported.tokenizer
    never = {tokenizer.pad_id, tokenizer.bos_id}
    generated = sum(bool(never & set(h.tokens)) for h in results)
    if generated:
        log.warning(
            "%d translation(s) contain pad or bos, which our search never generates (an "
            "untrained model?): they differ from pipeline.model.decoding's",
            generated,
        )
    return results


def nbest_with_ctranslate2(
    exported: ExportedModel,
    src_ids: Sequence[Sequence[int]],
    *,
    beam_size: int,
    length_penalty: float,
    max_len_a: float,
    max_len_b: int,
    max_tokens: int = 0,
    length_normalization: str = "gnmt",
) -> list[list]:
    """`translate_with_ctranslate2`'s search, every hypothesis CTranslate2 returns: for each
    sentence its `beam_size` finished hypotheses (one for beam 1, none for an empty source or
    a limit of 0 tokens), rescored and ranked by our length normalisation, best first."""
    from pipeline.model.decoding import Hypothesis
    from pipeline.model.length_penalty import length_normalizer

    tokenizer, limit, translator = exported.tokenizer, exported.max_positions, exported.translator
    groups: dict[int, list[int]] = {}  # sentence indices by their length limit
    for i, ids in enumerate(src_ids):
        if ids:  # an empty source translates to nothing, as in translate_ids
            max_len = max_output_length(min(len(ids), limit), max_len_a, max_len_b, limit)
            groups.setdefault(max_len, []).append(i)
    ct2_penalty = length_penalty or MIN_CT2_LENGTH_PENALTY
    results: list[list] = [[] for _ in src_ids]
    for max_len, indices in groups.items():
        if max_len == 0:  # only eos is allowed: an empty translation (CTranslate2 needs >= 1)
            continue
        sources = [_source_pieces(src_ids[i], tokenizer) for i in indices]
        outputs = translator.translate_batch(
            sources,
            beam_size=beam_size,
            num_hypotheses=beam_size,
            length_penalty=ct2_penalty,
            max_decoding_length=max_len,
            min_decoding_length=0,
            max_input_length=limit,
            return_scores=True,
            return_end_token=True,
            max_batch_size=max_tokens,
            batch_type="tokens",
        )
        # Its k best finished hypotheses: (ids, ending in eos unless cut at the limit; log P).
        nbest = [
            [
                (_ids(pieces, tokenizer), score * len(pieces) ** ct2_penalty)
                for pieces, score in zip(output.hypotheses, output.scores)
            ]
            for output in outputs
        ]
        _rescore_at_limit(translator, tokenizer, sources, nbest, limit)
        for i, hypotheses in zip(indices, nbest):
            ranked = [
                Hypothesis(_strip_eos(ids, tokenizer),
                           log_prob / length_normalizer(_with_eos(ids, tokenizer), length_penalty,
                                                        length_normalization))
                for ids, log_prob in hypotheses
            ]  # fmt: skip
            results[i] = sorted(ranked, key=lambda h: h.score, reverse=True)
    return results


def score_with_ctranslate2(
    exported: ExportedModel, src_ids: Sequence[Sequence[int]], hypotheses: Sequence[Sequence[int]]
) -> list[list[float]]:
    """The exported model's log-probs of each hypothesis's tokens (no bos/eos) followed by eos,
    teacher-forced (`score_batch`), for sources as `translate_with_ctranslate2` reads them:
    `pipeline.evaluation.evaluate.hypothesis_log_probs`' entries, computed by CTranslate2."""
    tokenizer = exported.tokenizer
    sources = [_source_pieces(ids, tokenizer) for ids in src_ids]
    return _log_probs(exported.translator, tokenizer, sources, hypotheses, exported.max_positions)


def _log_probs(translator, tokenizer: Tokenizer, sources, hypotheses, limit: int) -> list:
    """Per-token log-probs of `hypotheses` (ids without eos; score_batch adds it)."""
    scored = translator.score_batch(
        sources, [[tokenizer.piece(t) for t in ids] for ids in hypotheses], max_input_length=limit
    )
    return [list(result.log_probs) for result in scored]


def _rescore_at_limit(translator, tokenizer: Tokenizer, sources, nbest, limit: int) -> None:
    """Hypotheses cut at the length limit get eos appended and log P(... eos), in place: our
    beam search ends them so."""
    eos = tokenizer.eos_id
    cut = [(s, h) for s, hyps in enumerate(nbest) for h, (ids, _) in enumerate(hyps)
           if not ids or ids[-1] != eos]  # fmt: skip
    if not cut:
        return
    scored = _log_probs(translator, tokenizer, [sources[s] for s, _ in cut],
                        [nbest[s][h][0] for s, h in cut], limit)  # fmt: skip
    for (s, h), log_probs in zip(cut, scored):
        nbest[s][h] = ([*nbest[s][h][0], eos], float(sum(log_probs)))


def _source_pieces(ids: Sequence[int], tokenizer: Tokenizer) -> list[str]:
    ids = list(ids)
    if tokenizer.source_eos and ids and ids[-1] == tokenizer.eos_id:
        ids = ids[:-1]  # CTranslate2 adds it (config add_source_eos)
    return [tokenizer.piece(t) for t in ids]


def _ids(pieces: Sequence[str], tokenizer: Tokenizer) -> list[int]:
    return [tokenizer.processor.piece_to_id(piece) for piece in pieces]


def _with_eos(ids: list[int], tokenizer: Tokenizer) -> int:
    """|Y| of the length penalty: the tokens and eos."""
    return len(ids) + (not ids or ids[-1] != tokenizer.eos_id)


def _strip_eos(ids: list[int], tokenizer: Tokenizer) -> list[int]:
    return ids[:-1] if ids and ids[-1] == tokenizer.eos_id else ids


# --------------------------------------------------------------------------- the command


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.export", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--to", choices=FORMATS, default=FORMATS[0], help="export format")
    parser.add_argument(
        "--checkpoint",
        type=Path,
        required=True,
        help="model checkpoint, e.g. eval/model.ckpt (the averaged model)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        required=True,
        help=f"the sentencepiece model it was trained with (data/tokenized/{MODEL_FILE})",
    )
    parser.add_argument("--out", type=Path, required=True, help="output folder")
    parser.add_argument(
        "--quantization",
        default=DEFAULT_QUANTIZATION,
        help="stored weight type: float32, int8, float16, bfloat16, int16, "
        "int8_float32, int8_float16, int8_bfloat16 (default: float32)",
    )
    parser.add_argument("--force", action="store_true", help="replace an existing --out folder")
    parser.add_argument(
        "--params",
        type=Path,
        default=Path("params.yaml"),
        help="the workspace's params, whose stage outputs --out must not hold",
    )
    return parser.parse_args(argv)  # fmt: skip


def check_arguments(args: argparse.Namespace) -> None:
    """Every file and value of the command line, before any model is loaded."""
    if problem := not_a_file(args.checkpoint):
        raise DataError(
            f"checkpoint {args.checkpoint} {problem}: `dvc repro evaluate` writes the averaged "
            "model eval/model.ckpt; or pass a training checkpoint (models/train/checkpoints/)"
        )
    if not args.tokenizer.is_file():
        raise DataError(
            f"tokenizer {args.tokenizer} not found: `dvc repro tokenize` writes "
            f"data/tokenized/{MODEL_FILE}"
        )
    if args.out.exists() and (not args.out.is_dir() or any(args.out.iterdir())) and not args.force:
        raise DataError(f"--out {args.out} exists and is not an empty folder; --force replaces it")
    refuse_replacing(args.out, out_keeps(args), name="--out")
    ctranslate2 = _ctranslate2()
    from ctranslate2.specs.model_spec import ACCEPTED_MODEL_TYPES

    if args.quantization not in ACCEPTED_MODEL_TYPES:
        raise ConfigError(
            f"--quantization {args.quantization}: CTranslate2 {ctranslate2.__version__} "
            f"stores {', '.join(ACCEPTED_MODEL_TYPES)}"
        )


def out_keeps(args: argparse.Namespace) -> dict:
    """What `--out` must not hold (it is replaced whole): the command's inputs and every stage
    output of the workspace's params.yaml."""
    from pipeline.config import load_paths

    inputs = {"--checkpoint": args.checkpoint, "--tokenizer": args.tokenizer}
    return {**inputs, **load_paths(args.params).outputs()}


def load_checkpoint(path: str | Path):
    """(the Transformer in eval mode on the CPU, the Config it was trained with)."""
    from pipeline.config import from_dict
    from pipeline.evaluation.evaluate import load_model
    from pipeline.training.checkpoints import read_checkpoint

    model = load_model(path)  # DataError naming the file if it is no model checkpoint
    return model, from_dict(read_checkpoint(path)["hyper_parameters"]["config"])


def export(argv: list[str] | None = None) -> Path:
    args = parse_args(argv)
    check_arguments(args)
    from pipeline.evaluation.evaluate import load_tokenizer

    model, cfg = load_checkpoint(args.checkpoint)
    tokenizer = load_tokenizer(args.tokenizer, model, cfg.data)
    check_tokenizer(tokenizer, model.vocab_size, args.tokenizer)
    out = export_ctranslate2(
        model, tokenizer, args.out, quantization=args.quantization,
        provenance={"checkpoint": str(args.checkpoint)}, keep=out_keeps(args),
    )  # fmt: skip
    print(f"wrote {out}: CTranslate2 model, {args.quantization} weights", file=sys.stderr)
    return out


def console() -> None:
    """The `transformer-export` command (pyproject.toml)."""
    main(lambda: export(sys.argv[1:]))


if __name__ == "__main__":
    console()
