"""Sections 3.1 and 3.3: the encoder and decoder layers and the position-wise feed-forward network.

3.1: "We employ a residual connection around each of the two sub-layers, followed by layer
normalization. That is, the output of each sub-layer is LayerNorm(x + Sublayer(x))", and 5.4:
"We apply dropout to the output of each sub-layer, before it is added to the sub-layer input".
So a sublayer is wrapped as   post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
                              pre-norm (norm_first):  x = x + Dropout(Sublayer(LayerNorm(x)))
(pre-norm stacks then end with one more LayerNorm, see transformer.py). Dropout is inverted
dropout, y = x * m / (1 - p) with m ~ Bernoulli(1 - p), identity in eval mode: `nn.Dropout`.

Encoder layer: self-attention, FFN.  Decoder layer: masked self-attention, encoder-decoder
attention over the encoder output ("memory"), FFN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor, nn

from pipeline.config_schema import ModelConfig
from pipeline.model.attention import KeyValueCache, MultiHeadAttention


class PositionwiseFeedForward(nn.Module):
    """3.3: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, d_model -> d_ff -> d_model, applied per position."""

    def __init__(self, d_model: int, d_ff: int, activation_dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)  # W_1, b_1
        self.linear2 = nn.Linear(d_ff, d_model)  # W_2, b_2
        self.activation_dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, T, d_model) -> (B, T, d_model)
        return self.linear2(self.activation_dropout(F.relu(self.linear1(x))))


class ResidualNorm(nn.Module):
    """3.1 + 5.4: the residual connection and LayerNorm around one sublayer.

    `sublayer_input(x)` is what the sublayer reads (LayerNorm(x) when pre-norm, else x);
    `forward(x, y)` adds the sublayer's output y back: LayerNorm(x + Dropout(y)) when post-norm,
    x + Dropout(y) when pre-norm.
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def sublayer_input(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.norm_first else x

    def forward(self, x: Tensor, sublayer_output: Tensor) -> Tensor:
        x = x + self.dropout(sublayer_output)
        return x if self.norm_first else self.norm(x)


class EncoderLayer(nn.Module):
    """3.1 encoder layer: multi-head self-attention, then the position-wise FFN."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, **_attention(cfg))
        self.self_attn_residual = _residual(cfg)
        self.ffn = _feed_forward(cfg)
        self.ffn_residual = _residual(cfg)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """x (B, S, d_model); src_mask (B, 1, 1, S) True = real token -> (B, S, d_model)."""
        y, _ = self.self_attn(self.self_attn_residual.sublayer_input(x), attn_mask=src_mask)
        x = self.self_attn_residual(x, y)
        y = self.ffn(self.ffn_residual.sublayer_input(x))
        return self.ffn_residual(x, y)


def _attention(cfg: ModelConfig) -> dict:
    return dict(head_dim=cfg.head_dim, dropout=cfg.attention_dropout, fused=cfg.fused_attention)


def _residual(cfg: ModelConfig) -> ResidualNorm:
    return ResidualNorm(cfg.d_model, cfg.dropout, cfg.norm_first)


def _feed_forward(cfg: ModelConfig) -> PositionwiseFeedForward:
    return PositionwiseFeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)


@dataclass
class DecoderLayerCache:
    """One decoder layer's incremental state: its self-attention keys/values so far, and the
    encoder-decoder attention keys/values (the projected encoder output, computed once)."""

    self_attn: KeyValueCache = field(default_factory=KeyValueCache)
    cross_attn: KeyValueCache = field(default_factory=KeyValueCache)


class DecoderLayer(nn.Module):
    """3.1 decoder layer: masked self-attention, encoder-decoder attention, position-wise FFN."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        attention = _attention(cfg)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, **attention)
        self.self_attn_residual = _residual(cfg)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, **attention)
        self.cross_attn_residual = _residual(cfg)
        self.ffn = _feed_forward(cfg)
        self.ffn_residual = _residual(cfg)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        memory_mask: Tensor,
        cache: DecoderLayerCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x (B, T, d_model) new target positions; memory (B, S, d_model) encoder output;
        memory_mask (B, 1, 1, S) True = real source token.
        -> (B, T, d_model), and the encoder-decoder attention weights (B, h, T, S) if asked.

        Target padding needs no mask here: it sits after the last real token, so the causal
        mask already hides it from every real position (pad positions are not scored).
        """
        self_cache = cache.self_attn if cache is not None else None
        cross_cache = cache.cross_attn if cache is not None else None

        y, _ = self.self_attn(
            self.self_attn_residual.sublayer_input(x), causal=True, cache=self_cache
        )
        x = self.self_attn_residual(x, y)
        y, weights = self.cross_attn(
            self.cross_attn_residual.sublayer_input(x),
            memory,
            attn_mask=memory_mask,
            cache=cross_cache,
            need_weights=need_weights,
        )
        x = self.cross_attn_residual(x, y)
        y = self.ffn(self.ffn_residual.sublayer_input(x))
        return self.ffn_residual(x, y), weights
