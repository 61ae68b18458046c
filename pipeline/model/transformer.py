"""Section 3: the encoder-decoder Transformer, with 3.4's embeddings and softmax.

3.4: "we use learned embeddings to convert the input tokens and output tokens to vectors of
dimension d_model ... we share the same weight matrix between the two embedding layers and the
pre-softmax linear transformation ... In the embedding layers, we multiply those weights by
sqrt(d_model)."  3.5: positional encodings are added to the embeddings; 5.4: dropout on the sums.

    encode:  memory = Encoder(Dropout(sqrt(d_model) * E[src] + PE))                  (B, S, D)
    decode:  logits = Decoder(Dropout(sqrt(d_model) * E[tgt] + PE), memory) W_out^T    (B, T, V)

With `tie_embeddings` one (V, D) matrix is the source embedding, the target embedding and W_out
(a joint source/target vocabulary). Embeddings are initialised N(0, d_model^-0.5) (fairseq), so
the scaled embeddings have unit variance; every other matrix is Xavier-uniform, biases zero
(`model.init: xavier`). The paper does not say how it initialises; `model.init: fairseq` is
fairseq 0.12's Transformer, which differs only where it keeps PyTorch's `nn.Linear` default.
Padding masks come from `pad_id`; target padding needs none (see `DecoderLayer.forward`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from pipeline.config_schema import Config, ModelConfig
from pipeline.model.attention import MultiHeadAttention, padding_attention_mask
from pipeline.model.layers import (
    DecoderLayer,
    DecoderLayerCache,
    EncoderLayer,
    PositionwiseFeedForward,
)
from pipeline.model.positional import LearnedPositionalEmbedding, build_positional


@dataclass
class DecoderCache:
    """Incremental decoding state: the number of target positions already decoded, one
    `DecoderLayerCache` per decoder layer, and the encoder-decoder attention mask."""

    length: int = 0
    layers: list[DecoderLayerCache] = field(default_factory=list)
    memory_mask: Tensor | None = None  # (B_m, 1, 1, S)

    def reorder_beams(self, indices: Tensor) -> None:
        """Beam search: row i continues hypothesis indices[i]. Only the self-attention states
        move: the encoder-side keys/values belong to the sentence, which indices never leave."""
        for layer in self.layers:
            layer.self_attn.index_select(indices)

    def select_rows(self, rows: Tensor, memory_rows: Tensor | None = None) -> None:
        """Keep only target rows `rows` of the self-attention states and `memory_rows` of the
        encoder-side ones (drop finished sentences). `memory_rows` defaults to `rows`, for
        one target row per memory row; beam search keeps one memory row per sentence."""
        memory_rows = rows if memory_rows is None else memory_rows
        for layer in self.layers:
            layer.self_attn.index_select(rows)
            layer.cross_attn.index_select(memory_rows)
        if self.memory_mask is not None:
            self.memory_mask = self.memory_mask.index_select(0, memory_rows)


class Transformer(nn.Module):
    """The encoder-decoder of section 3 (Figure 1), configured by `ModelConfig`.

    Built as the paper reads on every device; a host's faster equivalents are switched on in
    the built model (`pipeline.kernels.install_speed_paths`).
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.pad_id = pad_id
        self.embed_scale = math.sqrt(cfg.d_model)
        self.src_embed = nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        self.tgt_embed = (
            self.src_embed
            if cfg.tie_embeddings
            else nn.Embedding(vocab_size, cfg.d_model, padding_idx=pad_id)
        )
        self.positional = build_positional(cfg.positional, cfg.d_model, cfg.max_positions)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.decoder_layers))
        # Pre-norm sublayers leave the residual stream un-normalised: normalise the stacks' outputs.
        self.encoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.output_projection = nn.Linear(cfg.d_model, vocab_size, bias=False)  # pre-softmax
        self.reset_parameters()
        if cfg.tie_embeddings:
            self.output_projection.weight = self.tgt_embed.weight  # 3.4: one shared matrix

    def reset_parameters(self) -> None:
        for name, param in self.named_parameters():
            if param.dim() > 1:
                nn.init.xavier_uniform_(param)
            elif name.endswith("bias"):
                nn.init.zeros_(param)
        std = self.cfg.d_model**-0.5
        for embedding in {self.src_embed, self.tgt_embed}:
            nn.init.normal_(embedding.weight, mean=0.0, std=std)
            nn.init.zeros_(embedding.weight[self.pad_id])
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=std)
        if isinstance(self.positional, LearnedPositionalEmbedding):
            self.positional.reset_parameters()
        if self.cfg.init == "fairseq":
            keep_linear_defaults_as_fairseq(self)

    def num_parameters(self) -> int:
        """Trainable parameters, a shared (tied) matrix counted once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    def embed(self, embedding: nn.Embedding, tokens: Tensor, offset: int = 0) -> Tensor:
        """3.4 + 3.5: Dropout(sqrt(d_model) * E[tokens] + PE[offset : offset + T]).
        tokens (B, T) -> (B, T, d_model)."""
        positions = self.positional(tokens.size(1), offset)  # (T, d_model)
        # PE + sqrt(d_model) * E[tokens] in one fused kernel (alpha scales the second operand).
        return self.dropout(torch.add(positions, embedding(tokens), alpha=self.embed_scale))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> memory (B, S, d_model), src_pad_mask (B, S) bool, True = pad."""
        src_pad_mask = src.eq(self.pad_id)
        src_mask = padding_attention_mask(src_pad_mask)  # built once, shared by all layers
        x = self.embed(self.src_embed, src)
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_pad_mask

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """`decoder_states` through the pre-softmax linear layer -> logits (B, T_new, vocab)."""
        return self.output_projection(self.decoder_states(tgt_in, memory, src_pad_mask, cache))

    def decoder_states(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_pad_mask: Tensor,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """tgt_in (B, T) target prefix, starting with bos; memory (B_m, S, d_model) and
        src_pad_mask (B_m, S) from `encode` -> the decoder stack's output (B, T_new, d_model).
        B_m = B, or B / k when each sentence's memory serves its k consecutive beam rows.

        Without a cache every position is decoded (T_new = T). With a `DecoderCache` only the
        positions not yet in it are (T_new = T - cache.length; one per step in greedy/beam
        search), and the cache is extended with them.
        """
        start = cache.length if cache is not None else 0
        x = self.embed(self.tgt_embed, tgt_in[:, start:], offset=start)  # (B, T_new, d_model)
        if cache is None:
            memory_mask = padding_attention_mask(src_pad_mask)
        else:
            if not cache.layers:
                cache.layers = [DecoderLayerCache() for _ in self.decoder_layers]
                cache.memory_mask = padding_attention_mask(src_pad_mask)
            memory_mask = cache.memory_mask
        for i, layer in enumerate(self.decoder_layers):
            layer_cache = cache.layers[i] if cache is not None else None
            x, _ = layer(x, memory, memory_mask, cache=layer_cache)
        if cache is not None:
            cache.length = tgt_in.size(1)
        return self.decoder_norm(x)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: src (B, S), tgt_in (B, T) -> logits (B, T, vocab)."""
        return self.output_projection(self.teacher_forced_states(src, tgt_in))

    def teacher_forced_states(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """`forward` short of the output layer: (B, T, d_model). Training applies the output
        layer fused with its loss (`pipeline.training.loss.output_layer_loss`)."""
        memory, src_pad_mask = self.encode(src)
        return self.decoder_states(tgt_in, memory, src_pad_mask)

    @torch.no_grad()
    def cross_attention_weights(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Encoder-decoder attention of every layer and head, for heatmaps (call in eval mode).
        src (1, S), tgt_in (1, T) -> (layers, heads, T, S); each row sums to 1 over real tokens."""
        memory, src_pad_mask = self.encode(src)
        memory_mask = padding_attention_mask(src_pad_mask)
        x = self.embed(self.tgt_embed, tgt_in)
        per_layer = []
        for layer in self.decoder_layers:
            x, weights = layer(x, memory, memory_mask, need_weights=True)
            per_layer.append(weights[0])  # (heads, T, S)
        return torch.stack(per_layer)


def build_transformer(cfg: Config, vocab_size: int) -> Transformer:
    """The Transformer a run's config describes: its model section and the tokenizer's padding
    id. Training builds it so, and so does loading a checkpoint; each then installs the run's
    `runtime.cpu_speed_paths` (`pipeline.kernels.install_speed_paths`)."""
    return Transformer(cfg.model, vocab_size, cfg.data.tokenizer.pad_id)


def keep_linear_defaults_as_fairseq(model: nn.Module) -> None:
    """Where fairseq 0.12's Transformer initialises otherwise than Xavier / zero biases: its
    position-wise FFN layers are plain `nn.Linear`s (TransformerEncoderLayerBase.build_fc1/2)
    and keep PyTorch's default, weights and biases U(+-1/sqrt(fan_in)); its attention's q, k, v
    projections are Xavier (gain 1/sqrt(2) each, the bound of ours on the stacked matrix) but
    their biases keep the default U(+-1/sqrt(d_model)). Embeddings, W^O and LayerNorm agree."""
    for module in model.modules():
        if isinstance(module, PositionwiseFeedForward):
            module.linear1.reset_parameters()
            module.linear2.reset_parameters()
        elif isinstance(module, MultiHeadAttention):
            bound = module.in_proj.in_features**-0.5
            nn.init.uniform_(module.in_proj.bias, -bound, bound)
