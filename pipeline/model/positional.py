"""Section 3.5: positional encodings, added to the (scaled) token embeddings.

Sinusoidal:  PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
             PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))
Learned:     a trainable (max_positions, d_model) table (the paper's Table 3, row E).

Both return the rows for positions offset, ..., offset + length - 1; the offset lets incremental
decoding ask for the one new position at each step. Positions must stay below
`model.max_positions` (the sinusoid table is precomputed once to that size).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pipeline.errors import ConfigError

SINUSOID_BASE = 10000.0  # the paper's 10000 in pos / 10000^(2i / d_model)


def sinusoid_table(max_positions: int, d_model: int) -> Tensor:
    """(max_positions, d_model) float32 table of PE(pos, dim)."""
    position = torch.arange(max_positions, dtype=torch.float64)[:, None]  # (P, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d/2),)
    angle = position / SINUSOID_BASE ** (two_i / d_model)  # (P, ceil(d/2))
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])  # odd d_model: one fewer cosine column
    return table.float()


def _check_range(offset: int, length: int, max_positions: int) -> None:
    if offset + length > max_positions:
        raise ConfigError(
            f"position {offset + length - 1} is beyond config key 'model.max_positions'="
            f"{max_positions} (positions 0..{max_positions - 1}); raise model.max_positions or "
            "shorten the sequences (data.filter.max_words, eval.max_len_a/max_len_b)"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """3.5: fixed sinusoids, precomputed once (a buffer, not a parameter, not in the state_dict)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.register_buffer("table", sinusoid_table(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """-> (length, d_model): PE rows for positions offset .. offset + length - 1."""
        _check_range(offset, length, self.max_positions)
        return self.table[offset : offset + length]


class LearnedPositionalEmbedding(nn.Module):
    """3.5 / Table 3 (E): one trainable vector per position, initialised N(0, d_model^-0.5)."""

    def __init__(self, d_model: int, max_positions: int) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.table = nn.Embedding(max_positions, d_model)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table.weight, mean=0.0, std=self.table.embedding_dim**-0.5)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """-> (length, d_model): learned rows for positions offset .. offset + length - 1."""
        _check_range(offset, length, self.max_positions)
        return self.table.weight[offset : offset + length]


def build_positional(kind: str, d_model: int, max_positions: int) -> nn.Module:
    """`model.positional`: 'sinusoidal' | 'learned'."""
    if kind == "sinusoidal":
        return SinusoidalPositionalEncoding(d_model, max_positions)
    if kind == "learned":
        return LearnedPositionalEmbedding(d_model, max_positions)
    raise ConfigError(
        f"config key 'model.positional': must be 'sinusoidal' or 'learned', got {kind!r}"
    )
