"""Our Transformer as a CTranslate2 model: its `TransformerSpec`, holding the weights, the
vocabulary and the special tokens, written as a model folder with the subword model and
`export.json`.

Mapping onto `ctranslate2.specs.TransformerSpec`: layers, heads and d_k (`model.head_dim`, as
CTranslate2's `head_dim` where it is not d_model / heads) as configured; post-norm
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
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from pipeline.data.tokenizer import MODEL_FILE, Tokenizer
from pipeline.errors import ConfigError, DataError

DEFAULT_QUANTIZATION = "float32"
EXPORT_INFO = "export.json"  # in the output folder, beside CTranslate2's files
INSTALL_HINT = "install it with `pip install -e '.[export]'`"


def ctranslate2_module():
    try:
        import ctranslate2
    except ImportError:
        raise ConfigError(f"ctranslate2 is not installed; {INSTALL_HINT}") from None
    return ctranslate2


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
        """Ours: one `in_proj` [W^Q; W^K; W^V], each h d_k rows. CTranslate2: the same fused
        matrix for self-attention; W^Q and [W^K; W^V] as two linear layers for cross-attention."""
        weight, bias = self.take(f"{prefix}.in_proj.weight"), self.take(f"{prefix}.in_proj.bias")
        if cross:
            inner = weight.shape[0] // 3  # h d_k
            spec.linear[0].weight, spec.linear[0].bias = weight[:inner], bias[:inner]
            spec.linear[1].weight, spec.linear[1].bias = weight[inner:], bias[inner:]
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
    from ctranslate2.specs.transformer_spec import (
        TransformerDecoderSpec,
        TransformerEncoderSpec,
        TransformerSpec,
    )

    from pipeline.model.positional import LearnedPositionalEmbedding

    cfg = model.cfg
    check_tokenizer(tokenizer, model.vocab_size, "the tokenizer")
    epsilon = layer_norm_epsilon(model)
    options = dict(
        pre_norm=cfg.norm_first,
        activation=common_spec.Activation.RELU,  # PositionwiseFeedForward: max(0, x W_1 + b_1)
        head_dim=cfg.head_dim,  # None: CTranslate2's own d_model / heads, as ours
    )
    spec = TransformerSpec(
        TransformerEncoderSpec(cfg.encoder_layers, cfg.heads, **options),
        TransformerDecoderSpec(cfg.decoder_layers, cfg.heads, **options),
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
