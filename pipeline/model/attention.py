"""Section 3.2: attention.

3.2.1 Scaled dot-product attention:  Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
3.2.2 Multi-head attention:          MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
                                     head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V),
                                     d_k = d_v = d_model / h in the base model; `head_dim`
                                     sets d_k apart from it, as Table 3's row (B) does.

Masks follow `torch.nn.functional.scaled_dot_product_attention`: a boolean `attn_mask`
broadcastable to (B, h, T_q, T_k) where True means "may attend". A query row whose keys are all
masked (an all-padding source) yields a zero output, never NaN, on both paths.

For incremental decoding (section 3.4's decoder, one position per step) each attention sublayer
keeps a `KeyValueCache`: self-attention appends the new step's keys/values; cross-attention
projects the encoder output once and reuses it at every step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def padding_attention_mask(key_padding_mask: Tensor) -> Tensor:
    """(B, T_k) bool, True = pad  ->  (B, 1, 1, T_k) bool, True = may attend (broadcast over h, T_q)."""
    return ~key_padding_mask[:, None, None, :]


def causal_attention_mask(query_len: int, key_len: int, device: torch.device) -> Tensor:
    """(T_q, T_k) bool, True = may attend: query i sits at position key_len - query_len + i and
    sees keys up to and including its own position (3.2.3: no leftward information flow)."""
    ones = torch.ones(query_len, key_len, dtype=torch.bool, device=device)
    return ones.tril(diagonal=key_len - query_len)


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    attn_mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    fused: bool = True,
    need_weights: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """3.2.1: softmax(Q K^T / sqrt(d_k)) V.

    q (B, h, T_q, d_k), k (B, h, T_k, d_k), v (B, h, T_k, d_v) -> output (B, h, T_q, d_v) and,
    when `need_weights`, the attention weights (B, h, T_q, T_k) (before dropout).
    `causal` applies the decoder's mask, aligned so that the last query is the last key (a query
    block appended after cached keys). `fused` uses torch's kernel; the explicit formula is the
    reference (and the only path that can return the weights).
    """
    query_len, key_len = q.size(-2), k.size(-2)
    if fused and not need_weights:
        if causal and query_len == key_len and attn_mask is None:
            # The kernel's own causal mask: no (T, T) mask tensor is built or read.
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=True
            ), None
        if causal and query_len > 1:
            attn_mask = _combine(attn_mask, causal_attention_mask(query_len, key_len, q.device))
        # A single query appended after the cache may see every key: no causal mask needed.
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p
        ), None

    if causal and query_len > 1:  # a single query appended after the cache sees every key
        attn_mask = _combine(attn_mask, causal_attention_mask(query_len, key_len, q.device))
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (B, h, T_q, T_k)
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(v.dtype)  # fp32 under bf16
    if attn_mask is not None:
        # Fully masked rows are softmax(-inf, ..., -inf) = NaN; like the fused kernel, give them 0.
        weights = weights.masked_fill(~attn_mask, 0.0)
    output = F.dropout(weights, p=dropout_p) @ v  # (B, h, T_q, d_v)
    return output, (weights if need_weights else None)


def _combine(attn_mask: Tensor | None, other: Tensor) -> Tensor:
    return other if attn_mask is None else attn_mask & other


CACHE_GROWTH = 8  # time steps a self-attention cache's buffers grow by when full


@dataclass
class KeyValueCache:
    """Keys and values of one attention sublayer kept between decoding steps, (B, h, t, d_k).

    Self-attention appends every step. Rather than a `torch.cat` of the whole history per step
    (one more full copy on top of beam search's reordering), `keys`/`values` are views of the
    first t steps of (B, h, capacity, d_k) buffers with spare steps: appending writes the new
    step only, and reordering gathers the buffers' rows in one pass.
    Cross-attention stores the projected memory in `keys`/`values` directly (no buffers).
    """

    keys: Tensor | None = None
    values: Tensor | None = None
    key_buffer: Tensor | None = field(default=None, repr=False)
    value_buffer: Tensor | None = field(default=None, repr=False)

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Self-attention: add this step's keys/values after the previous ones; return all."""
        self.key_buffer, self.keys = _append_steps(self.key_buffer, self.keys, keys)
        self.value_buffer, self.values = _append_steps(self.value_buffer, self.values, values)
        return self.keys, self.values

    def index_select(self, indices: Tensor) -> None:
        """Keep/reorder batch rows (beam search reordering, dropping finished sentences)."""
        if self.keys is None:
            return
        if self.key_buffer is None:  # cross-attention's projected memory
            self.keys = self.keys.index_select(0, indices)
            self.values = self.values.index_select(0, indices)
            return
        self.key_buffer, self.keys = _gather_rows(self.key_buffer, self.keys, indices)
        self.value_buffer, self.values = _gather_rows(self.value_buffer, self.values, indices)


def _append_steps(
    buffer: Tensor | None, filled: Tensor | None, new: Tensor
) -> tuple[Tensor, Tensor]:
    """Write `new` (B, h, n, d) after the `filled` (B, h, t, d) view of `buffer`, growing the
    buffer when it is full. Returns (buffer, view of its first t + n steps)."""
    length = 0 if filled is None else filled.size(2)
    end = length + new.size(2)
    if buffer is None or end > buffer.size(2):
        batch, heads, _, d_k = new.shape
        grown = new.new_empty(batch, heads, end + CACHE_GROWTH, d_k)
        if filled is not None:
            grown[:, :, :length] = filled
        buffer = grown
    buffer[:, :, length:end] = new
    return buffer, buffer[:, :, :end]


def _gather_rows(buffer: Tensor, filled: Tensor, indices: Tensor) -> tuple[Tensor, Tensor]:
    """Rows `indices` of the buffer, gathered whole: a gather between contiguous tensors
    copies each row in one block, several times faster than gathering the strided view of
    the filled steps, which more than pays for the few spare steps copied along."""
    gathered = buffer.index_select(0, indices)
    return gathered, gathered[:, :, : filled.size(2)]


class MultiHeadAttention(nn.Module):
    """3.2.2: h parallel heads of scaled dot-product attention on d_k-dimensional projections,
    d_k = d_v = `head_dim` (d_model / h unless given): W^Q, W^K, W^V map d_model to h d_k, W^O
    maps h d_k back to d_model.

    The projections W^Q, W^K, W^V of all heads are one (3 h d_k, d_model) matrix `in_proj`
    ([W^Q; W^K; W^V], the layout of `torch.nn.MultiheadAttention.in_proj_weight`): self-attention
    projects x once into Q, K, V; cross-attention (encoder-decoder attention, 3.2.3) projects the
    decoder state with the W^Q rows and the encoder output with the [W^K; W^V] rows.

    `attention` is 3.2.1's function; a host may set an equivalent that is faster there on an
    instance (`pipeline.kernels.install_speed_paths`), leaving the weights as they are.
    """

    attention = staticmethod(scaled_dot_product_attention)

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        head_dim: int | None = None,
        dropout: float = 0.0,
        fused: bool = True,
    ) -> None:
        super().__init__()
        if head_dim is None and (heads <= 0 or d_model <= 0 or d_model % heads != 0):
            raise ValueError(
                f"MultiHeadAttention: heads={heads} must be a positive divisor of "
                f"d_model={d_model} (d_k = d_model / heads), or give head_dim"
            )
        if head_dim is not None and (heads <= 0 or d_model <= 0 or head_dim <= 0):
            raise ValueError(
                f"MultiHeadAttention: heads={heads}, d_model={d_model} and "
                f"head_dim={head_dim} must be positive"
            )
        self.d_model = d_model
        self.heads = heads
        self.d_k = d_model // heads if head_dim is None else head_dim  # = d_v
        self.inner = heads * self.d_k  # h d_k: width of Q, K, V and of Concat(head_i)
        self.dropout = dropout
        self.fused = fused
        self.in_proj = nn.Linear(d_model, 3 * self.inner)  # [W^Q; W^K; W^V]
        self.out_proj = nn.Linear(self.inner, d_model)  # W^O
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Xavier over the stacked (3d, d) matrix, as torch.nn.MultiheadAttention does; its bound
        # sqrt(6 / 4d) equals fairseq's xavier(gain=1/sqrt(2)) on each separate projection.
        nn.init.xavier_uniform_(self.in_proj.weight)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.in_proj.bias)
        nn.init.zeros_(self.out_proj.bias)

    def _split_heads(self, x: Tensor, parts: int) -> tuple[Tensor, ...]:
        # (B, T, parts * h d_k) -> parts x (B, h, T, d_k), all views. Splitting the last dim
        # (rather than unbinding a stacked dim) keeps the backward to one concatenation.
        batch, length, _ = x.shape
        return tuple(
            part.view(batch, length, self.heads, self.d_k).transpose(1, 2)
            for part in x.split(self.inner, dim=-1)
        )

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None = None,
        *,
        attn_mask: Tensor | None = None,
        causal: bool = False,
        cache: KeyValueCache | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """query (B, T_q, d_model); memory (B_m, T_k, d_model) for cross-attention, None for
        self-attention. Returns (B, T_q, d_model) and, if `need_weights`, (B, h, T_q, T_k).
        B_m is B, or B / group when each memory row serves `group` consecutive query rows
        (the beams of one sentence); `attn_mask` then has B_m rows too.

        With a `cache`, self-attention appends this call's keys/values to the cached ones, and
        cross-attention projects `memory` on the first call only.
        """
        if memory is None:  # self-attention: Q, K, V all from the layer's input
            q, k, v = self._project_self(query, cache)
        else:  # encoder-decoder attention: Q from the decoder, K, V from the encoder output
            k, v = self._project_memory(memory, cache)
            q = self._project_queries(query, memory_rows=k.size(0))
        heads, weights = self.attention(
            q,
            k,
            v,
            attn_mask=attn_mask,
            causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            fused=self.fused,
            need_weights=need_weights,
        )  # head_i for every i: (B, h, T_q, d_k)
        concat = self._concat_heads(heads, query)  # Concat(head_1, ..., head_h): (B, T_q, h d_k)
        return self.out_proj(concat), self._weights_per_query_row(weights, query)

    def _project_self(
        self, x: Tensor, cache: KeyValueCache | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """x W^Q, x W^K, x W^V per head, in one projection; with a cache, K and V extended by
        this call's positions."""
        q, k, v = self._split_heads(self.in_proj(x), 3)
        if cache is not None:
            k, v = cache.append(k, v)
        return q, k, v

    def _project_memory(self, memory: Tensor, cache: KeyValueCache | None) -> tuple[Tensor, Tensor]:
        """memory W^K, memory W^V per head, (B_m, h, S, d_k): projected once per sentence when
        decoding with a cache, which then holds them for every later step."""
        if cache is not None and cache.keys is not None:
            return cache.keys, cache.values
        _, w_kv = self.in_proj.weight.split([self.inner, 2 * self.inner])
        _, b_kv = self.in_proj.bias.split([self.inner, 2 * self.inner])
        k, v = self._split_heads(F.linear(memory, w_kv, b_kv), 2)
        if cache is not None:
            # Copied once into (B_m, h, S, d_k) order: read at every step, and the attention
            # kernel reads contiguous heads ~2.5x faster than the strided view.
            k, v = k.contiguous(), v.contiguous()
            cache.keys, cache.values = k, v
        return k, v

    def _project_queries(self, query: Tensor, memory_rows: int) -> Tensor:
        """query W^Q per head, grouped by memory row: (B_m, h, group * T_q, d_k).

        Beam search: memory row b serves the `group` consecutive query rows of its sentence's
        beams. Their queries attend together, so the keys/values are read once per sentence
        rather than once per beam (group = 1 outside beam search).
        """
        batch, query_len, _ = query.shape
        group = _query_rows_per_memory_row(batch, memory_rows)
        w_q, _ = self.in_proj.weight.split([self.inner, 2 * self.inner])
        b_q, _ = self.in_proj.bias.split([self.inner, 2 * self.inner])
        q_rows = F.linear(query, w_q, b_q).view(memory_rows, group * query_len, self.inner)
        (q,) = self._split_heads(q_rows, 1)
        return q

    def _concat_heads(self, heads: Tensor, query: Tensor) -> Tensor:
        """(.., h, rows, d_k) -> (B, T_q, h d_k), undoing the grouping of `_project_queries`."""
        batch, query_len, _ = query.shape
        return heads.transpose(1, 2).reshape(batch, query_len, self.inner)

    @staticmethod
    def _weights_per_query_row(weights: Tensor | None, query: Tensor) -> Tensor | None:
        """Grouped attention weights (B_m, h, group * T_q, S) back to (B, h, T_q, S)."""
        batch, query_len, _ = query.shape
        if weights is None or weights.size(0) == batch:
            return weights
        return weights.unflatten(2, (-1, query_len)).transpose(1, 2).flatten(0, 1)


def _query_rows_per_memory_row(query_rows: int, memory_rows: int) -> int:
    if query_rows % memory_rows != 0:
        raise ValueError(
            f"cross-attention: {query_rows} query rows cannot share {memory_rows} memory rows "
            "(each memory row serves an equal, consecutive group of query rows)"
        )
    return query_rows // memory_rows
