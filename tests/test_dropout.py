"""Section 5.4's dropout: torch.nn.Dropout's semantics (inverted scaling, identity in eval,
gradient through the kept units only), reproducible from the RNG state, on the paper's path
(`torch.nn.Dropout`) and on the CPU speed path (`pipeline.kernels.cpu_dropout`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pipeline.kernels import PAPER, SpeedPaths, install_speed_paths
from pipeline.kernels.cpu_dropout import MASK_BITS, CpuDropout, keep_mask
from pipeline.rounding import FP32_EPS


def dropout_module(p: float, speed_paths: SpeedPaths = PAPER) -> nn.Module:
    """The model's dropout (`nn.Dropout`) with `speed_paths` installed, as in a Transformer."""
    return install_speed_paths(nn.Sequential(nn.Dropout(p)), speed_paths)[0]


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_drops_a_fraction_p_and_scales_the_rest_by_one_over_keep(p, speed_paths):
    torch.manual_seed(0)
    x = torch.rand(200, 50, 64) + 0.5  # no zeros of its own
    y = dropout_module(p, speed_paths).train()(x)
    dropped = y.eq(0)
    # A binomial fraction of n draws: five standard errors sqrt(p (1 - p) / n), plus the CPU
    # mask's quantisation of p to MASK_BITS bits.
    spread = 5 * (p * (1 - p) / x.numel()) ** 0.5 + 2**-MASK_BITS
    assert dropped.float().mean().item() == pytest.approx(p, abs=spread)
    # x / (1 - p) or x * (1 / (1 - p)): at most two roundings apart.
    torch.testing.assert_close(y[~dropped], x[~dropped] / (1 - p), atol=0, rtol=2 * FP32_EPS)


def test_eval_mode_and_p_zero_are_the_identity(speed_paths):
    x = torch.randn(4, 5, 6)
    assert dropout_module(0.3, speed_paths).eval()(x) is x
    assert dropout_module(0.0, speed_paths).train()(x) is x


def test_gradient_flows_through_kept_units_only_and_bf16_stays_bf16(speed_paths):
    torch.manual_seed(1)
    x = torch.randn(30, 40, dtype=torch.bfloat16, requires_grad=True)
    y = dropout_module(0.25, speed_paths).train()(x)
    assert y.dtype == torch.bfloat16
    y.sum().backward()
    expected = torch.where(y.ne(0), torch.tensor(1 / 0.75), torch.tensor(0.0)).bfloat16()
    torch.testing.assert_close(x.grad, expected)


def test_same_rng_state_same_mask(speed_paths):
    x = torch.ones(64, 64)
    state = torch.get_rng_state()
    first = dropout_module(0.3, speed_paths).train()(x)
    torch.set_rng_state(state)
    torch.testing.assert_close(dropout_module(0.3, speed_paths).train()(x), first)


def test_paper_path_is_torch_dropout_with_p_as_given():
    """Without the CPU path (a GPU run, or `runtime.cpu_speed_paths: false`) dropout is
    `torch.nn.Dropout` itself, p not rounded, drawing the values torch's kernel draws."""
    for chosen in (dropout_module(0.3), dropout_module(0.3, PAPER)):
        assert type(chosen) is nn.Dropout and chosen.p == 0.3
    x = torch.ones(50, 60)
    torch.manual_seed(4)
    ours = dropout_module(0.3).train()(x)
    torch.manual_seed(4)
    torch.testing.assert_close(ours, torch.nn.functional.dropout(x, 0.3, training=True))


def test_cpu_path_only_where_switched_on():
    assert type(dropout_module(0.3, SpeedPaths(cpu_dropout=True))) is CpuDropout
    assert type(dropout_module(0.3, SpeedPaths(cpu_attention=True))) is nn.Dropout


def test_cpu_dropout_leaves_other_devices_to_torch():
    """The CPU mask is drawn on the CPU; a tensor elsewhere takes torch's dropout (on the meta
    device: shapes only, so a CPU mask there would fail to combine)."""
    x = torch.empty(8, 16, device="meta")
    assert CpuDropout(0.3).train()(x).device.type == "meta"


def test_cpu_dropout_rejects_p_outside_zero_one():
    with pytest.raises(ValueError, match="p=1.0"):
        CpuDropout(1.0)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_mask_keeps_one_minus_p_at_every_slice_of_the_random_words(p):
    """The CPU mask reads four 16-bit slices of each random 64-bit word, the top one without its
    sign bit: entries at each of the four positions mod 4 are kept at the same rate 1 - p
    (within 5 standard errors), neighbours independently, for a size that is not a multiple
    of 4."""
    torch.manual_seed(2)
    count = 4 * 250_000 + 3
    keep = keep_mask(torch.Size([count]), p)
    assert keep.shape == (count,) and keep.dtype == torch.bool
    rate = 1 - round(p * 2**MASK_BITS) / 2**MASK_BITS  # p rounded to a multiple of 2^-15
    assert rate == pytest.approx(1 - p, abs=2**-MASK_BITS)
    per_position = keep[: count - 3].view(-1, 4).double()
    stderr = (rate * (1 - rate) / per_position.size(0)) ** 0.5
    for position in range(4):
        assert per_position[:, position].mean().item() == pytest.approx(rate, abs=5 * stderr)
    both = (per_position[:, 0] * per_position[:, 3]).mean().item()  # P(keep, keep) = rate^2
    assert both == pytest.approx(rate**2, abs=5 * stderr)


def test_cpu_mask_at_the_ends_of_p():
    """p below 2^-16 rounds to keeping everything; p just below 1 still keeps a few entries
    (the int16 threshold would otherwise overflow)."""
    torch.manual_seed(3)
    assert keep_mask(torch.Size([1000, 64]), 1e-6).all()
    kept = keep_mask(torch.Size([4, 2**20]), 1 - 1e-7).sum().item()
    assert 0 < kept < 1000  # 2^22 entries at 2^-15: 128 expected
    assert keep_mask(torch.Size([0, 3]), 0.3).shape == (0, 3)
