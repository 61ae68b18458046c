"""Section 3.5: positional encodings against the paper's formula, computed independently."""

from __future__ import annotations

import math

import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.model.positional import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
    build_positional,
)
from pipeline.rounding import FP32_EPS
from tests.conftest import sample_std_tolerance


def paper_pe(pos: int, dim: int, d_model: int) -> float:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))."""
    two_i = dim - dim % 2
    angle = pos / 10000 ** (two_i / d_model)
    return math.sin(angle) if dim % 2 == 0 else math.cos(angle)


@pytest.mark.parametrize("d_model", [16, 512, 7])
def test_sinusoids_match_the_paper_formula(d_model):
    pe = SinusoidalPositionalEncoding(d_model, max_positions=300)
    table = pe(300)
    for pos in [0, 1, 2, 17, 101, 299]:
        for dim in range(d_model):
            # Computed in float64 (as paper_pe is) and rounded once to float32: eps / 2 at most.
            expected = paper_pe(pos, dim, d_model)
            assert table[pos, dim].item() == pytest.approx(expected, abs=FP32_EPS)


def test_offset_selects_later_positions():
    pe = SinusoidalPositionalEncoding(32, max_positions=64)
    torch.testing.assert_close(pe(3, offset=10), pe(13)[10:13])
    assert pe(1, offset=63).shape == (1, 32)


def test_sinusoid_table_is_a_non_persistent_buffer():
    pe = SinusoidalPositionalEncoding(8, max_positions=16)
    assert "table" not in pe.state_dict()
    assert not list(pe.parameters())


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_positions_beyond_max_positions_raise_config_error(kind):
    pe = build_positional(kind, 8, max_positions=10)
    pe(10)  # positions 0..9 are fine
    with pytest.raises(ConfigError, match="model.max_positions"):
        pe(11)
    with pytest.raises(ConfigError, match="model.max_positions"):
        pe(1, offset=10)


def test_learned_positions_are_trainable_rows():
    torch.manual_seed(0)
    pe = LearnedPositionalEmbedding(8, max_positions=10)
    rows = pe(4, offset=2)
    torch.testing.assert_close(rows, pe.table.weight[2:6])
    rows.sum().backward()
    grad = pe.table.weight.grad
    assert torch.all(grad[2:6] == 1) and torch.all(grad[:2] == 0) and torch.all(grad[6:] == 0)
    spread = sample_std_tolerance(pe.table.weight.numel())  # five standard errors of 80 draws
    assert pe.table.weight.std().item() == pytest.approx(8**-0.5, rel=spread)


def test_unknown_kind_is_a_config_error():
    with pytest.raises(ConfigError, match="model.positional"):
        build_positional("rotary", 8, 10)
